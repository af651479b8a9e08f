"""ONNX data-movement and shape ops: Constant, Shape, Size, Reshape, Flatten, Transpose,
Squeeze, Unsqueeze, Concat, Split (into narrows), Slice (narrows, dynamic narrows, strided
slices, gathers of ranges for strided or reversed symbolic axes), Gather,
GatherElements, Expand (ONNX's two-way broadcast), Tile, ConstantOfShape, EyeLike, Range, Trilu,
GatherND, DepthToSpace / SpaceToDepth (reshape, transpose, reshape). Scatters are in scatter.py.

Shape-valued inputs (Reshape targets, Slice bounds, ...) must be known at import time; they
may hold symbolic dims (`SymDim`). A Slice start that depends on the dims becomes a
`dynamic_narrow`, checked when the dims bind; see `_symbolic_bounds` for the clamping rules."""
from __future__ import annotations

import math

import numpy as np

from ....ir.dtypes import f32, i64
from ....ir.symbolic import SymDim
from ..context import ImportContext, NodeView, converter
from ..dtypes import braze_dtype, onnx_dtype, tensor_array
from ..known import Known, onnx_slice, scalar_known

_BIG = 1 << 40  # Slice ends at or beyond this mean "to the end"
CONST_FOLD_ELEMENTS = 1 << 16


def _dim(d):
    """A braze dim from an int / SymDim."""
    return d.to_dim() if isinstance(d, SymDim) else int(d)


def _axis(ctx, node, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ctx.fail(node, f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


@converter("Constant")
def constant(ctx: ImportContext, node: NodeView):
    a = node.attrs
    if "value" in a:
        if not hasattr(a["value"], "data_type"):
            raise ctx.fail(node, "Constant's value attribute is not a tensor")
        arr, dt = tensor_array(a["value"], f"{ctx.source}: node {node.label}: value")
    elif "value_float" in a:
        arr = np.asarray(a["value_float"], np.float32)
    elif "value_floats" in a:
        arr = np.asarray(a["value_floats"], np.float32)
    elif "value_int" in a:
        arr = np.asarray(a["value_int"], np.int64)
    elif "value_ints" in a:
        arr = np.asarray(a["value_ints"], np.int64)
    else:
        raise ctx.fail(node, f"Constant with {sorted(a)} is not supported (tensor, float(s) and "
                             "int(s) values are)")
    if "value" not in a:
        dt = braze_dtype(arr.dtype)
    if arr.size == 1 or not dt.is_float:
        return [Known(arr, dt)]
    return [ctx.g.constant(arr, dt)]


@converter("Shape")
def shape(ctx, node):
    t = ctx.tensor(node, 0)
    dims = ctx.dims(t.value) if t.value is not None else t.known.array.shape
    start, end = node.attr("start", 0), node.attr("end", None)
    dims = list(dims)[slice(start, end)]
    if all(isinstance(d, int) for d in dims):
        return [Known(np.asarray(dims, np.int64).reshape(len(dims)), i64)]
    arr = np.empty(len(dims), dtype=object)
    for i, d in enumerate(dims):
        arr[i] = d if isinstance(d, int) else SymDim.of(d)
    return [Known(arr, i64)]


@converter("Size")
def size(ctx, node):
    n = SymDim.of(1)
    for d in ctx.dims(ctx.value(node, 0)):
        n = n * SymDim.of(d)
    return [scalar_known(n, i64)]


@converter("Reshape")
def reshape(ctx, node):
    x = ctx.value(node, 0)
    target = ctx.ints(node, 1, "Reshape's target shape")
    src = ctx.dims(x)
    dims = []
    for i, d in enumerate(target):
        if isinstance(d, int) and d == 0 and not node.attr("allowzero", 0):
            if i >= len(src):
                raise ctx.fail(node, f"target {target} copies dim {i} (0) beyond input rank")
            dims.append(src[i])
        else:
            dims.append(_dim(d))
    return [ctx.g.reshape(x, dims)]


@converter("Flatten")
def flatten(ctx, node):
    x = ctx.value(node, 0)
    dims = ctx.dims(x)
    ax = node.attr("axis", 1)
    ax = ax + len(dims) if ax < 0 else ax
    lead, tail = SymDim.of(1), SymDim.of(1)
    for d in dims[:ax]:
        lead = lead * SymDim.of(d)
    for d in dims[ax:]:
        tail = tail * SymDim.of(d)
    return [ctx.g.reshape(x, (lead.to_dim(), tail.to_dim()))]


@converter("Transpose")
def transpose(ctx, node):
    x = ctx.value(node, 0)
    perm = node.attr("perm", None)
    return [ctx.g.transpose(x, None if perm is None else tuple(perm))]


def _axes(ctx, node, pos: int, what: str) -> list[int] | None:
    if "axes" in node.attrs:
        return list(node.attrs["axes"])
    if ctx.has(node, pos):
        return ctx.static_ints(node, pos, what)
    return None


@converter("Squeeze")
def squeeze(ctx, node):
    x = ctx.value(node, 0)
    axes = _axes(ctx, node, 1, "Squeeze axes")
    if axes is None:  # every dim of size 1: a symbolic dim is kept, so it must not bind to 1
        for d in ctx.dims(x):
            if not isinstance(d, int):
                ctx.exclude(node, d, 1, f"Squeeze without axes keeps dim {d} (braze assumes "
                                        f"symbolic dims are not 1), but ONNX drops it when it "
                                        f"is 1; give the Squeeze its axes, or feed {d} != 1")
    return [ctx.g.squeeze(x, axes)]


@converter("Unsqueeze")
def unsqueeze(ctx, node):
    x = ctx.value(node, 0)
    axes = _axes(ctx, node, 1, "Unsqueeze axes")
    if axes is None:
        raise ctx.fail(node, "Unsqueeze needs axes")
    return [ctx.g.unsqueeze(x, axes)]


@converter("Concat")
def concat(ctx, node):
    vals = [ctx.value(node, i) for i in range(len(node.inputs)) if ctx.has(node, i)]
    # Inputs of length 0 along the axis add nothing, nor do empty inputs of a lower rank (old
    # exporters concatenate 1-D [0] tensors to any rank); an input empty only in another dim
    # ([N, 0] on axis 0) still adds its length
    rank = max(ctx.g.shape_of(v).rank for v in vals)
    ax = _axis(ctx, node, node.attr("axis"), rank)

    def adds_nothing(v) -> bool:
        s = ctx.g.shape_of(v)
        return s.dims[ax] == 0 if s.rank == rank else s.numel() == 0

    kept = [v for v in vals if not adds_nothing(v)] or \
        [v for v in vals if ctx.g.shape_of(v).rank == rank][:1]
    return [ctx.g.concat(kept, ax)]


@converter("Split")
def split(ctx, node):
    x = ctx.value(node, 0)
    dims = ctx.dims(x)
    ax = _axis(ctx, node, node.attr("axis", 0), len(dims))
    n_out = len(node.outputs)
    if "split" in node.attrs:
        sizes = list(node.attrs["split"])
    elif ctx.has(node, 1):
        sizes = ctx.static_ints(node, 1, "Split sizes")
    else:
        total = dims[ax]
        parts = node.attr("num_outputs", n_out)
        if not isinstance(total, int):
            raise ctx.fail(node, f"Split of symbolic axis {ax} ({total}) into equal parts "
                                 "needs the sizes")
        chunk = -(-total // parts)
        sizes = [min(chunk, total - i * chunk) for i in range(parts)]
    if len(sizes) != n_out:
        raise ctx.fail(node, f"Split into {len(sizes)} pieces but {n_out} outputs")
    outs, start = [], 0
    for s in sizes:
        outs.append(ctx.g.narrow(x, ax, start, s))
        start += s
    return outs


@converter("Slice")
def slice_(ctx, node):
    x = ctx.value(node, 0)
    if ctx.opset < 10:
        starts, ends = list(node.attr("starts")), list(node.attr("ends"))
        axes = list(node.attr("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = ctx.ints(node, 1, "Slice starts")
        ends = ctx.ints(node, 2, "Slice ends")
        axes = ctx.static_ints(node, 3, "Slice axes") if ctx.has(node, 3) else \
            list(range(len(starts)))
        steps = ctx.static_ints(node, 4, "Slice steps") if ctx.has(node, 4) else \
            [1] * len(starts)
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        x = _slice_axis(ctx, node, x, _axis(ctx, node, a, len(ctx.dims(x))), s, e, st)
    return [x]


def _slice_axis(ctx, node, x, ax: int, start, end, step: int):
    d = ctx.dims(x)[ax]
    if step == 0:
        raise ctx.fail(node, "Slice step must not be 0")
    if isinstance(d, int) and isinstance(start, int) and isinstance(end, int):
        if step == 1:
            lo, hi, _ = slice(start, end, 1).indices(d)
            if lo == 0 and hi == d:
                return x
            return ctx.g.narrow(x, ax, lo, max(hi - lo, 0))
        bounds = onnx_slice(d, start, end, step)
        stop = -d - 1 if bounds.stop is None else bounds.stop  # before element 0
        return ctx.g.slice(x, ax, bounds.start, stop, step)
    dim = SymDim.of(d)
    if step < 0:
        return _reverse_axis(ctx, node, x, ax, start, end, step, dim)
    lo, hi = _symbolic_bounds(start, end, dim)
    _exclude_other_bounds(ctx, node, (start, end, dim), lo, hi, step)
    length = hi - lo
    if step != 1:
        return _strided(ctx, node, x, ax, lo, length, step)
    if length == dim and lo == 0:
        return x
    return ctx.g.narrow(x, ax, lo.to_dim(), length.to_dim())


def _symbolic_bounds(start, end, dim: SymDim) -> tuple[SymDim, SymDim]:
    """ONNX Slice's [start, end) of an axis with symbolic bounds or size, clamped where the
    clamp can be decided at import (constant bounds, ends past the axis). What cannot be decided
    (`-seq` on a table of 72 rows is row 72-seq, in range only while seq <= 72) is left as
    the expression; the narrow / dynamic_narrow it becomes checks it at run time and raises
    rather than clamping, so a binding that needs the clamp fails loudly."""
    if isinstance(start, int) and start >= _BIG:  # INT64_MAX: empty
        return dim, dim
    if isinstance(start, int) and start <= -_BIG:  # INT64_MIN: the start of the axis
        lo = SymDim.of(0)
    else:
        lo = SymDim.of(start)
        lo = dim + lo if _negative(lo) else lo
    if lo.is_const:
        lo = SymDim.of(max(lo.const, 0))
    if isinstance(end, int) and end >= _BIG:
        return lo, dim
    if isinstance(end, int) and end <= -_BIG:
        return lo, lo  # empty
    hi = SymDim.of(end)
    hi = dim + hi if _negative(hi) else hi
    past = (hi - dim).lower_bound()
    if past is not None and past >= 0:  # an end at or beyond the axis end: the axis end
        hi = dim
    return lo, hi


def _exclude_other_bounds(ctx, node, raw, lo: SymDim, hi: SymDim, step: int) -> None:
    """Exclude the small bindings (braze.frontends.small_sizes) where the bounds `lo`, `hi`
    chosen for symbols >= 2 (an end `2*N - 2` clamped to the axis end N) are in range but
    select other elements than ONNX's Slice of (start, end, size) `raw` does; out-of-range
    bounds are refused by the narrow at run time."""
    syms = set().union(*(SymDim.of(v).symbols for v in (*raw, lo, hi)))

    def holds(env):
        start, end, size = (SymDim.of(v).evaluate(env) for v in raw)
        a, b = lo.evaluate(env), hi.evaluate(env)
        if not 0 <= a <= b <= size:
            return True
        want = range(size)[onnx_slice(size, start, end, step)]
        return list(want) == list(range(size)[a:b:step])

    ctx.exclude_small(node, syms, holds, "the Slice bounds were decided for {sym} >= 2 and "
                      "select other elements at {sym} = {value}; feed another size, or fix "
                      "{sym} with input_shapes=")


def _strided(ctx, node, x, ax: int, lo: SymDim, length: SymDim, step: int):
    """`x[lo:lo+length:step]` of a symbolic axis as a gather of a range: its size ceil(length /
    step) must be a polynomial for every size (`x[:, ::2]` of an axis "2*n", `x[..., 1::2]`
    of "16*w"), as it is when the step divides every symbolic coefficient. The span itself is
    cut first, so its bounds are checked."""
    split = (length + (step - 1)).divmod_int(step)  # ceil: "16*w-1" by 2 is 8*w
    try:
        count = split[0] if split is not None else length // step
    except ValueError:
        raise ctx.fail(node, f"a Slice with step {step} of the {length} elements from {lo} "
                             f"on symbolic axis {ax} has size ceil(({length})/{step}), which is "
                             "not a polynomial in the input dims; fix the dims with "
                             "input_shapes= or make the length a multiple of the step") from None
    span = ctx.g.narrow(x, ax, lo.to_dim(), length.to_dim())
    return ctx.g.gather(span, ctx.g.arange(count.to_dim(), 0, step, i64), ax)


def _reverse_axis(ctx, node, x, ax: int, start, end, step: int, dim: SymDim):
    """A negative-step Slice of a symbolic axis: only the whole axis reversed (torch.flip:
    start -1 or past the end, end before the beginning, step -1), as a gather of
    (size-1) - range(size)."""
    first = isinstance(start, int) and (start == -1 or start >= _BIG) or \
        SymDim.of(start) == dim - 1
    whole = isinstance(end, int) and end <= -_BIG
    if step != -1 or not (first and whole):
        raise ctx.fail(node, f"a Slice with step {step} of symbolic axis {ax} ({dim}) from "
                             f"{start} to {end} is not supported (the whole axis reversed, "
                             "torch.flip, is); fix the dims with input_shapes=")
    idx = ctx.g.sub(ctx.g.sym_const(((dim - 1).to_dim(),), (), i64), ctx.g.arange(dim.to_dim()))
    return ctx.g.gather(x, idx, ax)


def _negative(bound: SymDim) -> bool:
    """Whether a slice bound is below 0 for every binding of its dims (dims are >= 1): a
    negative constant, or `-seq`-like terms (XLM slices `x[:, -seq:]`), which count from the
    end of the axis as ONNX's negative bounds do."""
    if bound.is_const:
        return bound.const < 0
    return all(c <= 0 for c in bound.terms.values())


@converter("Gather")
def gather(ctx, node):
    x = ctx.value(node, 0)
    idx = ctx.value(node, 1)
    return [ctx.g.gather(x, idx, node.attr("axis", 0))]


@converter("GatherElements")
def gather_elements(ctx, node):
    return [ctx.g.gather_elements(ctx.value(node, 0), ctx.value(node, 1), node.attr("axis", 0))]


@converter("Expand")
def expand(ctx, node):
    x = ctx.value(node, 0)
    target = [_dim(d) for d in ctx.ints(node, 1, "Expand's target shape")]
    src = list(ctx.dims(x))
    rank = max(len(src), len(target))
    src = [1] * (rank - len(src)) + src
    target = [1] * (rank - len(target)) + target
    out = []
    for i, (s, t) in enumerate(zip(src, target)):
        if t == 1 or s == t:
            out.append(s)
        elif s == 1:
            out.append(t)
        else:
            raise ctx.fail(node, f"cannot expand dim {i} of {tuple(ctx.dims(x))} to {t}")
    if tuple(out) == tuple(ctx.dims(x)):
        return [x]
    if rank > len(ctx.dims(x)):
        x = ctx.g.reshape(x, src)
    return [ctx.g.expand(x, out)]


@converter("Tile")
def tile(ctx, node):
    x = ctx.value(node, 0)
    reps = ctx.ints(node, 1, "Tile repeats")  # symbolic counts too (DeBERTa: batch * heads)
    dims = ctx.dims(x)
    if len(reps) != len(dims):
        raise ctx.fail(node, f"Tile repeats {[str(r) for r in reps]} do not match rank "
                             f"{len(dims)}")
    if all(isinstance(r, int) and r == 1 for r in reps):
        return [x]
    inter = [v for d in dims for v in (1, d)]
    wide = [v for r, d in zip(reps, dims) for v in (_dim(r), d)]
    out = [(SymDim.of(d) * SymDim.of(_dim(r))).to_dim() for r, d in zip(reps, dims)]
    return [ctx.g.reshape(ctx.g.expand(ctx.g.reshape(x, inter), wide), out)]


@converter("ConstantOfShape")
def constant_of_shape(ctx, node):
    dims = ctx.ints(node, 0, "ConstantOfShape's shape")
    if any(isinstance(d, int) and d < 0 for d in dims):
        raise ctx.fail(node, f"ConstantOfShape's shape {[str(d) for d in dims]} is negative")
    val = node.attr("value", None)
    if val is None:
        arr, dt = np.zeros(1, np.float32), f32
    elif not hasattr(val, "data_type"):
        raise ctx.fail(node, "ConstantOfShape's value attribute is not a tensor")
    else:
        arr, dt = tensor_array(val, f"{ctx.source}: node {node.label}: value")
        if arr.size != 1:
            raise ctx.fail(node, f"ConstantOfShape's value must hold one element, got "
                                 f"{arr.size}")
        arr = arr.reshape(-1)
    if all(isinstance(d, int) for d in dims):
        n = math.prod(dims)
        if n <= CONST_FOLD_ELEMENTS:
            return [Known(np.full(dims, arr[0], dtype=arr.dtype), dt)]
    scalar = ctx.g.constant(arr.reshape(()), dt)
    return [ctx.g.expand(scalar, [_dim(d) for d in dims])]


@converter("EyeLike")
def eye_like(ctx, node):
    """Ones on diagonal `k` (above the main one for k > 0) of a matrix shaped like the input,
    zeros elsewhere, in `dtype` (default: the input's). Only the input's shape is read: static
    dims give a constant, symbolic ones a compare of two ranges."""
    dims = ctx.dims(ctx.value(node, 0)) if ctx.known(node, 0) is None else \
        ctx.known(node, 0).array.shape
    if len(dims) != 2:
        raise ctx.fail(node, f"EyeLike needs a rank-2 input, got dims {tuple(dims)}")
    k = int(node.attr("k", 0))
    if "dtype" in node.attrs:
        dt = onnx_dtype(node.attrs["dtype"])
    else:
        dt = ctx.known(node, 0).dtype if ctx.known(node, 0) is not None else \
            ctx.dtype(ctx.value(node, 0))
    rows, cols = dims
    if isinstance(rows, int) and isinstance(cols, int):
        eye = np.eye(rows, cols, k, dtype=dt.np)
        return [Known(eye, dt) if eye.size <= CONST_FOLD_ELEMENTS else ctx.g.constant(eye, dt)]
    g = ctx.g
    r = g.reshape(g.arange(rows, k, 1, i64), (rows, 1))
    c = g.reshape(g.arange(cols, 0, 1, i64), (1, cols))
    return [g.cast(g.eq(r, c), dt)]


@converter("Range")
def range_(ctx, node):
    """Static bounds fold to a constant; with a symbolic bound the element count
    ceil((limit - start) / delta) must be a dim (`_range_length`): integral delta, any start.
    Float Ranges (torch.arange(seq, dtype=float32) for position embeddings) count the same."""
    start = ctx.scalar(node, 0, "Range start")
    limit = ctx.scalar(node, 1, "Range limit")
    delta = ctx.scalar(node, 2, "Range delta")
    k = ctx.known(node, 0) or ctx.known(node, 1)
    dt = k.dtype if k is not None else i64
    if not any(isinstance(v, SymDim) for v in (start, limit, delta)):
        n = max(int(np.ceil((limit - start) / delta)), 0)
        if n <= CONST_FOLD_ELEMENTS:
            return [Known((start + np.arange(n, dtype=np.float64) * delta).astype(dt.np), dt)]
        return [ctx.g.arange(n, start, delta, dt)]
    length = _range_length(start, limit, delta)
    if length is None:
        raise ctx.fail(node, f"Range({start}, {limit}, {delta}): with a symbolic bound braze "
                             "needs the element count ceil((limit - start) / delta) as a dim, "
                             "which takes a whole-number delta (and a count that rounds "
                             "exactly); write the range with an integer step and scale it "
                             "(arange(n) * step), or import with that dim static "
                             "(input_shapes=)")
    if isinstance(start, SymDim):  # Funnel's Range(-2*seq, 2*seq): from 0, shifted at run time
        base = ctx.g.arange(length.to_dim(), 0, delta, dt)
        return [ctx.g.add(base, ctx.g.sym_const([start.to_dim()], (), dt))]
    return [ctx.g.arange(length.to_dim(), start, delta, dt)]


def _range_length(start, limit, delta) -> SymDim | None:
    """ceil((limit - start) / delta) as a dim when it is one for every binding, else None.

    The bounds are ints, SymDims or floats; delta must be a nonzero constant integer. A
    constant part c of (limit - start) * sign(delta) may be fractional: for an integer x and
    0 <= f < 1, ceil((x - f) / d) == ceil(x / d), so c rounds up first. ceil(x / d) is then
    (x + r) // d for the r in [0, d) that makes the division exact for every binding."""
    if isinstance(delta, SymDim) or delta == 0 or float(delta) != int(delta):
        return None
    sign, d = (1 if delta > 0 else -1), abs(int(delta))
    sym, const = SymDim.of(0), 0.0
    for v, s in ((limit, sign), (start, -sign)):
        if isinstance(v, SymDim):
            sym = sym + v * s
        else:
            const += float(v) * s
    x = sym + math.ceil(const)
    for r in range(d):
        try:
            return (x + r) // d
        except ValueError:
            continue
    return None


@converter("Trilu")
def trilu(ctx, node):
    k = int(ctx.scalar(node, 1, "Trilu k", default=0)) if ctx.has(node, 1) else 0
    return [ctx.g.trilu(ctx.value(node, 0), bool(node.attr("upper", 1)), k)]


@converter("GatherND")
def gather_nd(ctx, node):
    """Index tuples in the last axis of `indices` pick slices of `data`: written as one flat
    gather over the indexed dims (linear index = sum of index * stride; strides may be
    symbolic). With `batch_dims` b, the first b dims of data and indices pair up: the batch
    position joins the linear index."""
    g = ctx.g
    data, idx = ctx.value(node, 0), ctx.value(node, 1)
    dims, idims = ctx.dims(data), ctx.dims(idx)
    b = node.attr("batch_dims", 0)
    if not idims or not isinstance(b, int) or not 0 <= b < len(idims) or b > len(dims):
        raise ctx.fail(node, f"GatherND batch_dims={b} does not fit indices of rank "
                             f"{len(idims)} and data of rank {len(dims)}")
    if tuple(dims[:b]) != tuple(idims[:b]):
        raise ctx.fail(node, f"GatherND batch dims of data {tuple(dims[:b])} and indices "
                             f"{tuple(idims[:b])} differ")
    if not ctx.dtype(idx).is_int:
        raise ctx.fail(node, f"GatherND indices must be integers, got {ctx.dtype(idx)}")
    k = idims[-1]
    if not isinstance(k, int) or not 1 <= k <= len(dims) - b:
        raise ctx.fail(node, f"GatherND index tuples of length {k} do not fit data rank "
                             f"{len(dims)} with {b} batch dims")
    lead = idims[:-1]
    linear = None
    stride = SymDim.of(1)
    for i in reversed(range(k)):
        part = g.reshape(g.narrow(idx, -1, i, 1), lead)
        size = g.sym_const((_dim(SymDim.of(dims[b + i])),), (), ctx.dtype(idx))
        part = g.where(g.lt(part, ctx.const_like(0, part)), g.add(part, size), part)
        if stride != 1:
            part = g.mul(part, g.sym_const((stride.to_dim(),), (), ctx.dtype(idx)))
        linear = part if linear is None else g.add(linear, part)
        stride = stride * SymDim.of(dims[b + i])
    if b:
        n_batch = SymDim.of(1)
        for d in dims[:b]:
            n_batch = n_batch * SymDim.of(d)
        pos = g.arange(n_batch.to_dim(), 0, 1, ctx.dtype(idx))
        pos = g.reshape(pos, tuple(dims[:b]) + (1,) * (len(lead) - b))
        if stride != 1:
            pos = g.mul(pos, g.sym_const((stride.to_dim(),), (), ctx.dtype(idx)))
        linear = g.add(linear, pos)
        stride = stride * n_batch
    flat = g.reshape(data, (stride.to_dim(),) + tuple(dims[b + k:]))
    return [g.gather(flat, linear, 0)]


# -- DepthToSpace / SpaceToDepth: a reshape, a 6-D transpose, a reshape ---------------------------
def _blocks(ctx, node, x) -> tuple[int, tuple]:
    b = int(node.attr("blocksize", 0))
    dims = ctx.dims(x)
    if b < 1:
        raise ctx.fail(node, f"{node.op_type} needs a positive blocksize, got {b}")
    if len(dims) != 4:
        raise ctx.fail(node, f"{node.op_type} needs a rank-4 [N, C, H, W] input, got "
                             f"{tuple(dims)}")
    return b, dims


@converter("DepthToSpace")
def depth_to_space(ctx, node):
    """[N, C, H, W] -> [N, C / b^2, H * b, W * b]. DCR (the default) reads the channels as
    [b, b, C / b^2], CRD as [C / b^2, b, b]."""
    x = ctx.value(node, 0)
    b, (n, c, h, w) = _blocks(ctx, node, x)
    mode = node.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise ctx.fail(node, f"DepthToSpace mode={mode!r} is not defined (DCR or CRD)")
    if not isinstance(c, int) or c % (b * b):
        raise ctx.fail(node, f"DepthToSpace needs static channels divisible by blocksize^2 = "
                             f"{b * b}, got {c}")
    g, cb = ctx.g, c // (b * b)
    if mode == "DCR":
        y = g.transpose(g.reshape(x, (n, b, b, cb, h, w)), (0, 3, 4, 1, 5, 2))
    else:
        y = g.transpose(g.reshape(x, (n, cb, b, b, h, w)), (0, 1, 4, 2, 5, 3))
    return [g.reshape(y, (n, cb, _dim(SymDim.of(h) * b), _dim(SymDim.of(w) * b)))]


@converter("SpaceToDepth")
def space_to_depth(ctx, node):
    """[N, C, H, W] -> [N, C * b^2, H / b, W / b], the block offsets ahead of the channels (the
    inverse of DepthToSpace's DCR mode)."""
    x = ctx.value(node, 0)
    b, (n, c, h, w) = _blocks(ctx, node, x)
    try:
        hb, wb = (_dim(SymDim.of(d) // b) for d in (h, w))
    except ValueError:
        hb = wb = None
    if hb is None or any(isinstance(d, int) and d % b for d in (h, w)):
        raise ctx.fail(node, f"SpaceToDepth needs H and W divisible by blocksize {b}, got "
                             f"{h} x {w}; pass input_shapes= to import_onnx to fix them")
    g = ctx.g
    y = g.transpose(g.reshape(x, (n, c, hb, b, wb, b)), (0, 3, 5, 1, 2, 4))
    return [g.reshape(y, (n, _dim(SymDim.of(c) * (b * b)), hb, wb))]
