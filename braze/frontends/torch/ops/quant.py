"""torch's fake quantization (quantization-aware training): fake_quantize_per_tensor_affine and
fake_quantize_per_channel_affine over the full int8 (-128..127) or uint8 (0..255) range become
braze's fake_quantize with torch's arithmetic: x times the float32 reciprocal of the scale,
rounded half to even, plus the zero point, clamped, minus the zero point, times the scale
(`fake_quantize(x * (1 / scale), 1, zero_point) * scale`), so the forward values are torch's
and the gradient is straight-through where torch's mask is set. A range inside int8 or uint8
(reduce_range's 0..127, the symmetric -127..127, 4-bit) clamps the levels further. The fused
observer + fake quantize of torch's default QAT qconfigs (FusedMovingAvgObsFakeQuantize)
imports with its observer disabled, as a fake quantize with its stored scale and zero point.
Quantized tensors (quantize_per_tensor, dequantize) stay unsupported ops."""
from __future__ import annotations

import numpy as np

from ....ir.dtypes import i8, u8
from ....ir.op import Value
from ....ir.ops.quant import quant_range
from ..context import Call, Lazy, LazyParam, TorchContext, converter


def _range_dtype(ctx: TorchContext, qmin: int, qmax: int):
    """The 8-bit dtype holding [qmin, qmax] (int8 first)."""
    for dt in (i8, u8):
        lo, hi = quant_range(dt)
        if lo <= qmin <= qmax <= hi:
            return dt
    raise ctx.fail(f"fake quantization to [{qmin}, {qmax}] is not supported: braze "
                   "fake-quantizes to ranges inside int8 (-128..127) or uint8 (0..255)")


def _fake_quantize_affine(ctx: TorchContext, x: Value, scale, zero_point, qmin: int, qmax: int,
                         axis: int | None) -> Value:
    """torch's fake quantization of x to [qmin, qmax] with `scale` / `zero_point` (per tensor,
    or per channel along `axis`): x times 1 / scale, rounded half to even, plus the zero
    point, clamped, minus the zero point, times the scale."""
    g = ctx.g
    dt = ctx.dtype(x)
    qdt = _range_dtype(ctx, qmin, qmax)
    if not dt.is_float:
        raise ctx.fail(f"fake quantization needs a float input, got {dt}")
    scale = ctx.value(scale, dt)
    zp = ctx.value(zero_point if ctx.is_tensor(zero_point) else int(zero_point))
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
        scale, zp_along = g.reshape(scale, along), g.reshape(zp, along)
    else:
        scale, zp = (g.reshape(v, ()) if ctx.dims(v) else v for v in (scale, zp))
        y = g.fake_quantize(g.mul(x, g.div(ctx.value(1.0, dt), scale)), 1.0, zp)
        zp_along = zp
    if (qmin, qmax) != quant_range(qdt):  # a narrower range: clamp the levels (minus zp)
        zf = g.cast(zp_along, dt)
        lo, hi = (g.sub(ctx.value(float(q), dt), zf) for q in (qmin, qmax))
        y = g.where(g.lt(y, lo), lo, y)   # where, not max / min: a level on the bound
        y = g.where(g.gt(y, hi), hi, y)   # keeps its whole gradient, as torch's mask
    return g.mul(y, scale)


def _fake_quantize(ctx: TorchContext, c: Call, axis: int | None):
    qmin = ctx.static_int(c["quant_min"], "quant_min")
    qmax = ctx.static_int(c["quant_max"], "quant_max")
    return _fake_quantize_affine(ctx, ctx.value(c["self"]), c["scale"], c["zero_point"], qmin,
                                qmax, axis)


@converter("aten.fake_quantize_per_tensor_affine.default",
           "aten.fake_quantize_per_tensor_affine.tensor_qparams")
def fake_quantize_per_tensor(ctx, c):
    return _fake_quantize(ctx, c, None)


@converter("aten.fake_quantize_per_channel_affine.default")
def fake_quantize_per_channel(ctx, c):
    return _fake_quantize(ctx, c, ctx.static_int(c["axis"], "axis"))


def _flag(ctx: TorchContext, v, what: str) -> bool:
    """A 0 / 1 buffer of the module (an observer's on / off switch) read at import."""
    if not isinstance(v, LazyParam) or v.array.size != 1:
        raise ctx.fail(f"{what} must be a module buffer of one value, known at import")
    return bool(v.array.reshape(-1)[0])


@converter("aten._fused_moving_avg_obs_fq_helper_functional.default",
           "aten._fused_moving_avg_obs_fq_helper.default")
def fused_observer_fake_quantize(ctx, c):
    """FusedMovingAvgObsFakeQuantize with its observer off: the fake quantize alone (or x,
    fake_quant_on off); the observer's statistics pass through unchanged."""
    if _flag(ctx, c["observer_on"], "observer_on"):
        raise ctx.fail("the QAT observer is on (it updates scale / zero point from each batch, "
                       "which braze does not import); turn it off first: "
                       "model.apply(torch.ao.quantization.disable_observer)")
    x = ctx.value(c["self"])
    y = x
    if _flag(ctx, c["fake_quant_on"], "fake_quant_on"):
        axis = ctx.static_int(c["ch_axis"], "ch_axis") if c.get("per_row_fake_quant") else None
        y = _fake_quantize_affine(ctx, x, c["scale"], c["zero_point"],
                                  ctx.static_int(c["quant_min"], "quant_min"),
                                  ctx.static_int(c["quant_max"], "quant_max"), axis)

    def no_mask():
        raise ctx.fail("the fake quantize's mask output is not imported")

    stats = [c[k] for k in ("running_min", "running_max", "scale", "zero_point")]
    extra = [Lazy(lambda v=v: ctx.value(v)) for v in stats]
    if c.key.endswith("_functional.default"):
        return (y, Lazy(no_mask), *extra)
    return (y, Lazy(no_mask))
