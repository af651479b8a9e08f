"""LowerBatchNormInference: inference batch_norm -> `(x - mean) * (gamma / sqrt(var + eps)) +
beta`, for backends without a batch-norm kernel. The per-channel scale is computed on the `[C]`
vectors (params, so constant folding can bake it) before one reshape to `[C, 1, ...]` broadcasts
it along axis 1; the large tensor sees only a sub, a mul and an add."""
from __future__ import annotations

from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.op import Value
from ...ir.ops.norm import BatchNorm
from .layout import per_channel
from .registry import Lowering, register_lowering


def lower_batch_norm(g: Graph, node: Node, ins: list[Value], old: Graph) -> Value:
    """Build inference batch norm `node` from sub, mul, add and rsqrt in `g`."""
    op: BatchNorm = node.op
    x, gamma, beta, mean, var = ins
    rank = g.shape_of(x).rank
    scale = g.mul(gamma, g.rsqrt(g.add(var, op.eps)))
    centred = g.sub(x, per_channel(g, mean, rank))
    return g.add(g.mul(centred, per_channel(g, scale, rank)), per_channel(g, beta, rank))


LOWER_BATCH_NORM_INFERENCE = Lowering(
    "LowerBatchNormInference", frozenset({"batch_norm"}), lower_batch_norm,
    doc="batch_norm (inference) -> (x - mean) * (gamma / sqrt(var + eps)) + beta per channel")
LowerBatchNormInference = register_lowering(LOWER_BATCH_NORM_INFERENCE)
