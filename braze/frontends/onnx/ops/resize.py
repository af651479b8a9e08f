"""ONNX Resize and Upsample: scales or sizes (read from initializers, or from shape values
such as another tensor's Shape) to braze's `resize` op, with ONNX Runtime's output-length rule
floor(scale * in); the exact 2x nearest case becomes `resize_nearest_2x`. A symbolic input size
keeps a polynomial output size for a whole scale, or one over a power of two that divides the
size's coefficients; other scales of a symbolic size are an error naming `input_shapes=`."""
from __future__ import annotations

import math

import numpy as np

from ....ir.ops.conv import ResizeNearest2x
from ....ir.ops.io import Constant, Param
from ....ir.ops.resize import CoordinateMode, NearestMode, Resize, ResizeMode
from ....ir.symbolic import SymDim, eval_dim, to_dim
from ..context import converter
from .nn import _as_image, _from_image, _spatial_rank, _static_spatial, _windowed, input_shapes_hint


def _enum(ctx, node, cls, key: str, default: str):
    v = node.attr(key, default)
    try:
        return cls(v)
    except ValueError:
        known = ", ".join(m.value for m in cls)
        raise ctx.fail(node, f"{key}={v!r} is not supported (supported: {known})") from None


def _full_list(ctx, node, vals: list, axes: list[int] | None, rank: int, fill, what: str):
    if axes is None:
        if len(vals) != rank:
            raise ctx.fail(node, f"{what} {vals} must have one entry per axis ({rank})")
        return list(vals)
    if len(vals) != len(axes):
        raise ctx.fail(node, f"{what} {vals} must have one entry per axis in axes {axes}")
    full = list(fill)
    for a, v in zip(axes, vals):
        full[a] = v
    return full


def stored_array(ctx, node, i: int, what: str) -> np.ndarray | None:
    """Input `i` as a NumPy array when it is fixed at import time (a compile-time value, a
    constant, or a weight with a stored value); None when the input is absent."""
    if not ctx.has(node, i):
        return None
    k = ctx.known(node, i)
    if k is not None:
        if k.symbolic:
            raise ctx.fail(node, f"{what} depends on symbolic dims {k.ints()}; "
                                 f"{input_shapes_hint(ctx)}")
        return np.asarray(k.array)
    src = ctx.g.node(ctx.value(node, i)).op
    if isinstance(src, Constant):
        return np.asarray(src.value)
    if isinstance(src, Param) and src.name in ctx.g.weights:
        return np.asarray(ctx.g.weights[src.name])
    raise ctx.fail(node, f"{what} is computed at run time; braze needs it at import time")


def _resize_sizes(ctx, node) -> list | None:
    """Resize's `sizes` input as ints, or SymDims where the batch / channel entries are read
    from the input's own shape (`Concat(Shape(x)[:2], hw)`, MobileViT's exports); None when
    absent or empty."""
    k = ctx.known(node, 3) if ctx.has(node, 3) else None
    if k is not None and k.symbolic:
        return [SymDim.of(v) if not isinstance(v, int) else v for v in k.ints()] or None
    sizes_a = stored_array(ctx, node, 3, "Resize sizes")
    return [int(v) for v in sizes_a.reshape(-1)] if sizes_a is not None and \
        sizes_a.size else None


def _resize_targets(ctx, node, dims, axes):
    """(output spatial sizes, coordinate scales or None) from Resize's scales / sizes."""
    rank = len(dims)
    scales_a = stored_array(ctx, node, 2, "Resize scales")
    scales = [float(v) for v in scales_a.reshape(-1)] if scales_a is not None and \
        scales_a.size else None
    sizes = _resize_sizes(ctx, node)
    if (scales is None) == (sizes is None):
        raise ctx.fail(node, "Resize needs exactly one of scales and sizes")
    if scales is not None:
        scales = _full_list(ctx, node, scales, axes, rank, [1.0] * rank, "scales")
        if any(s <= 0 for s in scales):
            raise ctx.fail(node, f"Resize scales {scales} must be positive")
        for i, s in enumerate(scales[:2]):
            if s != 1.0:
                raise ctx.fail(node, f"Resize of axis {i} (batch / channels, scale {s}) is not "
                                     "supported; braze resizes the spatial axes")
        out = [_scaled(ctx, node, s, d) for s, d in zip(scales[2:], dims[2:])]
        return out, scales[2:]
    sizes = _full_list(ctx, node, sizes, axes, rank, list(dims), "sizes")
    for i in range(2):
        if SymDim.of(sizes[i]) != SymDim.of(dims[i]):
            raise ctx.fail(node, f"Resize of axis {i} (batch / channels, {dims[i]} -> "
                                 f"{sizes[i]}) is not supported; braze resizes the spatial axes")
    policy = node.attr("keep_aspect_ratio_policy", "stretch")
    if policy == "stretch":
        return [to_dim(v) for v in sizes[2:]], None
    if policy not in ("not_larger", "not_smaller"):
        raise ctx.fail(node, f"keep_aspect_ratio_policy={policy!r} is not supported")
    spatial = _static_spatial(ctx, node, dims[2:], "Resize with keep_aspect_ratio_policy")
    # the policy's one scale is taken over every axis in `axes` (all axes by default),
    # batch and channels included: their ratio is 1 (checked above), which caps not_larger
    # at 1 and floors not_smaller at 1
    listed = list(axes) if axes is not None else list(range(rank))
    resized = [a for a in listed if a >= 2]
    ratios = [np.float32(1.0) if a < 2 else np.float32(sizes[a]) / np.float32(dims[a])
              for a in listed]
    s = min(ratios) if policy == "not_larger" else max(ratios)
    for a in listed:
        if a < 2 and s != 1.0:
            d = dims[a]
            out_a = int(math.floor(float(s) * d + 0.5)) if isinstance(d, int) else None
            if out_a != d:
                to = "?" if out_a is None else out_a
                raise ctx.fail(node, f"Resize with keep_aspect_ratio_policy={policy!r} scales "
                                     f"every axis in axes by {float(s):g}, which resizes axis "
                                     f"{a} (batch / channels, {d} -> {to}); braze resizes the "
                                     "spatial axes: list only spatial axes in axes")
    out = [int(math.floor(float(s) * d + 0.5)) if (i + 2) in resized else d
           for i, d in enumerate(spatial)]
    return out, [float(s) if (i + 2) in resized else 1.0 for i in range(len(spatial))]


def _scaled(ctx, node, scale: float, d):
    """ONNX's output length floor(scale * d): a symbolic d keeps a polynomial when the scale's
    denominator is a power of two that divides it (SymDim.scaled_floor: 2 * h, h / 2 of
    "2*h", 1.5 of "32*h"); other scales of a symbolic d are an import error naming the fix."""
    if isinstance(d, int):
        return int(np.float32(scale) * np.float32(d))
    out = SymDim.of(d).scaled_floor(scale)
    if out is None:
        raise ctx.fail(node, f"Resize by scale {scale} of symbolic dim {d!r} is not a polynomial "
                             f"size (a scale over a power of two that divides the size is); "
                             f"{input_shapes_hint(ctx)}")
    return out.to_dim()


def _may_shrink(out, d) -> bool:
    """Whether an output length can be below its input's (unknown for symbolic: True)."""
    if isinstance(out, int) and isinstance(d, int):
        return out < d
    low = (SymDim.of(out) - d).lower_bound()
    return low is None or low < 0


def _no_downscale(out, d, env) -> bool:
    """Whether the output length `out` is empty or at least the input's `d` under `env`."""
    n = eval_dim(out, env)
    return n == 0 or n >= eval_dim(d, env)


def _doubles(op: Resize, axis: int, d) -> bool:
    """Whether nearest `op` reads source i // 2 at output i along `axis` of length d -> 2d:
    checked at d, or for a symbolic d on every length up to 64 and a few large ones (with the
    scale given, coordinates depend on the length only at the clamped ends; align_corners
    depends on it, and its float32 rounding leaves i // 2 at large lengths)."""
    lengths = [d] if isinstance(d, int) else [*range(1, 65), 1000, 1023, 4097]
    return all(np.array_equal(op.indices(axis, n, 2 * n), np.arange(2 * n) // 2)
               for n in lengths)


def _resize(ctx, node, x, out_sizes, scales, mode, coord, nearest, cubic_a=-0.75,
            exclude=False):
    """Resize x ([N, C, L] or [N, C, H, W]) to the spatial `out_sizes`."""
    g = ctx.g
    dims = ctx.dims(x)
    n = len(dims) - 2
    if list(dims[2:]) == list(out_sizes) and (scales is None or all(s == 1.0 for s in scales)):
        return x
    x4 = _as_image(ctx, x) if n == 1 else x
    size = (1, out_sizes[0]) if n == 1 else tuple(out_sizes)
    scale = None if scales is None else ((1.0, scales[0]) if n == 1 else tuple(scales))
    op = Resize(tuple(size), mode, coord, nearest, scale, float(cubic_a), bool(exclude))
    h, w = ctx.dims(x4)[2:]
    if mode is ResizeMode.NEAREST and size == tuple(to_dim(2 * SymDim.of(d)) for d in (h, w)) \
            and all(_doubles(op, i, d) for i, d in enumerate((h, w))):
        y = g.add_node(ResizeNearest2x(), (x4,))[0]
    else:
        y = _windowed(ctx, node, x, lambda: g.add_node(op, (x4,))[0])
    return _from_image(ctx, y) if n == 1 else y


@converter("Resize")
def resize(ctx, node):
    x = ctx.value(node, 0)
    dims = ctx.dims(x)
    _spatial_rank(ctx, node, x)
    coord_name = node.attr("coordinate_transformation_mode", "half_pixel")
    if coord_name == "tf_crop_and_resize":
        raise ctx.fail(node, "coordinate_transformation_mode='tf_crop_and_resize' is not "
                             "supported")
    mode = _enum(ctx, node, ResizeMode, "mode", "nearest")
    coord = _enum(ctx, node, CoordinateMode, "coordinate_transformation_mode", "half_pixel")
    nearest = _enum(ctx, node, NearestMode, "nearest_mode", "round_prefer_floor")
    axes = node.attr("axes", None)
    if axes is not None:
        axes = [a % len(dims) for a in axes]
    out, scales = _resize_targets(ctx, node, dims, axes)
    if node.attr("antialias", 0) and mode is not ResizeMode.NEAREST:
        pairs = list(zip(out, dims[2:]))
        if any(_may_shrink(o, d) for o, d in pairs):
            raise ctx.fail(node, "Resize with antialias=1 when downscaling is not supported")
        syms = {s for p in pairs for v in p for s in SymDim.of(v).symbols}
        ctx.exclude_small(
            node, syms, lambda env: all(_no_downscale(o, d, env) for o, d in pairs),
            "Resize with antialias=1 was imported as an upscale, which holds for {sym} >= 2 "
            "but downscales at {sym} = {value} (unsupported); feed another size")
    return [_resize(ctx, node, x, out, scales, mode, coord, nearest,
                    node.attr("cubic_coeff_a", -0.75), node.attr("exclude_outside", 0))]


@converter("Upsample")
def upsample(ctx, node):
    """The deprecated Resize: asymmetric coordinates; nearest rounds down when enlarging."""
    x = ctx.value(node, 0)
    dims = ctx.dims(x)
    _spatial_rank(ctx, node, x)
    name = node.attr("mode", "nearest")
    mode = {"nearest": ResizeMode.NEAREST, "linear": ResizeMode.LINEAR,
            "bilinear": ResizeMode.LINEAR}.get(name)
    if mode is None:
        raise ctx.fail(node, f"Upsample mode={name!r} is not supported (nearest, linear)")
    if "scales" in node.attrs:
        scales = [float(s) for s in node.attrs["scales"]]
    else:
        scales = [float(v) for v in stored_array(ctx, node, 1, "Upsample scales").reshape(-1)]
    scales = _full_list(ctx, node, scales, None, len(dims), None, "scales")
    if scales[:2] != [1.0, 1.0]:
        raise ctx.fail(node, f"Upsample of the batch / channel axes (scales {scales}) is not "
                             "supported")
    out = [_scaled(ctx, node, s, d) for s, d in zip(scales[2:], dims[2:])]
    nearest = NearestMode.FLOOR if all(s >= 1 for s in scales) else NearestMode.CEIL
    return [_resize(ctx, node, x, out, scales[2:], mode, CoordinateMode.ASYMMETRIC, nearest)]
