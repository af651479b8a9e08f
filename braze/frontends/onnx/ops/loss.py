"""ONNX SoftmaxCrossEntropyLoss as braze's softmax_cross_entropy: scores `[N, C, d...]` (classes on
axis 1, moved last), class-index labels `[N, d...]`, `reduction` and `ignore_index` as braze's
loss has them (ignored rows add nothing; "mean" averages over the others). The optional second
output `log_prob` is log_softmax over axis 1. Per-class weights have no braze form and are
refused, naming the node."""
from __future__ import annotations

from ..context import converter


@converter("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy_loss(ctx, node):
    if ctx.has(node, 2):
        raise ctx.fail(node, "per-class weights (input 'weights') are not supported; import "
                             "the model without them or compute the weighted loss in primitives")
    g = ctx.g
    scores, labels = ctx.value(node, 0), ctx.value(node, 1)
    if not ctx.dtype(labels).is_int:
        raise ctx.fail(node, f"labels must be integer class indices, got {ctx.dtype(labels)}")
    rank = len(ctx.dims(scores))
    last = scores if rank == 2 else g.transpose(scores, (0, *range(2, rank), 1))
    reduction = node.attr("reduction", "mean")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    outs = [g.softmax_cross_entropy(last, labels, reduction,
                                    ignore_index=node.attr("ignore_index"))]
    if len(node.outputs) > 1 and node.outputs[1]:
        outs.append(g.log_softmax(scores, 1))
    return outs
