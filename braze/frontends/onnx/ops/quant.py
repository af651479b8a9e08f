"""ONNX quantization ops: QuantizeLinear and DequantizeLinear (opsets 10..23, per tensor and per
axis) as braze's quantize / dequantize (QuantizeLinear-23 divides in the scale's type or its
`precision`, a half-precision quotient rounded to that type); DynamicQuantizeLinear written
out as the spec and ONNX Runtime compute it; MatMulInteger, ConvInteger, QLinearMatMul and
QLinearConv in integer arithmetic as ONNX Runtime does it.

The integer products run as float64 matmuls / convs of the zero-point-centred operands, exact
for every 8-bit input (a sum must pass 2^53 to round), then become int32. QLinear ops requantize
as ONNX Runtime's MLAS does: the int32 accumulator converted to float32, times the float32
multiplier `a_scale * b_scale / y_scale`, rounded half to even, plus the output zero point,
saturated (a braze quantize with scale 1). Block quantization, float8, int4 and 16-bit integer
types are refused naming the node."""
from __future__ import annotations

import numpy as np

from ....errors import UnsupportedOpsError
from ....ir.dtypes import bf16, f16, f32, f64, i8, i32, u8
from ....ir.op import Value
from ....ir.ops.quant import QUANT_DTYPES
from ..context import ImportContext, NodeView, converter
from ..dtypes import ONNX_TO_BRAZE, onnx_type_name
from .nn import convolve


def _unsupported(ctx: ImportContext, node: NodeView, what: str) -> UnsupportedOpsError:
    return UnsupportedOpsError(f"{ctx.source}: node {node.label}: {what} is not supported by "
                               "braze (8-bit per-tensor and per-axis quantization is); "
                               "re-quantize the model to int8 / uint8", {node.op_type: node.name})


def _no_blocks(ctx: ImportContext, node: NodeView) -> None:
    if node.attr("block_size", 0):
        raise _unsupported(ctx, node, f"block quantization (block_size="
                                      f"{node.attr('block_size')})")


def quantized_dtype(ctx: ImportContext, node: NodeView, dtype, allowed, what: str):
    """`dtype` if it is one of `allowed`, else UnsupportedOpsError naming the node."""
    if dtype not in allowed:
        raise _unsupported(ctx, node, f"{what} of type {dtype}")
    return dtype


def _output_dtype(ctx: ImportContext, node: NodeView):
    """QuantizeLinear-21's output_dtype attribute (0 / absent: from the zero point, else u8)."""
    code = int(node.attr("output_dtype", 0))
    if not code:
        return None
    if code not in ONNX_TO_BRAZE:
        raise _unsupported(ctx, node, f"output_dtype {onnx_type_name(code)}")
    return quantized_dtype(ctx, node, ONNX_TO_BRAZE[code], QUANT_DTYPES, "output_dtype")


def _params(ctx: ImportContext, node: NodeView, x: Value, scale: Value, zp: Value | None,
            zp_dtype) -> tuple[Value, Value, int | None]:
    """(scale, zero point, braze axis): per tensor for a scalar or one-element scale (as ONNX
    Runtime reads it, whatever `axis` says), per axis for a longer 1-D scale; a missing zero
    point is zeros."""
    g = ctx.g
    rank = len(ctx.dims(x))
    sdims = ctx.dims(scale)
    axis = None
    if len(sdims) > 1:
        raise _unsupported(ctx, node, f"a scale of shape {list(sdims)} (block quantization)")
    if sdims == (1,):
        scale = g.reshape(scale, ())
    elif len(sdims) == 1:
        ax = int(node.attr("axis", 1)) if ctx.opset >= 13 else 0
        if not -rank <= ax < rank:
            raise ctx.fail(node, f"axis {ax} is out of range for input rank {rank}")
        axis = ax % rank
    if zp is None:
        zp = g.constant(np.zeros(tuple(ctx.dims(scale)), zp_dtype.np), zp_dtype)
    elif axis is None and ctx.dims(zp):
        zp = g.reshape(zp, ())
    return scale, zp, axis


@converter("QuantizeLinear")
def quantize_linear(ctx: ImportContext, node: NodeView):
    _no_blocks(ctx, node)
    g = ctx.g
    x, scale = ctx.value(node, 0), ctx.value(node, 1)
    zp = ctx.opt_value(node, 2)
    out = _output_dtype(ctx, node)
    if zp is not None:
        quantized_dtype(ctx, node, ctx.dtype(zp), QUANT_DTYPES, "a zero point")
        if out is not None and out != ctx.dtype(zp):
            raise ctx.fail(node, f"output_dtype {out} differs from the zero point's "
                                 f"{ctx.dtype(zp)}")
    division = _division_dtype(ctx, node, scale)
    x, scale = (v if ctx.dtype(v) == division else g.cast(v, division) for v in (x, scale))
    scale, zp, axis = _params(ctx, node, x, scale, zp, out or u8)
    if ctx.opset >= 23 and division in (f16, bf16):
        x, scale = _divided_in_half_precision(ctx, x, scale, axis)
    return [g.quantize(x, scale, zp, axis=axis)]


def _division_dtype(ctx: ImportContext, node: NodeView, scale: Value):
    """The dtype QuantizeLinear divides x by the scale in: from opset 23 the `precision`
    attribute's, else the scale's (x may differ); before, x's (the scale has x's type)."""
    if ctx.opset < 23:
        return ctx.dtype(ctx.value(node, 0))
    code = int(node.attr("precision", 0))
    if not code:
        return ctx.dtype(scale)
    dt = ONNX_TO_BRAZE.get(code)
    if dt not in (f32, f16, bf16, f64):
        raise _unsupported(ctx, node, f"precision {onnx_type_name(code)}")
    return dt


def _divided_in_half_precision(ctx: ImportContext, x: Value, scale: Value, axis: int | None):
    """(x / scale in their half-precision dtype, ones shaped like scale): QuantizeLinear-23
    rounds the quotient to float16 / bfloat16 before rounding it to an integer (ONNX Runtime),
    where braze's quantize (and ONNX Runtime before opset 23) divides half-precision values in
    float32; the two differ where the float32 quotient lies just off a half."""
    g = ctx.g
    rank = len(ctx.dims(x))
    along = scale if axis is None else g.reshape(
        scale, tuple(-1 if a == axis else 1 for a in range(rank)))
    one = ctx.const_like(1.0, x)
    return g.div(x, along), g.where(g.isnan(scale), one, one)  # ones of scale's shape


@converter("DequantizeLinear")
def dequantize_linear(ctx: ImportContext, node: NodeView):
    _no_blocks(ctx, node)
    g = ctx.g
    q, scale = ctx.value(node, 0), ctx.value(node, 1)
    quantized_dtype(ctx, node, ctx.dtype(q), (i8, u8, i32), "a quantized input")
    scale, zp, axis = _params(ctx, node, q, scale, ctx.opt_value(node, 2), ctx.dtype(q))
    y = g.dequantize(q, scale, zp, axis=axis)
    code = int(node.attr("output_dtype", 0))
    if code and ONNX_TO_BRAZE.get(code) != ctx.dtype(y):
        if code not in ONNX_TO_BRAZE:
            raise _unsupported(ctx, node, f"output_dtype {onnx_type_name(code)}")
        y = g.cast(y, ONNX_TO_BRAZE[code])
    return [y]


@converter("DynamicQuantizeLinear")
def dynamic_quantize_linear(ctx: ImportContext, node: NodeView):
    """uint8 x with scale (max - min) / 255 and zero point round(clip(-min / scale, 0, 255))
    over the range [min(x, 0), max(x, 0)]; a range of 0 (x all zero) has scale 1, as ONNX
    Runtime computes it."""
    return list(dynamic_quantized(ctx, node, ctx.value(node, 0)))


def dynamic_quantized(ctx: ImportContext, node: NodeView, x: Value):
    """(u8 q, scale, zero point) of float32 x, per tensor, by DynamicQuantizeLinear's
    formulas (also ORT's DynamicQuantizeMatMul's)."""
    g = ctx.g
    if ctx.dtype(x) != f32:
        raise ctx.fail(node, f"{node.op_type} takes a float32 input, got {ctx.dtype(x)}")
    zero = ctx.const_like(0.0, x)
    lo = g.minimum(g.reduce_min(x), zero)
    hi = g.maximum(g.reduce_max(x), zero)
    span = g.sub(hi, lo)
    scale = g.where(g.eq(span, zero), ctx.const_like(1.0, x),
                    g.div(span, ctx.const_like(255.0, x)))
    zp = g.cast(g.activation(g.clamp(g.sub(zero, g.div(lo, scale)), 0.0, 255.0), "round"), u8)
    return g.quantize(x, scale, zp), scale, zp


def _centred(ctx: ImportContext, node: NodeView, v: Value, zp: Value | None, what: str,
             zp_axis: int) -> Value:
    """`v - zero_point` in float64 (exact for 8-bit values); a 1-D zero point lies along
    `zp_axis` of v."""
    g = ctx.g
    quantized_dtype(ctx, node, ctx.dtype(v), QUANT_DTYPES, what)
    out = g.cast(v, f64)
    if zp is None:
        return out
    if ctx.dtype(zp) != ctx.dtype(v):
        raise ctx.fail(node, f"the zero point of {what} is {ctx.dtype(zp)}, not its "
                             f"{ctx.dtype(v)}")
    zdims = ctx.dims(zp)
    zf = g.cast(zp, f64)
    rank = len(ctx.dims(v))
    if len(zdims) == 1 and zdims[0] != 1:
        zf = g.reshape(zf, tuple(-1 if a == zp_axis % rank else 1 for a in range(rank)))
    elif zdims:
        zf = g.reshape(zf, ())
    return g.sub(out, zf)


def integer_matmul(ctx, node, a, b, a_zp, b_zp) -> Value:
    """int32 `(a - a_zp) @ (b - b_zp)`: a per-row zero point of a is [M], of b per column [N]."""
    g = ctx.g
    ac = _centred(ctx, node, a, a_zp, "input A", -2)
    bc = _centred(ctx, node, b, b_zp, "input B", -1)
    return g.cast(g.matmul(ac, bc), i32)


def requantize(ctx, node, acc: Value, multiplier: Value, zp: Value) -> Value:
    """ONNX Runtime's requantization of an int32 accumulator: float32(acc) * multiplier,
    rounded half to even, plus the zero point, saturated to the zero point's dtype."""
    g = ctx.g
    quantized_dtype(ctx, node, ctx.dtype(zp), QUANT_DTYPES, "the output zero point")
    if ctx.dims(zp):
        zp = g.reshape(zp, ())
    y = g.mul(g.cast(acc, f32), multiplier)
    return g.quantize(y, 1.0, zp)


def _f32_scale(ctx, node, i: int) -> Value:
    """Scale input `i` in float32 (the type ONNX Runtime requantizes in)."""
    v = ctx.value(node, i)
    if not ctx.dtype(v).is_float:
        raise ctx.fail(node, f"scale input {i} is {ctx.dtype(v)}, not a float")
    return v if ctx.dtype(v) == f32 else ctx.g.cast(v, f32)


@converter("MatMulInteger")
def matmul_integer(ctx: ImportContext, node: NodeView):
    return [integer_matmul(ctx, node, ctx.value(node, 0), ctx.value(node, 1),
                            ctx.opt_value(node, 2), ctx.opt_value(node, 3))]


@converter("QLinearMatMul")
def qlinear_matmul(ctx: ImportContext, node: NodeView):
    g = ctx.g
    a, b = ctx.value(node, 0), ctx.value(node, 3)
    acc = integer_matmul(ctx, node, a, b, ctx.value(node, 2), ctx.value(node, 5))
    a_scale = _f32_scale(ctx, node, 1)
    if len(ctx.dims(a_scale)) == 1 and ctx.dims(a_scale)[0] != 1:  # per row of a: [M, 1]
        a_scale = g.reshape(a_scale, (-1, 1))
    multiplier = g.div(g.mul(a_scale, _f32_scale(ctx, node, 4)), _f32_scale(ctx, node, 6))
    return [requantize(ctx, node, acc, multiplier, ctx.value(node, 7))]


def _integer_conv(ctx, node, x, x_zp, w, w_zp, bias=None) -> Value:
    """int32 conv of the centred x and w (a 1-D w zero point per output channel) + bias."""
    g = ctx.g
    if x_zp is not None and ctx.dims(x_zp) not in ((), (1,)):
        raise ctx.fail(node, f"the x zero point must be a scalar, got {list(ctx.dims(x_zp))}")
    xc = _centred(ctx, node, x, x_zp, "input x", 0)
    wc = _centred(ctx, node, w, w_zp, "weight w", 0)
    if bias is not None:
        if ctx.dtype(bias) != i32:
            raise ctx.fail(node, f"the bias must be int32, got {ctx.dtype(bias)}")
        bias = g.cast(bias, f64)
    return g.cast(convolve(ctx, node, xc, wc, bias), i32)


@converter("ConvInteger")
def conv_integer(ctx: ImportContext, node: NodeView):
    return [_integer_conv(ctx, node, ctx.value(node, 0), ctx.opt_value(node, 2),
                          ctx.value(node, 1), ctx.opt_value(node, 3))]


@converter("QLinearConv")
def qlinear_conv(ctx: ImportContext, node: NodeView):
    g = ctx.g
    acc = _integer_conv(ctx, node, ctx.value(node, 0), ctx.value(node, 2), ctx.value(node, 3),
                        ctx.value(node, 5), ctx.opt_value(node, 8))
    w_scale = _f32_scale(ctx, node, 4)
    multiplier = g.div(g.mul(_f32_scale(ctx, node, 1), w_scale), _f32_scale(ctx, node, 6))
    rank = len(ctx.dims(acc))
    if ctx.dims(multiplier):  # per output channel: along axis 1 of [N, M, *spatial]
        multiplier = g.reshape(multiplier, (-1,) + (1,) * (rank - 2))
    return [requantize(ctx, node, acc, multiplier, ctx.value(node, 7))]
