"""LowerSoftmaxCrossEntropy: the loss `softmax_cross_entropy` and its backward to log_softmax /
softmax, a one-hot of the class indices (arange + eq + cast), mul and reductions, for backends
without a fused loss kernel. The ops' own decomposition (braze/ir/ops/loss.py) is the lowering,
so the interpreter's meaning, unfuse and this pass agree by construction."""
from __future__ import annotations

from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.op import Value
from .registry import Lowering, register_lowering

LOSS_KINDS = frozenset({"softmax_cross_entropy", "softmax_cross_entropy_backward"})


def lower_softmax_cross_entropy(g: Graph, node: Node, ins: list[Value], old: Graph) -> Value:
    """Build the loss (or its backward) `node` from primitives in `g`."""
    return node.op.decompose(g, ins)


LOWER_SOFTMAX_CROSS_ENTROPY = Lowering(
    "LowerSoftmaxCrossEntropy", LOSS_KINDS, lower_softmax_cross_entropy,
    doc="softmax_cross_entropy(_backward) -> log_softmax / softmax + one-hot (eq + cast) + mul "
        "+ reduce")
LowerSoftmaxCrossEntropy = register_lowering(LOWER_SOFTMAX_CROSS_ENTROPY)
