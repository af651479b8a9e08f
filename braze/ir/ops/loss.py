"""Loss ops: `softmax_cross_entropy` (the loss of a classifier from its logits) and its backward
`softmax_cross_entropy_backward` (the gradient of that loss with respect to the logits).

Logits are `[..., C]` (classes last). Labels come in one of two forms, recorded by the
`soft_labels` attribute (the builder picks it from the labels' dtype):
  - class indices (`soft_labels=False`): an integer tensor `[...]` with values in `[0, C)`,
    or equal to `ignore_index` when that is set (torch's `ignore_index`, e.g. -100): such rows
    add nothing to the loss, get no gradient, and "mean" averages over the other rows only
    (NaN when every row is ignored, as in torch). Any other label is an error;
  - probabilities (`soft_labels=True`): a float tensor `[..., C]` like the logits, each row a
    distribution over the classes (label smoothing, distillation targets).
The per-row loss is `-sum(target * log_softmax(logits), -1)`; `reduction` "mean" averages it
over every row (the number of rows, in both label forms), "sum" adds the rows, "none" keeps
`[...]`. The backward takes `d_loss` shaped like the loss and gives
`d_logits = (softmax(logits) - target) * d_loss`, divided by the row count for "mean".

Both are composites: they decompose into log_softmax / softmax, a one-hot made with
arange + eq + cast, mul and reductions (`LowerSoftmaxCrossEntropy` applies that), and keep a
direct, numerically stable NumPy reference."""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ...errors import InterpretError
from ..op import Op, require
from ..shapes import Shape
from .reduce import compute_dtype, safe_softmax

__all__ = ["LossReduction", "SoftmaxCrossEntropy", "SoftmaxCrossEntropyBackward"]


class LossReduction(enum.Enum):
    MEAN = "mean"
    SUM = "sum"
    NONE = "none"


@dataclass(frozen=True)
class _SoftmaxCrossEntropyBase(Op):
    """What the loss and its backward share: label forms, shape rules, targets."""

    composite = True
    reduction: LossReduction = LossReduction.MEAN
    soft_labels: bool = False
    ignore_index: int | None = None

    def _check_inputs(self, logits: Shape, labels: Shape) -> None:
        require(logits.rank >= 1, f"{self.kind} needs logits of rank >= 1 ([..., C]), "
                f"got {logits}")
        require(logits.dtype.is_float, f"{self.kind} needs float logits, got {logits.dtype}")
        if self.soft_labels:
            require(labels.dims == logits.dims and labels.dtype == logits.dtype,
                    f"{self.kind} with probability labels needs labels shaped and typed like "
                    f"the logits {logits}, got {labels}")
            require(self.ignore_index is None, f"{self.kind}: ignore_index applies to "
                    "class-index labels, not to probability labels")
        else:
            require(self.ignore_index is None or not isinstance(self.ignore_index, bool)
                    and isinstance(self.ignore_index, int), f"{self.kind} needs an int "
                    f"ignore_index (or None), got {self.ignore_index!r}")
            require(labels.dtype.is_int, f"{self.kind} with class-index labels needs integer "
                    f"labels, got {labels.dtype} (float labels are probabilities: "
                    f"soft_labels=True)")
            require(labels.dims == logits.dims[:-1], f"{self.kind} needs class-index labels "
                    f"shaped like the logits without the class axis {logits.dims[:-1]}, "
                    f"got {labels}")

    def loss_shape(self, logits: Shape) -> Shape:
        """The loss's shape for these logits: `[...]` with reduction "none", else a scalar."""
        dims = logits.dims[:-1] if self.reduction is LossReduction.NONE else ()
        return Shape(dims, logits.dtype)

    def counted_rows(self, labels: np.ndarray, classes: int) -> tuple[np.ndarray | None, int]:
        """(rows kept `[...]` bool, or None without an ignore_index; the row count "mean"
        divides by) for class-index `labels`; InterpretError when a label is neither in
        [0, classes) nor the ignore_index. Probability labels: (None, the row count)."""
        if self.soft_labels:
            return None, max(1, labels[..., 0].size)
        kept = None if self.ignore_index is None else labels != self.ignore_index
        checked = labels if kept is None else labels[kept]
        if checked.size and (checked.min() < 0 or checked.max() >= classes):
            bad = checked[(checked < 0) | (checked >= classes)]
            also = "" if self.ignore_index is None else f" or be ignore_index {self.ignore_index}"
            raise InterpretError(f"{self.kind}: class labels must lie in [0, {classes}){also}; "
                                 f"got {bad.size} outside, e.g. {bad.flat[0]} (padding rows? "
                                 "give the loss ignore_index=, e.g. -100 as torch)")
        return kept, (max(1, labels.size) if kept is None else int(kept.sum()))

    def _reference_parts(self, logits: np.ndarray, labels: np.ndarray):
        """(compute-dtype logits, targets as probabilities, row count, rows kept `[..., 1]` or
        None). An ignored row's target is all zero and it is not counted."""
        y = logits.astype(compute_dtype(logits), copy=False)
        kept, rows = self.counted_rows(labels, y.shape[-1])
        if self.soft_labels:
            return y, labels.astype(y.dtype, copy=False), rows, None
        onehot = (labels[..., None] == np.arange(y.shape[-1])).astype(y.dtype)
        if kept is None:
            return y, onehot, rows, None
        onehot *= kept[..., None]
        return y, onehot, rows, kept[..., None]

    def _targets(self, g, logits, labels):
        """Targets as probabilities `[..., C]`: the labels, or a one-hot of the indices (all
        zero on ignored rows)."""
        if self.soft_labels:
            return labels
        x = g.shape_of(logits)
        classes = g.arange(x.dims[-1], dtype=g.shape_of(labels).dtype)
        onehot = g.cast(g.eq(g.unsqueeze(labels, -1), classes), x.dtype)
        kept = self._kept(g, logits, labels)
        return onehot if kept is None else g.mul(onehot, g.unsqueeze(kept, -1))

    def _kept(self, g, logits, labels):
        """1.0 / 0.0 `[...]`: whether each row counts (None without an ignore_index)."""
        if self.ignore_index is None:
            return None
        ignore = g.constant(np.array(self.ignore_index, g.shape_of(labels).dtype.np))
        return g.cast(g.ne(labels, ignore), g.shape_of(logits).dtype)

    def _row_count(self, g, logits, labels=None):
        """The number of rows `[...]` (not ignored) as a float scalar value (symbolic dims bound
        at run time)."""
        kept = None if labels is None else self._kept(g, logits, labels)
        if kept is not None:
            return g.sum(g.reshape(kept, (-1,)), 0)
        x = g.shape_of(logits)
        rows = x.dims[:-1]
        if all(isinstance(d, int) for d in rows):
            return float(max(1, int(np.prod(rows, dtype=np.int64))))
        return g.cast(g.prod(g.sym_const(rows)), x.dtype)


@dataclass(frozen=True)
class SoftmaxCrossEntropy(_SoftmaxCrossEntropyBase):
    """Cross entropy of `softmax(logits)` against `labels` (see the module docstring), reduced
    by `reduction`. Inputs (logits, labels)."""

    kind = "softmax_cross_entropy"
    arity = 2

    def infer(self, ins):
        logits, labels = ins
        self._check_inputs(logits, labels)
        return self.loss_shape(logits)

    def reference(self, logits, labels):
        y, target, rows, _ = self._reference_parts(logits, labels)
        s = y - y.max(axis=-1, keepdims=True)
        logp = s - np.log(np.exp(s).sum(axis=-1, keepdims=True))
        per = -(target * logp).sum(axis=-1)
        if self.reduction is LossReduction.SUM:
            per = per.sum()
        elif self.reduction is LossReduction.MEAN:
            with np.errstate(invalid="ignore"):  # every row ignored: NaN, as torch
                per = per.sum() / y.dtype.type(rows)
        return np.asarray(per).astype(logits.dtype, copy=False)

    def decompose(self, g, ins):
        logits, labels = ins
        target = self._targets(g, logits, labels)
        per = g.neg(g.sum(g.mul(target, g.log_softmax(logits, -1)), -1))
        if self.reduction is LossReduction.NONE:
            return per
        flat = g.reshape(per, (-1,))
        if self.reduction is LossReduction.MEAN and self.ignore_index is not None:
            return g.div(g.sum(flat, 0), self._row_count(g, logits, labels))
        fn = "sum" if self.reduction is LossReduction.SUM else "mean"
        return g.reduce(flat, fn, 0)


@dataclass(frozen=True)
class SoftmaxCrossEntropyBackward(_SoftmaxCrossEntropyBase):
    """`d_logits = (softmax(logits) - target) * d_loss`, divided by the row count for "mean".
    Inputs (logits, labels, d_loss); d_loss is shaped like the forward loss."""

    kind = "softmax_cross_entropy_backward"
    arity = 3

    def infer(self, ins):
        logits, labels, d_loss = ins
        self._check_inputs(logits, labels)
        want = self.loss_shape(logits)
        require(d_loss.dims == want.dims and d_loss.dtype == want.dtype,
                f"{self.kind} needs d_loss shaped like the loss {want}, got {d_loss}")
        return logits

    def reference(self, logits, labels, d_loss):
        y, target, rows, kept = self._reference_parts(logits, labels)
        d = y.dtype.type
        scale = np.asarray(d_loss).astype(y.dtype, copy=False)
        if self.reduction is LossReduction.NONE:
            scale = scale[..., None]
        elif self.reduction is LossReduction.MEAN:
            with np.errstate(invalid="ignore", divide="ignore"):
                scale = scale / d(rows)
        if kept is not None:
            scale = scale * kept
        grad = (safe_softmax(y, -1) - target) * scale
        return grad.astype(logits.dtype, copy=False)

    def decompose(self, g, ins):
        logits, labels, d_loss = ins
        diff = g.sub(g.softmax(logits, -1), self._targets(g, logits, labels))
        kept = self._kept(g, logits, labels)
        if kept is not None:
            diff = g.mul(diff, g.unsqueeze(kept, -1))
        if self.reduction is LossReduction.NONE:
            return g.mul(diff, g.unsqueeze(d_loss, -1))
        if self.reduction is LossReduction.MEAN:
            d_loss = g.div(d_loss, self._row_count(g, logits, labels))
        return g.mul(diff, d_loss)
