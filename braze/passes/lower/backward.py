"""LowerBackwardOps: the closed-form backward ops (relu / activation, the norms, rope, cumsum,
gather, max pool, conv2d and attention backward; braze/ir/ops/backward*.py) into primitives, for
backends with no backward kernel. Each op's own `decompose` is the lowering, so the
interpreter's meaning, a second reverse pass (`prepare_graph_for_ad`) and this pass agree by
construction."""
from __future__ import annotations

from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.op import OP_REGISTRY, Value
from ...ir.ops import backward, backward_attention, backward_conv
from .registry import Lowering, register_lowering

_MODULES = {m.__name__ for m in (backward, backward_attention, backward_conv)}
BACKWARD_KINDS = frozenset(kind for kind, cls in OP_REGISTRY.items()
                           if cls.__module__ in _MODULES)


def lower_backward_op(g: Graph, node: Node, ins: list[Value], old: Graph
                      ) -> Value | tuple[Value, ...]:
    """Build the backward op `node` from primitives in `g`."""
    return node.op.decompose(g, ins)


LOWER_BACKWARD_OPS = Lowering(
    "LowerBackwardOps", BACKWARD_KINDS, lower_backward_op,
    doc="*_backward ops -> elementwise math, reductions, matmuls, slices and conv_transpose2d")
LowerBackwardOps = register_lowering(LOWER_BACKWARD_OPS)
