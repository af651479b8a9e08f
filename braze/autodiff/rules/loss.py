"""VJP of `softmax_cross_entropy`. Class-index labels: the closed-form backward op
`softmax_cross_entropy_backward` ((softmax - one_hot) * d_loss, / rows for "mean"), so the
gradient graph keeps the loss op itself, whose reference checks the labels lie in [0, C),
instead of a one-hot decomposition that reads a label outside as no class; it carries the
loss's ignore_index. Probability labels:
(softmax * sum(target) - target) * d_loss for the logits (exact for rows that do not sum to 1,
as torch) and -log_softmax(logits) * d_loss for the labels. The JVP goes through the
decomposition."""
from __future__ import annotations

from ...ir.ops.loss import LossReduction, SoftmaxCrossEntropy
from ..registry import jvp_rule, vjp_rule
from ._composite import jvp_through_decomposition


@vjp_rule(SoftmaxCrossEntropy)
def softmax_cross_entropy_vjp(b, node, ins, outs, cts):
    (ct,) = cts
    op: SoftmaxCrossEntropy = node.op
    if ct is None:
        return [None, None]
    logits, labels = ins
    if not op.soft_labels:
        return [b.softmax_cross_entropy_backward(logits, labels, ct, op.reduction,
                                                 op.ignore_index), None]
    if op.reduction is LossReduction.NONE:
        per_row = b.unsqueeze(ct, -1)
    elif op.reduction is LossReduction.MEAN:
        per_row = b.div(ct, op._row_count(b, logits))
    else:
        per_row = ct
    total = b.sum(labels, -1, keepdims=True)
    d_logits = b.mul(b.sub(b.mul(b.softmax(logits, -1), total), labels), per_row)
    return [d_logits, b.mul(b.neg(b.log_softmax(logits, -1)), per_row)]


jvp_rule(SoftmaxCrossEntropy)(jvp_through_decomposition)
