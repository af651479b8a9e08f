"""Convolution, pooling and upsampling: convolution / conv2d / conv1d (1-D runs as 2-D with a
unit H axis; padding "same" / "valid"), transposed convolution, max / avg pooling (ceil_mode as
torch: the last window may hang over the end but never starts in the padding; avg pooling counts
the explicit padding with count_include_pad, never the ceil extension), adaptive average pooling
(global, or evenly dividing), and upsample_nearest2d / bilinear2d (exact 2x nearest ->
resize_nearest_2x, else braze `resize` with torch's coordinate conventions)."""
from __future__ import annotations

from ....ir.ops.reduce import ReduceFn
from ....ir.ops.resize import CoordinateMode, NearestMode, ResizeMode
from ....ir.symbolic import SymDim, dim_symbols
from ..context import Call, Lazy, TorchContext, converter
from ..symbolic import static_hint


def _pair(ctx, v, what: str, n: int, default=None) -> list[int]:
    if v is None or (isinstance(v, (list, tuple)) and not v):
        if default is None:
            raise ctx.fail(f"{what} is required")
        return list(default)
    vals = ctx.static_ints(v, what)
    return vals * n if len(vals) == 1 else vals


def _as_image(ctx, x):
    n, ch, length = ctx.dims(x)
    return ctx.g.reshape(x, (n, ch, 1, length))


def _from_image(ctx, y):
    n, ch, _, length = ctx.dims(y)
    return ctx.g.reshape(y, (n, ch, length))


def _spatial(ctx, x) -> int:
    n = ctx.rank(x) - 2
    if n not in (1, 2):
        raise ctx.fail(f"{n}-D convolution / pooling is not supported (braze has 1-D and 2-D)")
    return n


def _conv(ctx: TorchContext, c: Call, transposed: bool, padding):
    dt = ctx.out_dtype()
    x, w = ctx.value(c["input"], dt), ctx.value(c["weight"], dt)
    b = c.args.get("bias")
    b = None if b is None else ctx.value(b, dt)
    n = _spatial(ctx, x)
    stride = _pair(ctx, c.get("stride"), "stride", n, [1] * n)
    dilation = _pair(ctx, c.get("dilation"), "dilation", n, [1] * n)
    groups = ctx.static_int(c.get("groups", 1), "groups")
    kernel = ctx.dims(w)[2:]
    if isinstance(padding, str):
        if padding == "valid":
            pads = [(0, 0)] * n
        elif padding == "same":
            pads = [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2)
                    for d, k in zip(dilation, kernel)]
        else:
            raise ctx.fail(f"padding {padding!r} is not 'same', 'valid' or numbers")
    else:
        p = _pair(ctx, padding, "padding", n, [0] * n)
        pads = [(v, v) for v in p]
    g = ctx.g
    if n == 1:
        x, w = _as_image(ctx, x), g.reshape(w, ctx.dims(w)[:2] + (1, kernel[0]))
        stride, dilation, pads = [1] + stride, [1] + dilation, [(0, 0)] + pads
    pad4 = (pads[0][0], pads[1][0], pads[0][1], pads[1][1])
    if transposed:
        outp = _pair(ctx, c.get("output_padding"), "output_padding", n, [0] * n)
        outp = [0] + outp if n == 1 else outp
        if pads[0][0] != pads[0][1] or pads[1][0] != pads[1][1]:
            raise ctx.fail("asymmetric padding of a transposed convolution is not supported")
        y = g.conv_transpose2d(x, w, b, tuple(stride), (pads[0][0], pads[1][0]), tuple(outp),
                               tuple(dilation), groups)
    else:
        y = g.conv2d(x, w, b, tuple(stride), pad4, tuple(dilation), groups)
    return _from_image(ctx, y) if n == 1 else y


@converter("aten.convolution.default", "aten._convolution.default")
def convolution(ctx, c):
    return _conv(ctx, c, bool(c.get("transposed", False)), c.get("padding"))


@converter("aten.conv2d.default", "aten.conv1d.default", "aten.conv2d.padding",
           "aten.conv1d.padding")
def conv2d(ctx, c):
    return _conv(ctx, c, False, c.get("padding"))


@converter("aten.conv_transpose2d.input", "aten.conv_transpose1d.default")
def conv_transpose(ctx, c):
    return _conv(ctx, c, True, c.get("padding"))


# -- pooling ------------------------------------------------------------------------------------
def _pool_pads(ctx, x, kernel, stride, padding, n_out) -> list[tuple[int, int, int]]:
    """(before, after, ceil extension) per spatial axis; the extension lets the last window of a
    ceil_mode pooling hang over the end (torch decided the output length, `n_out`)."""
    out = []
    for size, k, s, p, m in zip(ctx.dims(x)[2:], kernel, stride, padding, n_out):
        # symbolic sizes (a "32*h" image): the extension is constant when both are polynomials
        extra = (SymDim.of(m) - 1) * s + k - (SymDim.of(size) + 2 * p)
        out.append((p, p, max(0, extra.const) if extra.is_const else 0))
    return out


def _pool_args(ctx, c: Call, n: int):
    kernel = _pair(ctx, c["kernel_size"], "kernel_size", n)
    stride = _pair(ctx, c.get("stride"), "stride", n, kernel)
    padding = _pair(ctx, c.get("padding"), "padding", n, [0] * n)
    dilation = _pair(ctx, c.get("dilation"), "dilation", n, [1] * n)
    if any(d != 1 for d in dilation):
        raise ctx.fail(f"pooling with dilation {dilation} is not supported")
    return kernel, stride, padding


def _to2d(vals: list, fill: int, n: int) -> tuple:
    return tuple([fill] + vals) if n == 1 else tuple(vals)


@converter("aten.max_pool2d.default", "aten.max_pool2d_with_indices.default",
           "aten.max_pool1d.default", "aten.max_pool1d_with_indices.default")
def max_pool(ctx, c):
    x = ctx.value(c["self"])
    n = _spatial(ctx, x)
    kernel, stride, padding = _pool_args(ctx, c, n)
    triples = _pool_pads(ctx, x, kernel, stride, padding, ctx.out_dims(0)[2:])
    pads = [(lo, hi + e) for lo, hi, e in triples]
    x4 = _as_image(ctx, x) if n == 1 else x
    pads = [(0, 0)] * (2 - n) + pads
    y = ctx.g.max_pool2d(x4, _to2d(kernel, 1, n), _to2d(stride, 1, n),
                         (pads[0][0], pads[1][0], pads[0][1], pads[1][1]))
    y = _from_image(ctx, y) if n == 1 else y
    if "with_indices" not in c.key:
        return y
    err = ctx.fail("max pooling indices are not supported (braze pools return values only)")

    def indices():
        raise err

    return (y, Lazy(indices))


@converter("aten.avg_pool2d.default", "aten.avg_pool1d.default")
def avg_pool(ctx, c):
    x = ctx.value(c["self"])
    n = _spatial(ctx, x)
    if c.args.get("divisor_override") is not None:
        raise ctx.fail("avg_pool with divisor_override is not supported")
    kernel, stride, padding = _pool_args(ctx, c, n)
    include = bool(c.get("count_include_pad", True))
    triples = _pool_pads(ctx, x, kernel, stride, padding, ctx.out_dims()[2:])
    g = ctx.g
    x4 = _as_image(ctx, x) if n == 1 else x
    triples = [(0, 0, 0)] * (2 - n) + triples
    if include and any(e for _, _, e in triples):
        if any(lo or hi for lo, hi, _ in triples):
            x4 = g.pad(x4, [(0, 0), (0, 0)] + [(lo, hi) for lo, hi, _ in triples])
        pads = [(0, e) for _, _, e in triples]
        include = False
    else:
        pads = [(lo, hi + e) for lo, hi, e in triples]
    y = g.avg_pool2d(x4, _to2d(kernel, 1, n), _to2d(stride, 1, n),
                     (pads[0][0], pads[1][0], pads[0][1], pads[1][1]), count_include_pad=include)
    return _from_image(ctx, y) if n == 1 else y


@converter("aten.adaptive_avg_pool2d.default", "aten._adaptive_avg_pool2d.default",
           "aten.adaptive_avg_pool1d.default", "aten.adaptive_max_pool2d.default",
           "aten.adaptive_max_pool1d.default")
def adaptive_pool(ctx, c):
    x = ctx.value(c["self"])
    n = _spatial(ctx, x)
    out = _pair(ctx, c["output_size"], "output_size", n)
    is_max = "max" in c.key
    sizes = ctx.dims(x)[2:]
    g = ctx.g
    if all(o == 1 for o in out):
        if n == 2 and not is_max:
            y = g.global_avg_pool(x)
        else:
            y = g.reduce(x, ReduceFn.MAX if is_max else ReduceFn.MEAN, tuple(range(2, 2 + n)),
                         True)
    elif all(isinstance(s, int) for s in sizes):
        if not all(s % o == 0 for s, o in zip(sizes, out)):
            raise ctx.fail(f"adaptive pooling of {sizes} to {out} is supported when the output "
                           "divides the input")
        k = [s // o for s, o in zip(sizes, out)]
        x4 = _as_image(ctx, x) if n == 1 else x
        pool = g.max_pool2d if is_max else g.avg_pool2d
        y = pool(x4, _to2d(k, 1, n), _to2d(k, 1, n))
        y = _from_image(ctx, y) if n == 1 else y
    else:
        y = _adaptive_blocks(ctx, x, sizes, out, is_max)
    if not is_max:
        return y
    err = ctx.fail("adaptive max pooling indices are not supported")

    def indices():
        raise err

    return (y, Lazy(indices))


def _adaptive_blocks(ctx, x, sizes, out, is_max: bool):
    """Adaptive pooling of symbolic sizes that every binding's output divides ("32*h" to 2 or
    4): x as [N, C, o1, s1 / o1, o2, s2 / o2] reduced over the block axes; the window would
    be a symbolic kernel, which the pool ops do not take."""
    blocks = [SymDim.of(s).divmod_int(o) for s, o in zip(sizes, out)]
    if any(b is None or b[1] for b in blocks):
        dims = sorted(set().union(*(dim_symbols(s) for s in sizes)))
        raise ctx.fail(f"adaptive pooling of {sizes} to {out} is supported when the output "
                       f"divides the input for every size (declare it a multiple, e.g. "
                       f"'{out[-1] * 16}*h'){static_hint(dims)}")
    lead = ctx.dims(x)[:2]
    split = list(lead)
    for o, (q, _) in zip(out, blocks):
        split += [o, q.to_dim()]
    g = ctx.g
    y = g.reduce(g.reshape(x, tuple(split)), ReduceFn.MAX if is_max else ReduceFn.MEAN,
                 tuple(3 + 2 * i for i in range(len(out))), False)
    return y


# -- upsampling ---------------------------------------------------------------------------------
def _scales(c: Call):
    sf = c.args.get("scale_factors")
    if sf:
        return tuple(float(s) for s in (sf if len(sf) == 2 else sf * 2))
    h, w = c.args.get("scales_h"), c.args.get("scales_w")
    return None if h is None or w is None else (float(h), float(w))


def _resize_size(ctx, x):
    """The output's spatial size (ints, or polynomials of the input's dims)."""
    if ctx.rank(x) != 4:
        raise ctx.fail(f"upsampling needs a 4-D input, got dims {ctx.dims(x)}")
    return ctx.out_dims()[2:]


@converter("aten.upsample_nearest2d.vec", "aten.upsample_nearest2d.default",
           "aten._upsample_nearest_exact2d.vec", "aten._upsample_nearest_exact2d.default")
def upsample_nearest(ctx, c):
    x = ctx.value(c["input"] if "input" in c.args else c["self"])
    size = _resize_size(ctx, x)
    scale = _scales(c)
    exact = "exact" in c.key
    h, w = ctx.dims(x)[2:]
    doubled = tuple(SymDim.of(d) for d in size) == (2 * SymDim.of(h), 2 * SymDim.of(w))
    if not exact and doubled and scale in (None, (2.0, 2.0)):
        return ctx.g.resize_nearest_2x(x)
    coord = CoordinateMode.TF_HALF_PIXEL_FOR_NN if exact else CoordinateMode.ASYMMETRIC
    return ctx.g.resize(x, size, ResizeMode.NEAREST, coord, NearestMode.FLOOR, scale)


@converter("aten.upsample_nearest1d.vec", "aten.upsample_nearest1d.default",
           "aten._upsample_nearest_exact1d.vec", "aten._upsample_nearest_exact1d.default")
def upsample_nearest_1d(ctx, c):
    """Nearest 1-D upsampling as the 2-D one of x viewed [N, C, 1, L]."""
    x = ctx.value(c["input"] if "input" in c.args else c["self"])
    n, ch, length = ctx.dims(x)
    (out,) = ctx.out_dims()[2:]
    sf = c.args.get("scale_factors") or ([c.args["scales"]] if c.args.get("scales") else None)
    scale = (1.0, float(sf[0])) if sf else None
    exact = "exact" in c.key
    coord = CoordinateMode.TF_HALF_PIXEL_FOR_NN if exact else CoordinateMode.ASYMMETRIC
    image = ctx.g.reshape(x, (n, ch, 1, length))
    y = ctx.g.resize(image, (1, out), ResizeMode.NEAREST, coord, NearestMode.FLOOR, scale)
    return ctx.g.reshape(y, (n, ch, out))


def _interpolate(ctx, c, mode: ResizeMode):
    """A bilinear / bicubic (a = -0.75, borders replicated) resize with torch's source
    coordinates: (dst + 0.5) * in / out - 0.5 at every output length (ONNX's pytorch_half_pixel
    reads 0 where the output length is 1: a downscale to one row), or align_corners."""
    x = ctx.value(c["input"] if "input" in c.args else c["self"])
    size = _resize_size(ctx, x)
    if c.get("align_corners", False):
        return ctx.g.resize(x, size, mode, CoordinateMode.ALIGN_CORNERS)
    return ctx.g.resize(x, size, mode, CoordinateMode.HALF_PIXEL, scale=_scales(c))


@converter("aten.upsample_bicubic2d.vec", "aten.upsample_bicubic2d.default")
def upsample_bicubic(ctx, c):
    return _interpolate(ctx, c, ResizeMode.CUBIC)


@converter("aten.upsample_bilinear2d.vec", "aten.upsample_bilinear2d.default")
def upsample_bilinear(ctx, c):
    return _interpolate(ctx, c, ResizeMode.LINEAR)
