"""Indexing ops beyond gather: strided `slice` along one axis, `dynamic_narrow` (a step-1
slice whose start is a symbolic dim expression), `gather_elements` (np.take_along_axis), `top_k`
(values and i64 indices) and `trilu` (keep the upper or lower triangle of the last two axes)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ...errors import ShapeError
from ..dtypes import i64
from ..op import Op, require
from ..shapes import Dim, Shape, normalize_axis
from ..symbolic import SymDim, canonical_dim, eval_dim

__all__ = ["Slice", "DynamicNarrow", "GatherElements", "TopK", "Trilu", "slice_length"]


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
class DynamicNarrow(Op):
    """`[start, start + length)` along `axis` where `start` is a symbolic dim expression
    ("72-seq": an ALiBi table cut as `table[..., -seq:]`; "seq-1": `x[:, -1:]` of a symbolic
    axis), evaluated when the symbols bind. Unlike ONNX Slice / PyTorch it never clamps: importers
    emit it only where the source slice needs no clamping for the bindings the graph is meant
    for, and a binding for which `0 <= start` and `start + length <= size` fail raises a
    ShapeError naming the bounds (e.g. seq longer than the table) instead of returning a
    differently sized or wrapped-around slice. A static start is a `narrow`."""

    kind = "dynamic_narrow"
    arity = 1
    needs_symbols: ClassVar[bool] = True
    axis: int
    start: Dim
    length: Dim

    def __post_init__(self):
        object.__setattr__(self, "start", canonical_dim(self.start))
        object.__setattr__(self, "length", canonical_dim(self.length))

    def infer(self, ins):
        (x,) = ins
        ax = normalize_axis(self.axis, x.rank)
        start, length = SymDim.of(self.start), SymDim.of(self.length)
        room = SymDim.of(x.dims[ax]) - start - length
        for what, expr in (("start", start), ("length", length), ("room after the slice", room)):
            require(not expr.is_const or expr.const >= 0,
                    f"dynamic_narrow [{start}, {start + length}) on axis {ax} of size "
                    f"{x.dims[ax]}: {what} is {expr} < 0 for every binding")
        return x.with_dims(x.dims[:ax] + (self.length,) + x.dims[ax + 1:])

    def bounds(self, size: int, symbols: Mapping[str, int] | None) -> tuple[int, int]:
        """(start, stop) under `symbols`; ShapeError when they leave [0, size]."""
        env = dict(symbols or {})
        try:
            start, length = eval_dim(self.start, env), eval_dim(self.length, env)
        except KeyError as e:
            raise ShapeError(f"dynamic_narrow needs a value for symbol {e}; pass symbols=") \
                from None
        if start < 0 or length < 0 or start + length > size:
            bound = ", ".join(f"{k}={v}" for k, v in sorted(env.items())
                              if k in SymDim.of(self.start).symbols | SymDim.of(
                                  self.length).symbols)
            raise ShapeError(
                f"dynamic_narrow [{self.start}, {self.start}+{self.length}) is [{start}, "
                f"{start + length}) for {bound or 'this binding'}, outside axis {self.axis} of "
                f"size {size}: the graph was imported assuming this slice needs no clamping "
                "(e.g. a position table at least as long as the sequence); this binding "
                "breaks that assumption: feed sizes that keep the slice inside the axis (a "
                "cache at least as long as the window it keeps), or import with that dim "
                "static")
        return start, start + length

    def reference(self, x, *, symbols: Mapping[str, int] | None = None):
        ax = normalize_axis(self.axis, x.ndim)
        start, stop = self.bounds(x.shape[ax], symbols)
        idx = [slice(None)] * x.ndim
        idx[ax] = slice(start, stop)
        return x[tuple(idx)]


@dataclass(frozen=True)
class GatherElements(Op):
    """`out[i][j][k] = x[indices[i][j][k]][j][k]` (for axis 0; ONNX GatherElements): indices has
    x's rank and the output its shape; off the axis its dims may be smaller than x's; negative
    indices count from the end, or with `negative_indices=False` (torch.gather, which raises
    on them) are an error at run time."""

    kind = "gather_elements"
    arity = 2
    axis: int = 0
    negative_indices: bool = True

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
        if not self.negative_indices and idx.size and idx.min() < 0:
            raise IndexError(self.negative_index_message(idx.min(), x.shape[ax], ax))
        idx = np.where(idx < 0, idx + x.shape[ax], idx).astype(np.int64)
        grid = list(np.ogrid[tuple(slice(n) for n in idx.shape)])
        grid[ax] = idx
        return x[tuple(grid)]

    @staticmethod
    def negative_index_message(index: int, n: int, ax: int) -> str:
        return (f"gather_elements with negative_indices=False (torch.gather) got index {index}; "
                f"indices along axis {ax} must lie in [0, {n}) (torch raises on a negative "
                "index; a class label in cross_entropy / nll_loss must be >= 0 or the "
                "ignore_index)")


@dataclass(frozen=True)
class TopK(Op):
    """The `k` largest (or smallest) elements along `axis`: outputs (values, i64 indices),
    sorted best first when `sorted`; ties keep the lower index first. NaN ranks above +inf,
    as in torch.topk / torch.sort and ONNX TopK: first when largest, last when smallest."""

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
        if x.dtype.kind in "iub":  # ~x orders integers from the largest down, no overflow
            key = x.astype(np.int64)
            order = np.argsort(~key if self.largest else key, axis=ax, kind="stable")
        else:  # floats (bfloat16 too) compare exactly in float64; argsort puts NaN last
            key = x.astype(np.float64)
            order = (np.lexsort((-key, ~np.isnan(key)), axis=ax) if self.largest
                     else np.argsort(key, axis=ax, kind="stable"))
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
