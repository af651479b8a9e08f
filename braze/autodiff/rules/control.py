"""VJP and JVP rules of `If`. Reverse mode is an `if` on the same predicate over the branches'
VJPs, so only the taken branch is differentiated (braze/autodiff/control.py says why); forward
mode goes through the decomposition, whose `where` picks the taken branch's tangents."""
from __future__ import annotations

from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.ops.control import If
from ..emit import is_float, zeros
from ..registry import jvp_rule, vjp_rule
from ..scan import body_vjp_graph
from ._composite import jvp_through_decomposition


@vjp_rule(If)
def _if_vjp(b: Graph, node: Node, ins, outs, cts):
    op: If = node.op
    operands = list(ins[1:])
    if not any(is_float(b.shape_of(v)) for v in operands):
        return [None] * len(ins)
    filled = [c if c is not None else zeros(b, t) for c, t in zip(cts, node.outputs)]
    got = b.cond(ins[0], body_vjp_graph(op.then_graph), body_vjp_graph(op.else_graph),
                 *operands, *filled)
    got = list(got) if isinstance(got, tuple) else [got]
    return [None, *(d if is_float(b.shape_of(v)) else None for d, v in zip(got, operands))]


jvp_rule(If)(jvp_through_decomposition)
