"""Reductions and scans: `reduce` (sum, mean, max, min, prod over a set of axes), `softmax`
(a logical composite: max-subtract, exp, sum, divide), `cumsum` and `argmax`.
Axes are stored non-negative; reduce axes as a sorted tuple."""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ..dtypes import i64
from ..op import Op, require
from ..shapes import Shape, normalize_axis

__all__ = ["ReduceFn", "Reduce", "Softmax", "LogSoftmax", "Cumsum", "ArgMax", "compute_dtype",
           "safe_softmax"]


def compute_dtype(x: np.ndarray) -> np.dtype:
    """Precision reductions accumulate in: float32 for f16 / bf16 inputs, else the input's."""
    low = (x.dtype.kind == "f" and x.dtype.itemsize < 4) or x.dtype.name == "bfloat16"
    return np.dtype(np.float32) if low else x.dtype


class ReduceFn(enum.Enum):
    SUM = "sum"
    MEAN = "mean"
    MAX = "max"
    MIN = "min"
    PROD = "prod"


_REDUCE_IMPL = {
    ReduceFn.SUM: np.sum,
    ReduceFn.MEAN: np.mean,
    ReduceFn.MAX: np.max,
    ReduceFn.MIN: np.min,
    ReduceFn.PROD: np.prod,
}


def _check_axes(op: str, axes: tuple[int, ...], rank: int) -> None:
    require(all(isinstance(a, int) and 0 <= a < rank for a in axes),
            f"{op} axes {axes} must be non-negative and below rank {rank}")
    require(list(axes) == sorted(set(axes)), f"{op} axes {axes} must be sorted and unique")


@dataclass(frozen=True)
class Reduce(Op):
    """`fn` over `axes` (sorted, non-negative); `keepdims` leaves them as size 1."""

    kind = "reduce"
    arity = 1
    fn: ReduceFn
    axes: tuple[int, ...]
    keepdims: bool = False

    @property
    def label(self) -> str:
        return f"reduce_{self.fn.value}"

    @classmethod
    def labels(cls) -> tuple[str, ...]:
        return tuple(f"reduce_{f.value}" for f in ReduceFn)

    def infer(self, ins):
        (x,) = ins
        _check_axes(self.label, self.axes, x.rank)
        if self.fn is ReduceFn.MEAN:
            require(x.dtype.is_float or x.dtype.kind == "complex",
                    f"reduce_mean needs a float input, got {x.dtype}")
        elif self.fn in (ReduceFn.SUM, ReduceFn.PROD):
            require(x.dtype.kind != "bool", f"{self.label} needs a numeric input, got bool")
        if self.keepdims:
            dims = tuple(1 if i in self.axes else d for i, d in enumerate(x.dims))
        else:
            dims = tuple(d for i, d in enumerate(x.dims) if i not in self.axes)
        return x.with_dims(dims)

    def reference(self, x):
        acc = compute_dtype(x)
        y = x.astype(acc, copy=False)
        kw = {"dtype": acc} if self.fn in (ReduceFn.SUM, ReduceFn.PROD, ReduceFn.MEAN) else {}
        if self.fn in (ReduceFn.MAX, ReduceFn.MIN) and y.size == 0:
            # an empty set's max is the lowest value (-inf), its min the highest, as ONNX's
            # ReduceMax / ReduceMin give (NumPy has no identity for them)
            info = np.iinfo(y.dtype) if y.dtype.kind in "iu" else None
            lo, hi = (-np.inf, np.inf) if info is None else (info.min, info.max)
            kw = {"initial": lo if self.fn is ReduceFn.MAX else hi}
        out = _REDUCE_IMPL[self.fn](y, axis=self.axes, keepdims=self.keepdims, **kw)
        return np.asarray(out).astype(x.dtype, copy=False)


def safe_softmax(y: np.ndarray, axis: int) -> np.ndarray:
    """Softmax along `axis` where a row of only -inf gives zeros instead of NaN (and an empty
    array is itself)."""
    if y.size == 0:
        return y.copy()
    m = y.max(axis=axis, keepdims=True)
    m = np.where(np.isneginf(m), y.dtype.type(0), m)
    e = np.exp(y - m)
    total = e.sum(axis=axis, keepdims=True)
    return e / np.where(total == 0, y.dtype.type(1), total)


@dataclass(frozen=True)
class Softmax(Op):
    """`exp(x - max) / sum(exp(x - max))` along `axis` (numerically stable). A row whose every
    element is -inf (a fully masked attention row) gives zeros, not NaN, as PyTorch's safe
    softmax does; so the `where(isnan(p), 0, p)` guard that exporters add is a no-op."""

    kind = "softmax"
    arity = 1
    composite = True
    axis: int = -1

    def infer(self, ins):
        (x,) = ins
        normalize_axis(self.axis, x.rank)
        require(x.dtype.is_float, f"softmax needs a float input, got {x.dtype}")
        return x

    def reference(self, x):
        ax = normalize_axis(self.axis, x.ndim)
        y = x.astype(compute_dtype(x), copy=False)
        return safe_softmax(y, ax).astype(x.dtype, copy=False)

    def decompose(self, g, ins):
        (x,) = ins
        ax = normalize_axis(self.axis, g.shape_of(x).rank)
        mx = g.reduce(x, ReduceFn.MAX, ax, keepdims=True)
        mx = g.where(g.isinf(mx, detect_positive=False), 0.0, mx)
        e = g.exp(g.sub(x, mx))
        total = g.reduce(e, ReduceFn.SUM, ax, keepdims=True)
        return g.div(e, g.where(g.eq(total, 0.0), 1.0, total))


@dataclass(frozen=True)
class LogSoftmax(Op):
    """`x - max - log(sum(exp(x - max)))` along `axis`."""

    kind = "log_softmax"
    arity = 1
    composite = True
    axis: int = -1

    def infer(self, ins):
        return Softmax(self.axis).infer(ins)

    def reference(self, x):
        ax = normalize_axis(self.axis, x.ndim)
        y = x.astype(compute_dtype(x), copy=False)
        if y.size == 0:
            return x.copy()
        s = y - y.max(axis=ax, keepdims=True)
        return (s - np.log(np.exp(s).sum(axis=ax, keepdims=True))).astype(x.dtype, copy=False)

    def decompose(self, g, ins):
        (x,) = ins
        ax = normalize_axis(self.axis, g.shape_of(x).rank)
        s = g.sub(x, g.reduce(x, ReduceFn.MAX, ax, keepdims=True))
        return g.sub(s, g.log(g.reduce(g.exp(s), ReduceFn.SUM, ax, keepdims=True)))


@dataclass(frozen=True)
class Cumsum(Op):
    """Running sum along `axis`. `exclusive` leaves out the current element (starts at 0);
    `reverse` sums from the end."""

    kind = "cumsum"
    arity = 1
    axis: int
    exclusive: bool = False
    reverse: bool = False

    def infer(self, ins):
        (x,) = ins
        normalize_axis(self.axis, x.rank)
        require(x.dtype.kind != "bool", "cumsum needs a numeric input, got bool")
        return x

    def reference(self, x):
        ax = normalize_axis(self.axis, x.ndim)
        y = np.flip(x, ax) if self.reverse else x
        c = np.cumsum(y, axis=ax, dtype=compute_dtype(x))
        if self.exclusive:
            shifted = np.zeros_like(c)
            dst = [slice(None)] * c.ndim
            src = [slice(None)] * c.ndim
            dst[ax], src[ax] = slice(1, None), slice(None, -1)
            shifted[tuple(dst)] = c[tuple(src)]
            c = shifted
        if self.reverse:
            c = np.flip(c, ax)
        return np.ascontiguousarray(c).astype(x.dtype, copy=False)


@dataclass(frozen=True)
class ArgMax(Op):
    """Index (i64) of the first maximum along `axis`."""

    kind = "argmax"
    arity = 1
    axis: int
    keepdims: bool = False

    def infer(self, ins):
        (x,) = ins
        ax = normalize_axis(self.axis, x.rank)
        require(x.dims[ax] != 0, f"argmax over empty axis {ax}")
        if self.keepdims:
            dims = x.dims[:ax] + (1,) + x.dims[ax + 1:]
        else:
            dims = x.dims[:ax] + x.dims[ax + 1:]
        return Shape(dims, i64)

    def reference(self, x):
        ax = normalize_axis(self.axis, x.ndim)
        return np.argmax(x, axis=ax, keepdims=self.keepdims).astype(np.int64)
