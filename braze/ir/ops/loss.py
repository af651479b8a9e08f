"""Loss ops: `softmax_cross_entropy` (the loss of a classifier from its logits) and its backward
`softmax_cross_entropy_backward` (the gradient of that loss with respect to the logits).

Logits are `[..., C]` (classes last). Labels come in one of two forms, recorded by the
`soft_labels` attribute (the builder picks it from the labels' dtype):
  - class indices (`soft_labels=False`): an integer tensor `[...]` with values in `[0, C)`;
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

    def _check_inputs(self, logits: Shape, labels: Shape) -> None:
        require(logits.rank >= 1, f"{self.kind} needs logits of rank >= 1 ([..., C]), "
                f"got {logits}")
        require(logits.dtype.is_float, f"{self.kind} needs float logits, got {logits.dtype}")
        if self.soft_labels:
            require(labels.dims == logits.dims and labels.dtype == logits.dtype,
                    f"{self.kind} with probability labels needs labels shaped and typed like "
                    f"the logits {logits}, got {labels}")
        else:
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

    def _reference_parts(self, logits: np.ndarray, labels: np.ndarray):
        """(compute-dtype logits, targets as probabilities, row count)."""
        y = logits.astype(compute_dtype(logits), copy=False)
        if self.soft_labels:
            return y, labels.astype(y.dtype, copy=False), max(1, labels[..., 0].size)
        c = y.shape[-1]
        if labels.size and (labels.min() < 0 or labels.max() >= c):
            raise InterpretError(f"{self.kind}: class labels must lie in [0, {c}), got values "
                                 f"from {labels.min()} to {labels.max()}")
        onehot = (labels[..., None] == np.arange(c)).astype(y.dtype)
        return y, onehot, max(1, labels.size)

    def _targets(self, g, logits, labels):
        """Targets as probabilities `[..., C]`: the labels, or a one-hot of the indices."""
        if self.soft_labels:
            return labels
        x = g.shape_of(logits)
        classes = g.arange(x.dims[-1], dtype=g.shape_of(labels).dtype)
        return g.cast(g.eq(g.unsqueeze(labels, -1), classes), x.dtype)

    def _row_count(self, g, logits):
        """The number of rows `[...]` as a float scalar value (symbolic dims bound at run time)."""
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
        y, target, rows = self._reference_parts(logits, labels)
        s = y - y.max(axis=-1, keepdims=True)
        logp = s - np.log(np.exp(s).sum(axis=-1, keepdims=True))
        per = -(target * logp).sum(axis=-1)
        if self.reduction is LossReduction.SUM:
            per = per.sum()
        elif self.reduction is LossReduction.MEAN:
            per = per.sum() / y.dtype.type(rows)
        return np.asarray(per).astype(logits.dtype, copy=False)

    def decompose(self, g, ins):
        logits, labels = ins
        target = self._targets(g, logits, labels)
        per = g.neg(g.sum(g.mul(target, g.log_softmax(logits, -1)), -1))
        if self.reduction is LossReduction.NONE:
            return per
        flat = g.reshape(per, (-1,))
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
        y, target, rows = self._reference_parts(logits, labels)
        d = y.dtype.type
        scale = np.asarray(d_loss).astype(y.dtype, copy=False)
        if self.reduction is LossReduction.NONE:
            scale = scale[..., None]
        elif self.reduction is LossReduction.MEAN:
            scale = scale / d(rows)
        grad = (safe_softmax(y, -1) - target) * scale
        return grad.astype(logits.dtype, copy=False)

    def decompose(self, g, ins):
        logits, labels, d_loss = ins
        diff = g.sub(g.softmax(logits, -1), self._targets(g, logits, labels))
        if self.reduction is LossReduction.NONE:
            return g.mul(diff, g.unsqueeze(d_loss, -1))
        if self.reduction is LossReduction.MEAN:
            d_loss = g.div(d_loss, self._row_count(g, logits))
        return g.mul(diff, d_loss)
