"""Shape ATen ops: view / reshape, permute / transpose, expand, (un)squeeze, flatten, slice,
select, narrow, unfold, cat / stack, split / chunk / unbind, repeat, flip, roll, padding, and slice
assignment (slice_scatter and copy: the untouched parts concatenated around the source).
Targets hold SymDims (folded size arithmetic), so symbolic dims survive; a slice whose start
depends on the sizes becomes a dynamic_narrow (bounds-checked when the dims bind), a strided
one a gather of a range."""
from __future__ import annotations

from ....ir.dtypes import i64
from ....ir.ops.shape import PadMode
from ....ir.symbolic import SymDim
from ..context import Call, TorchContext, converter
from ..symbolic import decide_lt

_BIG = 2 ** 62  # slice ends at or beyond this mean "to the end" (torch writes INT64_MAX)


def dims_arg(ctx: TorchContext, sizes) -> tuple:
    """A size list argument as braze dims (-1 kept)."""
    if isinstance(sizes, (int, SymDim)):
        sizes = [sizes]
    out = []
    for s in sizes:
        if isinstance(s, int) and not isinstance(s, bool):
            out.append(s)
        else:
            out.append(ctx.dim(s))
    return tuple(out)


@converter("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
           "aten.view_copy.default", "aten._reshape_alias.default")
def view(ctx, c: Call):
    x = ctx.value(c["self"])
    dims = dims_arg(ctx, c["size"])
    if dims == ctx.dims(x):
        return x
    return ctx.g.reshape(x, dims)


@converter("aten.permute.default", "aten.permute_copy.default")
def permute(ctx, c):
    x = ctx.value(c["self"])
    rank = ctx.rank(x)
    perm = tuple(ctx.axis(a, rank) for a in ctx.static_ints(c["dims"], "permutation"))
    return x if perm == tuple(range(rank)) else ctx.g.transpose(x, perm)


@converter("aten.transpose.int", "aten.transpose_copy.int")
def transpose(ctx, c):
    x = ctx.value(c["self"])
    rank = ctx.rank(x)
    a, b = (ctx.axis(ctx.static_int(c[k], "dim"), rank) for k in ("dim0", "dim1"))
    if a == b:
        return x
    perm = list(range(rank))
    perm[a], perm[b] = perm[b], perm[a]
    return ctx.g.transpose(x, tuple(perm))


@converter("aten.t.default", "aten.numpy_T.default")
def t(ctx, c):
    x = ctx.value(c["self"])
    rank = ctx.rank(x)
    return x if rank < 2 else ctx.g.transpose(x, tuple(reversed(range(rank))))


@converter("aten.expand.default", "aten.expand_copy.default")
def expand(ctx, c):
    x = ctx.value(c["self"])
    dims = dims_arg(ctx, c["size"])
    src = ctx.dims(x)
    off = len(dims) - len(src)
    full = tuple(src[i - off] if d == -1 else d for i, d in enumerate(dims))
    return x if full == src else ctx.g.expand(x, full)


@converter("aten.expand_as.default")
def expand_as(ctx, c):
    x = ctx.value(c["self"])
    dims = ctx.dims(ctx.value(c["other"]))
    return x if dims == ctx.dims(x) else ctx.g.expand(x, dims)


@converter("aten.unsqueeze.default", "aten.unsqueeze_copy.default")
def unsqueeze(ctx, c):
    x = ctx.value(c["self"])
    return ctx.g.unsqueeze(x, ctx.axis(ctx.static_int(c["dim"], "dim"), ctx.rank(x) + 1))


@converter("aten.squeeze.default", "aten.squeeze.dim", "aten.squeeze.dims",
           "aten.squeeze_copy.dim", "aten.squeeze_copy.dims", "aten.flatten.using_ints",
           "aten.unflatten.int")
def to_out_shape(ctx, c):
    """Ops that only regroup dims: a reshape to the shape torch recorded."""
    x = ctx.value(c["self"])
    dims = ctx.out_dims()
    return x if dims == ctx.dims(x) else ctx.g.reshape(x, dims)


def _norm_bound(ctx, b, size, default):
    """A slice bound as a SymDim in [0, size] (Python semantics; symbols are >= 2)."""
    if b is None:
        return SymDim.of(default)
    if isinstance(b, int) and b >= _BIG:
        return SymDim.of(size)
    if isinstance(b, int) and b <= -_BIG:
        return SymDim.of(0)
    s = ctx.sym(b)
    if all(c <= 0 for c in s.terms.values()) and s != 0:  # -1, -seq: from the end
        s = SymDim.of(size) + s
    if s.is_const and s.const < 0:
        return SymDim.of(0)
    if decide_lt(SymDim.of(size), s):
        return SymDim.of(size)
    return s  # symbolic and undecided: a dynamic_narrow checks 0 <= s at run time


def take_range(ctx, x, axis: int, start, length, step: int = 1):
    """Elements start, start + step, ... (`length` of them) along `axis`: a narrow when step is
    1 (a dynamic_narrow, bounds-checked at run time, when start is symbolic), a strided slice on
    a static axis, else a gather of a range from a narrow that checks the span's bounds."""
    g = ctx.g
    start, length = SymDim.of(start), SymDim.of(length)
    size = ctx.dims(x)[axis]
    if step == 1:
        if start == 0 and SymDim.of(size) == length:
            return x
        return g.narrow(x, axis, start.to_dim(), length.to_dim())
    if start.is_const and isinstance(size, int) and length.is_const:
        stop = start.const + step * length.const
        return g.slice(x, axis, start.const, stop if stop >= 0 else -size - 1, step)
    if step > 0 and not start.is_const:  # negative indices would wrap: cut the span first
        x, start = g.narrow(x, axis, start.to_dim(), (step * (length - 1) + 1).to_dim()), 0
    idx = g.arange(length.to_dim(), 0, step, i64)
    if start != 0:
        idx = g.add(idx, ctx.value(start, i64))
    return g.gather(x, idx, axis)


@converter("aten.slice.Tensor", "aten.slice_copy.Tensor")
def slice_(ctx, c):
    x = ctx.value(c["self"])
    rank = ctx.rank(x)
    axis = ctx.axis(ctx.static_int(c.get("dim", 0), "dim"), rank)
    step = ctx.static_int(c.get("step", 1), "slice step")
    size = ctx.dims(x)[axis]
    start = _norm_bound(ctx, c.args.get("start"), size, 0)
    length = ctx.out_dims()[axis]
    end = _norm_bound(ctx, c.args.get("end"), size, size)
    if step == 1 and not start.is_const and SymDim.of(length) != end - start:
        raise ctx.fail(
            f"a slice of axis {axis} (size {size}) from {start.to_dim()} keeps {length} "
            "elements: torch clamped the start at the example size, and braze does not clamp "
            "a symbolic bound at run time (a sliding-window KV cache keeping its last keys "
            "does this when the example cache is shorter than the window); export with an "
            "example at least as long as what the slice keeps, or import that dim static")
    _exclude_other_elements(ctx, c.args.get("start"), c.args.get("end"), size, start, length,
                            step)
    return take_range(ctx, x, axis, start, length, step)


def _exclude_other_elements(ctx, raw_start, raw_end, size, start: SymDim, length, step: int):
    """Refuse the sizes 0 / 1 (ctx.exclude_small) where the slice taken for sizes >= 2 (an
    end `2*seq - 2` clamped to the axis end seq) is in range but keeps other elements than
    Python's `[start:end:step]`; out-of-range bounds are refused by the narrow at run time."""
    bounds = [SymDim.of(b) if b is not None and not (isinstance(b, int) and abs(b) >= _BIG)
              else b for b in (raw_start, raw_end)]
    dims = [SymDim.of(size), start, SymDim.of(length)]
    syms = set().union(*(d.symbols for d in (*dims, *bounds) if isinstance(d, SymDim)))

    def holds(env):
        n, first, count = (d.evaluate(env) for d in dims)
        if count > 0 and not (0 <= first and first + step * (count - 1) < n):
            return True
        lo, hi = (b.evaluate(env) if isinstance(b, SymDim) else b for b in bounds)
        return list(range(n)[lo:hi:step]) == list(range(first, first + step * count, step))

    ctx.exclude_small(syms, holds, "the slice was decided for {sym} >= 2 and keeps other "
                                   "elements at {sym} = {value}; feed another size")


@converter("aten.narrow.default", "aten.narrow_copy.default")
def narrow(ctx, c):
    x = ctx.value(c["self"])
    axis = ctx.axis(ctx.static_int(c["dim"], "dim"), ctx.rank(x))
    start = _norm_bound(ctx, c["start"], ctx.dims(x)[axis], 0)
    return take_range(ctx, x, axis, start, ctx.sym(c["length"]))


@converter("aten.select.int", "aten.select_copy.int")
def select(ctx, c):
    x = ctx.value(c["self"])
    dims = ctx.dims(x)
    axis = ctx.axis(ctx.static_int(c["dim"], "dim"), len(dims))
    index = ctx.sym(c["index"])
    if index.is_const and index.const < 0:
        index = SymDim.of(dims[axis]) + index.const
    one = take_range(ctx, x, axis, index, 1)
    return ctx.g.reshape(one, dims[:axis] + dims[axis + 1:])


@converter("aten.cat.default", "aten.concat.default")
def cat(ctx, c):
    dt = ctx.out_dtype()
    xs = [ctx.value(t, dt) for t in c["tensors"]]
    xs = [v for v in xs if not (ctx.rank(v) == 1 and ctx.dims(v)[0] == 0)] or xs[:1]
    if len(xs) == 1:
        return xs[0]
    return ctx.g.concat(xs, ctx.axis(ctx.static_int(c.get("dim", 0), "dim"), ctx.rank(xs[0])))


@converter("aten.stack.default")
def stack(ctx, c):
    dt = ctx.out_dtype()
    xs = [ctx.value(t, dt) for t in c["tensors"]]
    axis = ctx.axis(ctx.static_int(c.get("dim", 0), "dim"), ctx.rank(xs[0]) + 1)
    parts = [ctx.g.unsqueeze(v, axis) for v in xs]
    return parts[0] if len(parts) == 1 else ctx.g.concat(parts, axis)


def _pieces(ctx, x, axis: int, sizes: list) -> list:
    start, out = SymDim.of(0), []
    for s in sizes:
        out.append(take_range(ctx, x, axis, start, s))
        start = start + s
    return out


@converter("aten.split_with_sizes.default", "aten.split.Tensor", "aten.split.sizes",
           "aten.chunk.default", "aten.tensor_split.sections", "aten.unsafe_split.Tensor",
           "aten.split_with_sizes_copy.default")
def split(ctx, c):
    x = ctx.value(c["self"])
    axis = ctx.axis(ctx.static_int(c.get("dim", 0), "dim"), ctx.rank(x))
    sizes = [ctx.out_dims(i)[axis] for i in range(len(c.node.meta["val"]))]
    if all(isinstance(s, int) for s in sizes) and isinstance(ctx.dims(x)[axis], int) and \
            len(sizes) > 1:
        return tuple(ctx.g.split(x, axis, sizes))
    return tuple(_pieces(ctx, x, axis, sizes))


@converter("aten.unbind.int", "aten.unbind_copy.int")
def unbind(ctx, c):
    x = ctx.value(c["self"])
    dims = ctx.dims(x)
    axis = ctx.axis(ctx.static_int(c.get("dim", 0), "dim"), len(dims))
    n = ctx.static_int(dims[axis], "the unbound dim")
    rest = dims[:axis] + dims[axis + 1:]
    return tuple(ctx.g.reshape(p, rest) for p in _pieces(ctx, x, axis, [1] * n))


@converter("aten.repeat.default")
def repeat(ctx, c):
    x = ctx.value(c["self"])
    reps = dims_arg(ctx, c["repeats"])
    dims = (1,) * (len(reps) - ctx.rank(x)) + ctx.dims(x)
    g = ctx.g
    if len(dims) != ctx.rank(x):
        x = g.reshape(x, dims)
    inter = []
    for d in dims:
        inter += [1, d]
    wide = []
    for r, d in zip(reps, dims):
        wide += [r, d]
    y = g.expand(g.reshape(x, tuple(inter)), tuple(wide))
    return g.reshape(y, ctx.out_dims())


@converter("aten.unfold.default", "aten.unfold_copy.default")
def unfold(ctx, c):
    """x.unfold(dim, size, step): the windows of `size` elements every `step` along dim take
    dim's place, a window's elements a new last axis (PatchTST's patches): one gather of the
    [windows, size] index start + offset, then that axis moved to the end."""
    x = ctx.value(c["self"])
    rank = ctx.rank(x)
    if rank == 0:
        raise ctx.fail("unfold of a 0-d tensor: give it at least one dim")
    axis = ctx.axis(ctx.static_int(c["dimension"], "unfold dim"), rank)
    size = ctx.static_int(c["size"], "unfold size")
    step = ctx.static_int(c["step"], "unfold step")
    windows = SymDim.of(ctx.out_dims()[axis]).to_dim()
    g = ctx.g
    starts = g.reshape(g.arange(windows, 0, step, i64), (windows, 1))
    offsets = g.reshape(g.arange(size, 0, 1, i64), (1, size))
    y = g.gather(x, g.add(starts, offsets), axis)  # x[:axis] + (windows, size) + x[axis + 1:]
    if axis < rank - 1:
        y = g.transpose(y, list(range(axis + 1)) + list(range(axis + 2, rank + 1)) + [axis + 1])
    return y


@converter("aten.flip.default")
def flip(ctx, c):
    x = ctx.value(c["self"])
    for a in ctx.static_ints(c["dims"], "flip dims"):
        axis = ctx.axis(a, ctx.rank(x))
        size = ctx.dims(x)[axis]
        if isinstance(size, int):
            x = ctx.g.slice(x, axis, size - 1, -size - 1, -1)
        else:
            idx = ctx.g.sub(ctx.value(SymDim.of(size) - 1, i64), ctx.g.arange(size))
            x = ctx.g.gather(x, idx, axis)
    return x


@converter("aten.roll.default")
def roll(ctx, c):
    x = ctx.value(c["self"])
    shifts = ctx.static_ints(c["shifts"], "roll shifts")
    dims = c.get("dims") or []
    if not dims:
        flat = ctx.g.reshape(x, (-1,))
        return ctx.g.reshape(_roll(ctx, flat, 0, shifts[0]), ctx.dims(x))
    for s, a in zip(shifts, ctx.static_ints(dims, "roll dims")):
        x = _roll(ctx, x, ctx.axis(a, ctx.rank(x)), s)
    return x


def _roll(ctx, x, axis: int, shift: int):
    size = ctx.static_int(ctx.dims(x)[axis], "the rolled dim")
    s = shift % size if size else 0
    if s == 0:
        return x
    g = ctx.g
    return g.concat([g.narrow(x, axis, size - s, s), g.narrow(x, axis, 0, size - s)], axis)


def _pads(ctx, x, pad: list[int]) -> list[tuple[int, int]]:
    """torch's pad list (last dim first: left, right, top, bottom, ...) as per-axis pairs."""
    rank = ctx.rank(x)
    if len(pad) % 2 or len(pad) // 2 > rank:
        raise ctx.fail(f"pad {pad} must hold (before, after) pairs for at most {rank} dims")
    pairs = [(0, 0)] * rank
    for i in range(len(pad) // 2):
        pairs[rank - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return pairs


def _apply_pads(ctx, x, pairs, value: float = 0.0, mode=PadMode.CONSTANT):
    g = ctx.g
    for axis, (lo, hi) in enumerate(pairs):  # negative pads crop
        if lo < 0 or hi < 0:
            size = SymDim.of(ctx.dims(x)[axis])
            start = -lo if lo < 0 else 0
            length = size - start - (-hi if hi < 0 else 0)
            x = take_range(ctx, x, axis, start, length)
    pos = [(max(lo, 0), max(hi, 0)) for lo, hi in pairs]
    if any(lo or hi for lo, hi in pos):
        x = g.pad(x, pos, value, mode)
    return x


@converter("aten.constant_pad_nd.default")
def constant_pad(ctx, c):
    x = ctx.value(c["self"])
    pairs = _pads(ctx, x, ctx.static_ints(c["pad"], "pad"))
    return _apply_pads(ctx, x, pairs, float(c.get("value", 0.0)))


_PAD_MODES = {"aten.reflection_pad1d.default": PadMode.REFLECT,
              "aten.reflection_pad2d.default": PadMode.REFLECT,
              "aten.reflection_pad3d.default": PadMode.REFLECT,
              "aten.replication_pad1d.default": PadMode.EDGE,
              "aten.replication_pad2d.default": PadMode.EDGE,
              "aten.replication_pad3d.default": PadMode.EDGE}


@converter(*_PAD_MODES)
def mode_pad(ctx, c):
    x = ctx.value(c["self"])
    pad = ctx.static_ints(c["padding"], "padding")
    if any(p < 0 for p in pad):
        raise ctx.fail(f"negative {_PAD_MODES[c.key].value} padding {pad} is not supported")
    return ctx.g.pad(x, _pads(ctx, x, pad), 0.0, _PAD_MODES[c.key])


@converter("aten.pad.default")
def pad(ctx, c):
    x = ctx.value(c["self"])
    pairs = _pads(ctx, x, ctx.static_ints(c["pad"], "pad"))
    mode = c.get("mode", "constant")
    modes = {"constant": PadMode.CONSTANT, "reflect": PadMode.REFLECT,
             "replicate": PadMode.EDGE}
    if mode not in modes:
        raise ctx.fail(f"pad mode {mode!r} is not supported (constant, reflect, replicate)")
    return _apply_pads(ctx, x, pairs, float(c.get("value", 0.0)), modes[mode])


def _write_range(ctx, x, src, axis: int, start):
    """`x` with the elements start .. start + len(src) along `axis` replaced by `src`: a concat
    of the parts of `x` before and after around `src` (slice assignment, step 1)."""
    size = SymDim.of(ctx.dims(x)[axis])
    length = SymDim.of(ctx.dims(src)[axis])
    end = start + length
    parts = []
    if start != 0:
        parts.append(take_range(ctx, x, axis, 0, start))
    parts.append(src)
    if end != size:
        parts.append(take_range(ctx, x, axis, end, size - end))
    return parts[0] if len(parts) == 1 else ctx.g.concat(parts, axis)


@converter("aten.slice_scatter.default")
def slice_scatter(ctx, c):
    """`x[..., start:end, ...] = src` along `dim` (what `t[1:, 1:] = v` becomes)."""
    x = ctx.value(c["self"])
    src = ctx.value(c["src"], ctx.dtype(x))
    axis = ctx.axis(ctx.static_int(c.get("dim", 0), "dim"), ctx.rank(x))
    if ctx.static_int(c.get("step", 1), "slice step") != 1:
        raise ctx.fail("slice_scatter with a step other than 1 is not supported; write the "
                       "strided update as a Where over a mask")
    start = _norm_bound(ctx, c.args.get("start"), ctx.dims(x)[axis], 0)
    return _write_range(ctx, x, src, axis, start)


@converter("aten.copy.default")
def copy(ctx, c):
    """`copy(self, src)`: src broadcast to self's shape, in self's dtype."""
    x = ctx.value(c["self"])
    src = ctx.value(c["src"], ctx.dtype(x))
    return src if ctx.dims(src) == ctx.dims(x) else ctx.g.expand(src, ctx.dims(x))
