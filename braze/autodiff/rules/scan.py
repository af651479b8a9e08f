"""VJP and JVP rules of `Scan`. Reverse mode is a scan in the opposite direction over the body's
VJP (braze/autodiff/scan.py); forward mode goes through the unrolled decomposition."""
from __future__ import annotations

from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.ops.scan import Scan
from ..emit import is_float
from ..registry import jvp_rule, vjp_rule
from ..scan import scan_backward
from ._composite import jvp_through_decomposition


@vjp_rule(Scan)
def _scan_vjp(b: Graph, node: Node, ins, outs, cts):
    grads = scan_backward(b, node, ins, cts)
    return [g if is_float(b.shape_of(v)) else None for g, v in zip(grads, ins)]


jvp_rule(Scan)(jvp_through_decomposition)
