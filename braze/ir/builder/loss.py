"""Builder methods for the loss ops: softmax_cross_entropy and its backward. The label form
follows the labels' dtype: integer labels are class indices `[...]`, float labels are
probabilities `[..., C]` (see braze/ir/ops/loss.py)."""
from __future__ import annotations

from ..dtypes import i32
from ..op import Value
from ..ops.loss import LossReduction, SoftmaxCrossEntropy, SoftmaxCrossEntropyBackward
from .conv import _enum

__all__ = ["LossBuilder"]


def _reduction(r: LossReduction | str) -> LossReduction:
    return _enum(LossReduction, str(r).lower() if isinstance(r, str) else r, "loss reduction")


class LossBuilder:
    def _soft_labels(self, labels: Value) -> bool:
        return self.shape_of(labels).dtype.is_float

    def softmax_cross_entropy(self, logits: Value, labels: Value,
                              reduction: LossReduction | str = "mean",
                              ignore_index: int | None = None) -> Value:
        """Cross entropy of softmax(logits `[..., C]`) against integer class indices `[...]` or
        float probabilities `[..., C]`; `reduction` "mean" (over rows), "sum" or "none". Rows
        whose class index is `ignore_index` (torch's -100) count for nothing, "mean" included."""
        op = SoftmaxCrossEntropy(_reduction(reduction), self._soft_labels(labels), ignore_index)
        return self.add_node(op, (logits, labels))[0]

    def softmax_cross_entropy_with_logits(self, logits: Value, labels: Value) -> Value:
        """RLX's name: the per-row loss `[N]` of logits `[N, C]` (no reduction). RLX encodes
        the class indices as f32 labels `[N]`; those are cast to int32 here. Float labels
        `[N, C]` are probabilities, integer labels `[N]` indices."""
        return self.softmax_cross_entropy(logits, self._rlx_labels(logits, labels), "none")

    def _rlx_labels(self, logits: Value, labels: Value) -> Value:
        """Float labels with one dim fewer than the logits are RLX's f32-encoded class ids."""
        lab, log = self.shape_of(labels), self.shape_of(logits)
        if lab.dtype.is_float and lab.rank == log.rank - 1:
            return self.cast(labels, i32)
        return labels

    def softmax_cross_entropy_backward(self, logits: Value, labels: Value, d_loss: Value,
                                       reduction: LossReduction | str | None = None,
                                       ignore_index: int | None = None) -> Value:
        """Gradient of `softmax_cross_entropy(logits, labels, reduction)` for the logits, given
        `d_loss` shaped like that loss: `(softmax(logits) - target) * d_loss` (/ rows for
        "mean"). Without `reduction`, a per-row `d_loss` (one dim fewer than the logits) means
        "none", as in RLX's `softmax_cross_entropy_backward` (whose float class ids are cast
        to int32); a scalar `d_loss` means "mean"."""
        if reduction is None:
            log = self.shape_of(logits)
            per_row = log.rank > 1 and self.shape_of(d_loss).rank == log.rank - 1
            reduction = "none" if per_row else "mean"
            if per_row:
                labels = self._rlx_labels(logits, labels)
        op = SoftmaxCrossEntropyBackward(_reduction(reduction), self._soft_labels(labels),
                                         ignore_index)
        return self.add_node(op, (logits, labels, d_loss))[0]
