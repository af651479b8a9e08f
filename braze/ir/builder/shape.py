"""Builder methods for reshape, transpose, narrow, concat, expand, gather, pad, split, and the
squeeze / unsqueeze conveniences (built on reshape). Axes are normalized here, so ops store
non-negative axes and fully resolved target dims."""
from __future__ import annotations

from collections.abc import Sequence

from ...errors import GraphError, ShapeError
from ..dtypes import DType, i64
from ..op import Value
from ..ops.generate import Range, SymConst
from ..ops.indexing import DynamicNarrow, GatherElements, Slice, TopK, Trilu
from ..ops.shape import (
    Concat,
    Expand,
    Gather,
    Narrow,
    Pad,
    PadMode,
    Reshape,
    Split,
    Transpose,
    resolve_reshape,
)
from ..shapes import Dim, normalize_axis
from ..symbolic import canonical_dim
from .rlx_args import check_shape

__all__ = ["ShapeBuilder", "axis_for", "axes_for"]


def axis_for(op: str, axis: int, rank: int) -> int:
    """`axis` normalized for `rank`; the ShapeError names `op`."""
    try:
        return normalize_axis(int(axis), rank)
    except ShapeError as e:
        raise ShapeError(f"{op}: {e}") from None


def _pad_mode(mode: PadMode | str) -> PadMode:
    if isinstance(mode, PadMode):
        return mode
    try:
        return PadMode(mode)
    except ValueError:
        raise GraphError(f"unknown pad mode {mode!r}; known: "
                         f"{', '.join(m.value for m in PadMode)}") from None


def axes_for(op: str, axes: int | Sequence[int], rank: int) -> tuple[int, ...]:
    """Sorted, unique, non-negative axes for `rank`; the ShapeError names `op`."""
    seq = (axes,) if isinstance(axes, int) else tuple(axes)
    out = sorted({axis_for(op, a, rank) for a in seq})
    if len(out) != len(seq):
        raise ShapeError(f"{op}: axes {tuple(seq)} repeat an axis")
    return tuple(out)


class ShapeBuilder:
    def reshape(self, x: Value, dims: Sequence[Dim], shape=None) -> Value:
        """View `x` with `dims`; one -1 is resolved now (symbols allowed: ("b", 4, 8) ->
        ("b", -1) gives ("b", 32))."""
        try:
            resolved = resolve_reshape(self.shape_of(x).dims, tuple(dims))
        except ShapeError:
            resolved = tuple(dims)  # add_node reports the ShapeError with node context
        out = self.add_node(Reshape(resolved), (x,))[0]
        check_shape("reshape", self.shape_of(out), shape)
        return out

    reshape_ = reshape

    def transpose(self, x: Value, perm: Sequence[int] | None = None) -> Value:
        """Permute axes (output axis i = input axis perm[i]); None reverses them."""
        rank = self.shape_of(x).rank
        p = tuple(reversed(range(rank))) if perm is None else tuple(
            axis_for("transpose", a, rank) for a in perm)
        return self.add_node(Transpose(p), (x,))[0]

    transpose_ = transpose

    def narrow(self, x: Value, axis: int, start: Dim, length: Dim) -> Value:
        """Slice `[start, start + length)` along `axis`; `length` may be a symbol ("seq").
        A symbolic `start` ("72-seq") makes a `dynamic_narrow`, bounds-checked when the
        symbols bind."""
        ax = axis_for("narrow", axis, self.shape_of(x).rank)
        length = length if isinstance(length, str) else int(length)
        start = canonical_dim(start)
        if isinstance(start, str):
            return self.add_node(DynamicNarrow(ax, start, length), (x,))[0]
        return self.add_node(Narrow(ax, start, length), (x,))[0]

    narrow_ = narrow

    def concat(self, xs: Sequence[Value], axis: int, shape=None) -> Value:
        """Join `xs` along `axis`."""
        xs = tuple(xs)
        if not xs:
            raise GraphError("concat needs at least one input")
        ax = axis_for("concat", axis, self.shape_of(xs[0]).rank)
        out = self.add_node(Concat(ax), xs)[0]
        check_shape("concat", self.shape_of(out), shape)
        return out

    concat_ = concat

    def expand(self, x: Value, dims: Sequence[Dim]) -> Value:
        """Broadcast `x` to `dims`; a -1 keeps the input's dim at that (trailing-aligned) place."""
        src = self.shape_of(x).dims
        dims = tuple(dims)
        off = len(dims) - len(src)
        resolved = tuple(src[i - off] if d == -1 and i >= off else d for i, d in enumerate(dims))
        return self.add_node(Expand(resolved), (x,))[0]

    def gather(self, x: Value, indices: Value, axis: int = 0, shape=None) -> Value:
        """`np.take(x, indices, axis)`: rows of an embedding table, for example."""
        ax = axis_for("gather", axis, self.shape_of(x).rank)
        out = self.add_node(Gather(ax), (x, indices))[0]
        check_shape("gather", self.shape_of(out), shape)
        return out

    gather_ = gather

    def pad(self, x: Value, pads: Sequence[tuple[int, int]], value: float = 0.0,
            mode: PadMode | str = PadMode.CONSTANT) -> Value:
        """Pad `x`: `pads[i] = (before, after)` for every axis i, filled with `value`
        (mode "constant"), the mirror image without the edge ("reflect") or the edge ("edge")."""
        pairs = tuple((int(b), int(a)) for b, a in pads)
        return self.add_node(Pad(pairs, float(value), _pad_mode(mode)), (x,))[0]

    def split(self, x: Value, axis: int, sizes: Sequence[int]) -> tuple[Value, ...]:
        """Cut `x` along `axis` into pieces of `sizes`; one value per piece."""
        ax = axis_for("split", axis, self.shape_of(x).rank)
        return self.add_node(Split(ax, tuple(int(s) for s in sizes)), (x,))

    def slice(self, x: Value, axis: int, start: int, stop: int, step: int = 1) -> Value:
        """`x[start:stop:step]` along `axis` (Python semantics; static axis)."""
        ax = axis_for("slice", axis, self.shape_of(x).rank)
        return self.add_node(Slice(ax, int(start), int(stop), int(step)), (x,))[0]

    def gather_elements(self, x: Value, indices: Value, axis: int = 0,
                        negative_indices: bool = True) -> Value:
        """`np.take_along_axis(x, indices, axis)`; negative indices count from the end, or
        with `negative_indices=False` (torch.gather) fail at run time."""
        ax = axis_for("gather_elements", axis, self.shape_of(x).rank)
        return self.add_node(GatherElements(ax, bool(negative_indices)), (x, indices))[0]

    def top_k(self, x: Value, k: int, axis: int = -1, largest: bool = True,
              sorted: bool = True) -> tuple[Value, Value]:
        """(values, i64 indices) of the `k` largest (or smallest) along `axis`."""
        ax = axis_for("top_k", axis, self.shape_of(x).rank)
        return self.add_node(TopK(int(k), ax, bool(largest), bool(sorted)), (x,))

    def trilu(self, x: Value, upper: bool = True, k: int = 0) -> Value:
        """Keep the upper (or lower) triangle of the last two axes, offset by diagonal `k`."""
        return self.add_node(Trilu(bool(upper), int(k)), (x,))[0]

    def arange(self, length: Dim, start: float = 0, delta: float = 1, dtype: DType = i64
               ) -> Value:
        """`start + i * delta` for i < `length` (an int or a symbol such as "seq")."""
        return self.add_node(Range(length, start, delta, dtype), ())[0]

    def sym_const(self, values: Sequence[Dim], shape: Sequence[int] | None = None,
                  dtype: DType = i64) -> Value:
        """A small tensor of dims evaluated at run time (`("batch", "seq", 64)`)."""
        vals = tuple(values)
        dims = (len(vals),) if shape is None else tuple(int(d) for d in shape)
        return self.add_node(SymConst(vals, dims, dtype), ())[0]

    def squeeze(self, x: Value, axes: int | Sequence[int] | None = None) -> Value:
        """Drop size-1 `axes` (None: every size-1 axis); a reshape."""
        dims = self.shape_of(x).dims
        drop = tuple(i for i, d in enumerate(dims) if d == 1) if axes is None else axes_for(
            "squeeze", axes, len(dims))
        for a in drop:
            if dims[a] != 1:
                raise ShapeError(f"squeeze axis {a} has size {dims[a]}, not 1 (shape {dims})")
        return self.reshape(x, tuple(d for i, d in enumerate(dims) if i not in drop))

    def unsqueeze(self, x: Value, axes: int | Sequence[int]) -> Value:
        """Insert size-1 dims so they sit at `axes` of the result (`np.expand_dims`)."""
        dims = list(self.shape_of(x).dims)
        n = len(dims) + (1 if isinstance(axes, int) else len(tuple(axes)))
        for a in axes_for("unsqueeze", axes, n):
            dims.insert(a, 1)
        return self.reshape(x, dims)
