"""ONNX convolutional-network ops: Conv and ConvTranspose (2-D, and 1-D through a unit H axis),
MaxPool / AveragePool, GlobalAveragePool / GlobalMaxPool and Pad (Resize / Upsample are in
resize.py, the normalizations in norm.py).

auto_pad, ceil_mode and ConvTranspose's output_shape become explicit padding here, computed as
ONNX Runtime does (a ceil-mode window that would start in the right padding is dropped; SAME_UPPER
puts the odd padding element at the end). Strided windows over dynamic spatial dims need them
declared multiples of the stride (`input_shapes={"x": (1, 3, "32*h", "32*w")}`); anything else
names the fix (`input_shapes=`) in its error."""
from __future__ import annotations

from ....errors import ShapeError
from ....ir.ops.io import Param
from ....ir.ops.reduce import ReduceFn
from ....ir.ops.shape import PadMode
from ....ir.symbolic import SymDim
from ..context import ImportContext, NodeView, converter

_AUTO_PAD = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


# -- shared helpers -----------------------------------------------------------------------------
def input_shapes_hint(ctx: ImportContext) -> str:
    """How to fix the dynamic dims of the graph's inputs, with an example per input: static
    sizes, or sizes kept dynamic as multiples of the network's stride."""
    fixed, multiples = [], []
    for n in ctx.g.inputs:
        dims = n.op.shape.dims
        if all(isinstance(d, int) for d in dims):
            continue
        fixed.append(f'"{n.op.name}": {_example(dims, [1] + [224] * 4)}')
        multiples.append(f'"{n.op.name}": {_example(dims, _multiple_dims(len(dims)))}')
    fixed_text = "{" + ", ".join(fixed or ['"x": (1, 3, 224, 224)']) + "}"
    multiple_text = "{" + ", ".join(multiples or ['"x": ("batch", 3, "32*h", "32*w")']) + "}"
    return (f"pass input_shapes={fixed_text} (with your image size) to import_onnx to fix the "
            f"spatial dims, or keep them dynamic as multiples of the network's total stride: "
            f"input_shapes={multiple_text}")


def _multiple_dims(rank: int) -> list:
    """Example dims of a rank-`rank` input: a batch, channels when there is room for them,
    and up to three trailing spatial sizes as multiples ([N, L] audio is ("batch", "32*w"))."""
    spatial = ["32*d", "32*h", "32*w"][-min(3, max(rank - 2, 1)):]
    return (["batch"] + ["c"] * (rank - 1 - len(spatial)) + spatial)[:rank]


def _example(dims, values) -> str:
    """An input_shapes tuple: static dims kept, symbolic ones replaced by values[axis]."""
    items = [d if isinstance(d, int) else values[min(i, len(values) - 1)]
             for i, d in enumerate(dims)]
    return str(tuple(items)).replace("'", '"')


def _spatial_rank(ctx, node, x) -> int:
    rank = len(ctx.dims(x))
    if rank not in (3, 4):
        raise ctx.fail(node, f"{node.op_type} of a rank-{rank} input ({rank - 2}-D) is not "
                             "supported; braze imports 1-D and 2-D windows ([N, C, L] or "
                             "[N, C, H, W])")
    return rank - 2


def _ints_attr(ctx, node, key: str, n: int, default: int) -> list[int]:
    vals = list(node.attr(key, [default] * n))
    if len(vals) != n or not all(isinstance(v, int) for v in vals):
        raise ctx.fail(node, f"attribute {key}={vals} must hold {n} ints (one per spatial axis)")
    return vals


def _static_spatial(ctx, node, dims, why: str) -> list[int]:
    if any(not isinstance(d, int) for d in dims):
        raise ctx.fail(node, f"{why} needs static spatial dims, got {tuple(dims)}; "
                             f"{input_shapes_hint(ctx)}")
    return list(dims)


def _residue_sizes(ctx, node, sizes, strides, why: str) -> list[int]:
    """Stand-ins for padding rules that depend on a size only modulo its stride (SAME pads,
    ceil_mode): a symbolic size declared a multiple of the stride ("32*h", any "32*h+r")
    becomes a large int with the same remainder; other symbolic sizes are an import error."""
    out = []
    for size, s in zip(sizes, strides):
        split = None if isinstance(size, int) else SymDim.of(size).divmod_int(s)
        if isinstance(size, int):
            out.append(size)
        elif split is None:
            raise ctx.fail(node, f"{why} needs each spatial dim static or a multiple of the "
                                 f"stride {s}, got {size!r}; {input_shapes_hint(ctx)}")
        else:
            out.append(split[1] + s * (1 << 20))
    return out


def _same_pads(ctx, node, sizes, kernel, strides, dilations, upper: bool):
    """SAME_UPPER / SAME_LOWER: output ceil(in / stride), padding split with the odd element
    at the end (upper) or the start (lower)."""
    pairs = []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        span = d * (k - 1) + 1
        if s == 1:
            total = span - 1
        else:
            (size,) = _residue_sizes(ctx, node, [size], [s], f"auto_pad="
                                                             f"{node.attr('auto_pad')} with "
                                                             f"stride {s}")
            total = max(0, (-(-size // s) - 1) * s + span - size)
        lo = total // 2 if upper else total - total // 2
        pairs.append((lo, total - lo))
    return pairs


def _window_pads(ctx, node, sizes, kernel, strides, dilations) -> list[tuple[int, int]]:
    """(before, after) padding per spatial axis from auto_pad / pads."""
    n = len(kernel)
    auto = node.attr("auto_pad", "NOTSET")
    if auto not in _AUTO_PAD:
        raise ctx.fail(node, f"unknown auto_pad {auto!r} (one of {', '.join(_AUTO_PAD)})")
    if auto == "VALID":
        return [(0, 0)] * n
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        return _same_pads(ctx, node, sizes, kernel, strides, dilations, auto == "SAME_UPPER")
    pads = _ints_attr(ctx, node, "pads", 2 * n, 0)
    if any(p < 0 for p in pads):
        raise ctx.fail(node, f"negative pads {pads} are not supported")
    return [(pads[i], pads[i + n]) for i in range(n)]


def _ceil_extra(ctx, node, sizes, kernel, strides, pairs) -> list[tuple[int, int, int]]:
    """ceil_mode=1: (before, after, extra) per axis, `extra` end padding making room for the
    last partial window (dropped when it would start in the end padding, as ONNX Runtime
    rules)."""
    out = []
    sizes = _residue_sizes(ctx, node, sizes, strides, "ceil_mode=1")
    for size, k, s, (lo, hi) in zip(sizes, kernel, strides, pairs):
        span = size + lo + hi - k
        n_out = -(-span // s) + 1
        if (n_out - 1) * s >= size + lo:
            n_out -= 1
        out.append((lo, hi, max(0, (n_out - 1) * s + k - (size + lo + hi))))
    return out


def _windowed(ctx, node, x, build):
    """`build()`; a shape error on symbolic spatial dims becomes an actionable import error."""
    try:
        return build()
    except ShapeError as e:
        if any(not isinstance(d, int) for d in ctx.dims(x)[2:]):
            raise ctx.fail(node, f"{e}; {input_shapes_hint(ctx)}") from None
        raise


def _as_image(ctx, x):
    """[N, C, L] -> [N, C, 1, L] (1-D ops run as 2-D with a unit H axis)."""
    n, c, length = ctx.dims(x)
    return ctx.g.reshape(x, (n, c, 1, length))


def _from_image(ctx, y):
    n, c, _, length = ctx.dims(y)
    return ctx.g.reshape(y, (n, c, length))


def _unit_h_weight(ctx, w):
    """A 1-D conv weight [O, C, k] as [O, C, 1, k]: a new param holding the reshaped stored
    value when `w` is a stored weight (so folds and fusions still see a param), else a
    reshape node."""
    g = ctx.g
    node = g.node(w)
    o, c, k = ctx.dims(w)
    if isinstance(node.op, Param) and node.op.name in g.weights:
        name = f"{node.op.name}.2d"
        try:
            return g.node_by_name(name).value
        except Exception:  # noqa: BLE001 - not made yet
            arr = g.weights[node.op.name].reshape(o, c, 1, k)
            with g.provenance_scope(node.provenance):
                return g.param(name, node.op.shape.with_dims(arr.shape), value=arr)
    return g.reshape(w, (o, c, 1, k))


def _to2d(vals: list[int], unit: int) -> tuple[int, int]:
    return (unit, vals[0]) if len(vals) == 1 else (vals[0], vals[1])


def _pads4(pairs) -> tuple[int, int, int, int]:
    if len(pairs) == 1:
        return (0, pairs[0][0], 0, pairs[0][1])
    return (pairs[0][0], pairs[1][0], pairs[0][1], pairs[1][1])


# -- convolution --------------------------------------------------------------------------------
@converter("Conv")
def conv(ctx: ImportContext, node: NodeView):
    return [convolve(ctx, node, ctx.value(node, 0), ctx.value(node, 1), ctx.opt_value(node, 2))]


def convolve(ctx: ImportContext, node: NodeView, x, w, b):
    """`node`'s convolution (its Conv attributes: pads / auto_pad, strides, dilations, group)
    of the braze values x, w and optional bias b; ConvInteger and QLinearConv reuse it."""
    g = ctx.g
    n = _spatial_rank(ctx, node, x)
    wdims = ctx.dims(w)
    if len(wdims) != n + 2:
        raise ctx.fail(node, f"weight {wdims} does not match a {n}-D conv of input "
                             f"{ctx.dims(x)}")
    kernel = list(wdims[2:])
    if "kernel_shape" in node.attrs and list(node.attrs["kernel_shape"]) != kernel:
        raise ctx.fail(node, f"kernel_shape {node.attrs['kernel_shape']} does not match the "
                             f"weight {wdims}")
    strides = _ints_attr(ctx, node, "strides", n, 1)
    dilations = _ints_attr(ctx, node, "dilations", n, 1)
    pairs = _window_pads(ctx, node, ctx.dims(x)[2:], kernel, strides, dilations)
    group = int(node.attr("group", 1))
    if n == 1:
        x4, w4 = _as_image(ctx, x), _unit_h_weight(ctx, w)
    else:
        x4, w4 = x, w
    y = _windowed(ctx, node, x, lambda: g.conv2d(
        x4, w4, b, _to2d(strides, 1), _pads4(pairs), _to2d(dilations, 1), group))
    return _from_image(ctx, y) if n == 1 else y


def _transpose_pads(ctx, node, sizes, kernel, strides, dilations, out_pad):
    """(before, after) cropping per axis and the output_padding, from pads / auto_pad /
    output_shape (ONNX Runtime's rules: SAME_UPPER crops the odd element at the end)."""
    n = len(kernel)
    auto = node.attr("auto_pad", "NOTSET")
    if auto not in _AUTO_PAD:
        raise ctx.fail(node, f"unknown auto_pad {auto!r} (one of {', '.join(_AUTO_PAD)})")
    shape = node.attr("output_shape", None)
    if shape is None and auto not in ("SAME_UPPER", "SAME_LOWER"):
        if auto == "VALID":
            return [(0, 0)] * n, out_pad
        pads = _ints_attr(ctx, node, "pads", 2 * n, 0)
        return [(pads[i], pads[i + n]) for i in range(n)], out_pad
    if shape is None:  # SAME: the crop does not depend on the size
        sizes = [1 << 20] * n
    else:
        sizes = _static_spatial(ctx, node, sizes, "ConvTranspose with output_shape")
    if shape is not None and len(shape) != n:
        raise ctx.fail(node, f"output_shape {list(shape)} must give the {n} spatial dims")
    pairs, extra_pad = [], []
    for i, (size, k, s, d) in enumerate(zip(sizes, kernel, strides, dilations)):
        want = shape[i] if shape is not None else size * s
        full = (size - 1) * s + d * (k - 1) + 1 + out_pad[i]
        total = full - want
        if total < 0 and shape is None:
            raise ctx.fail(node, f"auto_pad={auto} needs {-total} extra output elements along "
                                 f"spatial axis {i}, which braze cannot express")
        grow = max(0, -total)
        total = max(0, total)
        lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
        pairs.append((lo, total - lo))
        extra_pad.append(out_pad[i] + grow)
    return pairs, extra_pad


@converter("ConvTranspose")
def conv_transpose(ctx, node):
    g = ctx.g
    x, w = ctx.value(node, 0), ctx.value(node, 1)
    b = ctx.opt_value(node, 2)
    n = _spatial_rank(ctx, node, x)
    wdims = ctx.dims(w)
    if len(wdims) != n + 2:
        raise ctx.fail(node, f"weight {wdims} does not match a {n}-D transposed conv of input "
                             f"{ctx.dims(x)}")
    kernel = list(wdims[2:])
    if "kernel_shape" in node.attrs and list(node.attrs["kernel_shape"]) != kernel:
        raise ctx.fail(node, f"kernel_shape {node.attrs['kernel_shape']} does not match the "
                             f"weight {wdims}")
    strides = _ints_attr(ctx, node, "strides", n, 1)
    dilations = _ints_attr(ctx, node, "dilations", n, 1)
    out_pad = _ints_attr(ctx, node, "output_padding", n, 0)
    sizes = ctx.dims(x)[2:]
    pairs, out_pad = _transpose_pads(ctx, node, sizes, kernel, strides, dilations, out_pad)
    group = int(node.attr("group", 1))
    if n == 1:
        x4, w4 = _as_image(ctx, x), _unit_h_weight(ctx, w)
    else:
        x4, w4 = x, w
    y = g.conv_transpose2d(x4, w4, b, _to2d(strides, 1), _pads4(pairs), _to2d(out_pad, 0),
                           _to2d(dilations, 1), group)
    return [_from_image(ctx, y) if n == 1 else y]


# -- pooling ------------------------------------------------------------------------------------
def pool_setup(ctx, node):
    """(x, spatial rank, kernel, strides, (pad lo, pad hi, ceil-mode extra) per spatial dim) of
    a pooling node, its attributes checked."""
    x = ctx.value(node, 0)
    n = _spatial_rank(ctx, node, x)
    if "kernel_shape" not in node.attrs:
        raise ctx.fail(node, f"{node.op_type} needs kernel_shape")
    kernel = _ints_attr(ctx, node, "kernel_shape", n, 1)
    strides = _ints_attr(ctx, node, "strides", n, 1)
    dilations = _ints_attr(ctx, node, "dilations", n, 1)
    if any(d != 1 for d in dilations):
        raise ctx.fail(node, f"{node.op_type} with dilations {dilations} is not supported "
                             "(braze pools have dilation 1)")
    pairs = _window_pads(ctx, node, ctx.dims(x)[2:], kernel, strides, dilations)
    if node.attr("ceil_mode", 0) and node.attr("auto_pad", "NOTSET") in ("NOTSET", "VALID"):
        triples = _ceil_extra(ctx, node, ctx.dims(x)[2:], kernel, strides, pairs)
    else:
        triples = [(lo, hi, 0) for lo, hi in pairs]
    for (lo, hi, extra), k in zip(triples, kernel):
        if max(lo, hi + extra) >= k:
            raise ctx.fail(node, f"{node.op_type} padding ({lo}, {hi + extra}) must be smaller "
                                 f"than the kernel {k}")
    return x, n, kernel, strides, triples


@converter("MaxPool")
def max_pool(ctx, node):
    if len(node.outputs) > 1 and node.outputs[1]:
        raise ctx.fail(node, "MaxPool's Indices output is not supported (braze pools return "
                             "values only); use the values output alone")
    x, n, kernel, strides, triples = pool_setup(ctx, node)
    pads = _pads4([(lo, hi + extra) for lo, hi, extra in triples])
    x4 = _as_image(ctx, x) if n == 1 else x
    y = _windowed(ctx, node, x, lambda: ctx.g.max_pool2d(x4, _to2d(kernel, 1),
                                                         _to2d(strides, 1), pads))
    return [_from_image(ctx, y) if n == 1 else y]


@converter("AveragePool")
def avg_pool(ctx, node):
    x, n, kernel, strides, triples = pool_setup(ctx, node)
    include = bool(node.attr("count_include_pad", 0))
    x4 = _as_image(ctx, x) if n == 1 else x
    if include and any(extra for _, _, extra in triples):
        # explicit pads count, the ceil-mode extension does not: zero-pad first, then pool
        spatial = [(0, 0)] * (2 - n) + [(lo, hi) for lo, hi, _ in triples]
        if any(lo or hi for lo, hi in spatial):
            x4 = ctx.g.pad(x4, [(0, 0), (0, 0)] + spatial)
        pads = _pads4([(0, extra) for _, _, extra in triples])
        include = False
    else:
        pads = _pads4([(lo, hi + extra) for lo, hi, extra in triples])
    y = _windowed(ctx, node, x, lambda: ctx.g.avg_pool2d(
        x4, _to2d(kernel, 1), _to2d(strides, 1), pads, count_include_pad=include))
    return [_from_image(ctx, y) if n == 1 else y]


@converter("GlobalAveragePool")
def global_avg_pool(ctx, node):
    x = ctx.value(node, 0)
    rank = len(ctx.dims(x))
    if rank == 4:
        return [ctx.g.global_avg_pool(x)]
    if rank < 3:
        raise ctx.fail(node, f"GlobalAveragePool needs [N, C, ...], got {ctx.dims(x)}")
    return [ctx.g.reduce(x, ReduceFn.MEAN, list(range(2, rank)), True)]


@converter("GlobalMaxPool")
def global_max_pool(ctx, node):
    x = ctx.value(node, 0)
    rank = len(ctx.dims(x))
    if rank < 3:
        raise ctx.fail(node, f"GlobalMaxPool needs [N, C, ...], got {ctx.dims(x)}")
    return [ctx.g.reduce(x, ReduceFn.MAX, list(range(2, rank)), True)]


# -- pad ----------------------------------------------------------------------------------------
@converter("Pad")
def pad(ctx, node):
    g = ctx.g
    x = ctx.value(node, 0)
    dims = ctx.dims(x)
    rank = len(dims)
    mode = node.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise ctx.fail(node, f"Pad mode={mode!r} is not supported (constant, reflect, edge, "
                             "wrap)")
    if "pads" in node.attrs:
        amounts, value, axes = list(node.attrs["pads"]), node.attr("value", 0.0), None
    else:
        amounts = ctx.static_ints(node, 1, "Pad amounts")
        value = ctx.scalar(node, 2, "Pad constant_value", default=0) if ctx.has(node, 2) else 0
        axes = ctx.static_ints(node, 3, "Pad axes") if ctx.has(node, 3) else None
    axes = list(range(rank)) if axes is None else [a % rank for a in axes]
    if len(amounts) != 2 * len(axes):
        raise ctx.fail(node, f"pads {amounts} must hold 2 x {len(axes)} amounts (all befores, "
                             "then all afters)")
    pairs = [(0, 0)] * rank
    for i, a in enumerate(axes):
        pairs[a] = (amounts[i], amounts[i + len(axes)])
    for a, (lo, hi) in enumerate(pairs):  # negative amounts crop
        if lo < 0 or hi < 0:
            length = SymDim.of(dims[a]) + min(lo, 0) + min(hi, 0)
            x = g.narrow(x, a, -min(lo, 0), length.to_dim())
    pairs = [(max(lo, 0), max(hi, 0)) for lo, hi in pairs]
    if not any(lo or hi for lo, hi in pairs):
        return [x]
    if mode == "wrap":
        return [_wrap_pad(ctx, node, x, pairs)]
    return [g.pad(x, pairs, float(value), PadMode(mode))]


def _wrap_pad(ctx, node, x, pairs):
    """Wrap padding: the tail of each axis before it, its head after it."""
    g = ctx.g
    for a, (lo, hi) in enumerate(pairs):
        if not (lo or hi):
            continue
        d = ctx.dims(x)[a]
        if not isinstance(d, int) or max(lo, hi) > d:
            raise ctx.fail(node, f"wrap Pad of {(lo, hi)} on axis {a} needs a static axis at "
                                 f"least as long (got {d!r})")
        parts = ([g.narrow(x, a, d - lo, lo)] if lo else []) + [x] + \
            ([g.narrow(x, a, 0, hi)] if hi else [])
        x = g.concat(parts, a)
    return x
