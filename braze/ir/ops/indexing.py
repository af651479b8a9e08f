"""Indexing ops beyond gather: strided `slice` along one axis, `gather_elements`
(np.take_along_axis), `top_k` (values and i64 indices) and `trilu` (keep the upper or lower
triangle of the last two axes)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dtypes import i64
from ..op import Op, require
from ..shapes import Shape, normalize_axis

__all__ = ["Slice", "GatherElements", "TopK", "Trilu", "slice_length"]


def slice_length(size: int, start: int, stop: int, step: int) -> int:
    """Elements of `range(size)[start:stop:step]` (Python slice semantics)."""
    return len(range(*slice(start, stop, step).indices(size)))


@dataclass(frozen=True)
class Slice(Op):
    """`x[start:stop:step]` along `axis` with Python semantics (negative bounds count from the
    end, a negative step walks backwards). The axis must be static; a step-1 slice of a symbolic
    axis is a `narrow`."""

    kind = "slice"
    arity = 1
    axis: int
    start: int
    stop: int
    step: int = 1

    def infer(self, ins):
        (x,) = ins
        ax = normalize_axis(self.axis, x.rank)
        require(self.step != 0, "slice step must not be 0")
        d = x.dims[ax]
        require(isinstance(d, int), f"slice needs a static axis {ax}, got {d!r}; a step-1 slice "
                "of a symbolic axis is a narrow")
        n = slice_length(d, self.start, self.stop, self.step)
        return x.with_dims(x.dims[:ax] + (n,) + x.dims[ax + 1:])

    def reference(self, x):
        idx = [slice(None)] * x.ndim
        idx[normalize_axis(self.axis, x.ndim)] = slice(self.start, self.stop, self.step)
        return np.ascontiguousarray(x[tuple(idx)])


@dataclass(frozen=True)
class GatherElements(Op):
    """`out[i][j][k] = x[indices[i][j][k]][j][k]` (for axis 0; ONNX GatherElements): indices has
    x's rank and the output its shape; off the axis its dims may be smaller than x's; negative
    indices count from the end."""

    kind = "gather_elements"
    arity = 2
    axis: int = 0

    def infer(self, ins):
        x, idx = ins
        require(idx.dtype.is_int, f"gather_elements indices must be integers, got {idx.dtype}")
        require(idx.rank == x.rank, f"gather_elements indices rank {idx.rank} must equal the "
                f"data rank {x.rank}")
        ax = normalize_axis(self.axis, x.rank)
        for i, (a, b) in enumerate(zip(idx.dims, x.dims)):
            require(i == ax or not (isinstance(a, int) and isinstance(b, int)) or a <= b,
                    f"gather_elements indices dim {i} ({a}) exceeds the data's ({b})")
        return x.with_dims(idx.dims)

    def reference(self, x, idx):
        ax = normalize_axis(self.axis, x.ndim)
        idx = np.where(idx < 0, idx + x.shape[ax], idx).astype(np.int64)
        grid = list(np.ogrid[tuple(slice(n) for n in idx.shape)])
        grid[ax] = idx
        return x[tuple(grid)]


@dataclass(frozen=True)
class TopK(Op):
    """The `k` largest (or smallest) elements along `axis`: outputs (values, i64 indices),
    sorted best first when `sorted`; ties keep the lower index first."""

    kind = "top_k"
    arity = 1
    k: int
    axis: int = -1
    largest: bool = True
    sorted: bool = True

    def infer(self, ins):
        (x,) = ins
        ax = normalize_axis(self.axis, x.rank)
        d = x.dims[ax]
        require(self.k >= 0, f"top_k k must be >= 0, got {self.k}")
        require(not isinstance(d, int) or self.k <= d,
                f"top_k k={self.k} exceeds axis {ax} of size {d}")
        require(x.dtype.is_float or x.dtype.is_int, f"top_k needs numeric input, got {x.dtype}")
        out = x.dims[:ax] + (self.k,) + x.dims[ax + 1:]
        return (x.with_dims(out), Shape(out, i64))

    def reference(self, x):
        ax = normalize_axis(self.axis, x.ndim)
        key = -x if self.largest else x
        if x.dtype.kind == "u" and self.largest:
            key = -x.astype(np.int64)
        order = np.argsort(key, axis=ax, kind="stable")
        idx = np.take(order, np.arange(self.k), axis=ax)
        return np.take_along_axis(x, idx, axis=ax), idx.astype(np.int64)


@dataclass(frozen=True)
class Trilu(Op):
    """Keep the upper (`upper`, j - i >= k) or lower (j - i <= k) triangle of the last two
    axes, zeroing the rest (ONNX Trilu, np.triu / np.tril)."""

    kind = "trilu"
    arity = 1
    upper: bool = True
    k: int = 0

    def infer(self, ins):
        (x,) = ins
        require(x.rank >= 2, f"trilu needs rank >= 2, got {x}")
        return x

    def reference(self, x):
        return (np.triu if self.upper else np.tril)(x, self.k)
