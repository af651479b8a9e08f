"""torch's fake quantization (quantization-aware training): fake_quantize_per_tensor_affine and
fake_quantize_per_channel_affine over the full int8 (-128..127) or uint8 (0..255) range become
braze's fake_quantize with torch's arithmetic: x times the float32 reciprocal of the scale,
rounded half to even, plus the zero point, clamped, minus the zero point, times the scale
(`fake_quantize(x * (1 / scale), 1, zero_point) * scale`), so the forward values are torch's
and the gradient is straight-through where torch's mask is set. Other ranges (4-bit, the
symmetric -127..127) are refused naming the node; quantized tensors (quantize_per_tensor,
dequantize) stay unsupported ops."""
from __future__ import annotations

import numpy as np

from ....ir.dtypes import i8, u8
from ..context import Call, TorchContext, converter

_RANGES = {(-128, 127): i8, (0, 255): u8}


def _fake_quantize(ctx: TorchContext, c: Call, axis: int | None):
    g = ctx.g
    x = ctx.value(c["self"])
    dt = ctx.dtype(x)
    rng = (ctx.static_int(c["quant_min"], "quant_min"), ctx.static_int(c["quant_max"],
                                                                        "quant_max"))
    qdt = _RANGES.get(rng)
    if qdt is None:
        raise ctx.fail(f"fake quantization to [{rng[0]}, {rng[1]}] is not supported: braze "
                       "fake-quantizes to the full int8 (-128..127) or uint8 (0..255) range")
    if not dt.is_float:
        raise ctx.fail(f"fake quantization needs a float input, got {dt}")
    scale = ctx.value(c["scale"], dt)
    zp = c["zero_point"]
    zp = ctx.value(zp if ctx.is_tensor(zp) else int(zp))
    zp = g.cast(g.activation(ctx.cast(zp, dt), "round"), qdt) if ctx.dtype(zp).is_float \
        else ctx.cast(zp, qdt)
    if axis is not None:
        axis = ctx.axis(axis, ctx.rank(x))
        along = tuple(-1 if a == axis else 1 for a in range(ctx.rank(x)))
        if ctx.dims(scale) != (ctx.dims(x)[axis],):
            raise ctx.fail(f"per-channel scale {list(ctx.dims(scale))} does not match axis "
                           f"{axis} of the input {list(ctx.dims(x))}")
        ones = g.constant(np.ones(ctx.dims(scale), dt.np), dt)
        inv = g.reshape(g.div(ctx.value(1.0, dt), scale), along)
        y = g.fake_quantize(g.mul(x, inv), ones, zp, axis=axis)
        return g.mul(y, g.reshape(scale, along))
    scale, zp = (g.reshape(v, ()) if ctx.dims(v) else v for v in (scale, zp))
    y = g.fake_quantize(g.mul(x, g.div(ctx.value(1.0, dt), scale)), 1.0, zp)
    return g.mul(y, scale)


@converter("aten.fake_quantize_per_tensor_affine.default",
           "aten.fake_quantize_per_tensor_affine.tensor_qparams")
def fake_quantize_per_tensor(ctx, c):
    return _fake_quantize(ctx, c, None)


@converter("aten.fake_quantize_per_channel_affine.default")
def fake_quantize_per_channel(ctx, c):
    return _fake_quantize(ctx, c, ctx.static_int(c["axis"], "axis"))
