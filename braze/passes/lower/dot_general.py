"""LowerDotGeneral: dot_general (explicit batch and contracting dims) -> transpose + reshape +
matmul (+ reshape back), for backends with a plain matmul only.

lhs is laid out as [batch..., lhs_free..., K] and rhs as [batch..., K, N], where K merges the
contracting dims and N the rhs free dims (symbolic dims multiply symbolically). The lhs free
dims stay separate: matmul broadcasting treats all but the last as batch, so with no batch dims
the result is the familiar `x @ w`. With batch dims, rhs gets size-1 axes so it broadcasts over
the extra lhs free dims. No lhs free dim means a size-1 row that the final reshape drops."""
from __future__ import annotations

from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.op import Value
from ...ir.ops.linalg import DotGeneral
from .layout import product_dim, reshape_if_needed, transpose_if_needed
from .registry import Lowering, register_lowering


def lower_dot_general(g: Graph, node: Node, ins: list[Value], old: Graph) -> Value:
    """Build `node` (a dot_general) from transpose, reshape and one matmul in `g`."""
    op: DotGeneral = node.op
    a, b = ins
    ad, bd = g.shape_of(a).dims, g.shape_of(b).dims
    lhs_free = op.free_dims(len(ad), "lhs")
    rhs_free = op.free_dims(len(bd), "rhs")
    batch = [ad[i] for i in op.lhs_batch]
    free_l = [ad[i] for i in lhs_free]
    free_r = [bd[i] for i in rhs_free]
    k = product_dim([ad[i] for i in op.lhs_contract])
    n = product_dim(free_r)

    lhs = transpose_if_needed(g, a, op.lhs_batch + tuple(lhs_free) + op.lhs_contract)
    rows = free_l or [1]
    lhs = reshape_if_needed(g, lhs, batch + rows + [k])
    rhs = transpose_if_needed(g, b, op.rhs_batch + op.rhs_contract + tuple(rhs_free))
    spread = [1] * (len(rows) - 1) if batch else []
    rhs = reshape_if_needed(g, rhs, batch + spread + [k, n])
    return reshape_if_needed(g, g.matmul(lhs, rhs), batch + free_l + free_r)


LOWER_DOT_GENERAL = Lowering(
    "LowerDotGeneral", frozenset({"dot_general"}), lower_dot_general,
    doc="dot_general -> transpose + reshape + matmul (+ reshape back)")
LowerDotGeneral = register_lowering(LOWER_DOT_GENERAL)
