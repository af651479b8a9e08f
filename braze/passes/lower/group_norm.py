"""LowerGroupNorm: group_norm -> reshape x `[N, C, *spatial]` to `[N, G, C/G * prod(spatial)]`,
mean and (biased) variance over that last axis, normalize, reshape back, per-channel affine.
Every reduction is over the trailing axis, so the result also suits backends that demand
"reduce_last_axis_only" (the op's own decomposition reduces over several axes)."""
from __future__ import annotations

from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.op import Value
from ...ir.ops.norm import GroupNorm
from .layout import per_channel, product_dim
from .registry import Lowering, register_lowering


def lower_group_norm(g: Graph, node: Node, ins: list[Value], old: Graph) -> Value:
    """Build group norm `node` from reshape, last-axis means, rsqrt and the affine in `g`."""
    op: GroupNorm = node.op
    x, *affine = ins
    dims = g.shape_of(x).dims
    group_size = product_dim((dims[1] // op.num_groups,) + dims[2:])
    grouped = g.reshape(x, (dims[0], op.num_groups, group_size))
    centred = g.sub(grouped, g.mean(grouped, -1, keepdims=True))
    var = g.mean(g.mul(centred, centred), -1, keepdims=True)
    y = g.reshape(g.mul(centred, g.rsqrt(g.add(var, op.eps))), dims)
    rest = iter(affine)
    if op.has_gamma:
        y = g.mul(y, per_channel(g, next(rest), len(dims)))
    if op.has_beta:
        y = g.add(y, per_channel(g, next(rest), len(dims)))
    return y


LOWER_GROUP_NORM = Lowering(
    "LowerGroupNorm", frozenset({"group_norm"}), lower_group_norm,
    doc="group_norm -> reshape into groups + last-axis mean / variance + normalize + reshape "
        "back + per-channel affine")
LowerGroupNorm = register_lowering(LOWER_GROUP_NORM)
