"""ONNX Runtime's quantized element-wise contrib ops (com.microsoft), which
`onnxruntime.quantization.quantize_static(..., quant_format=QOperator)` writes between its
QLinearMatMul / QLinearConv nodes, computed as ONNX Runtime's MLAS kernels do:

- QLinearAdd: `fma(a, a_scale / c_scale, fma(b, b_scale / c_scale, bias))` with
  `bias = c_zp - a_zp * ra - b_zp * rb`, rounded half to even and saturated. The two fused
  multiply-adds are written exactly in float64 (8-bit times float32 products are exact there),
  each rounded once to float32.
- QLinearMul: `dequantize(a) * dequantize(b)` quantized with c's scale and zero point.
- QGemm: QLinearMatMul's integer product with transA / transB, alpha and an int32 C, in float32
  (no y_scale) or requantized.
- QLinearSigmoid, QLinearLeakyRelu and QLinearConcat: the standard op's converter on the
  dequantized inputs, then a quantize (ORT's lookup tables hold exactly those values);
  QLinearAveragePool, QLinearGlobalAveragePool and QLinearSoftmax in ORT's own float-window /
  integer / table arithmetic; NHWC (channels_last) pooling is refused.
- MatMulIntegerToFloat and DynamicQuantizeMatMul (ORT's optimizer fuses a dynamically quantized
  model's matmuls into them): the integer product times a_scale * b_scale, plus bias."""
from __future__ import annotations

import itertools
import math

import numpy as np

from ....ir.dtypes import f32, f64, i32
from ....ir.op import Value
from ....ir.ops.quant import QUANT_DTYPES
from ....ir.symbolic import SymDim
from ..context import CONVERTERS, ImportContext, NodeView, Tensor
from .contrib import contrib
from .nn import pool_setup
from .quant import dynamic_quantized, integer_matmul, quantized_dtype, requantize


def _operands(ctx: ImportContext, node: NodeView):
    """(a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp) with per-tensor parameters."""
    vals = []
    for i in range(8):
        v = ctx.value(node, i) if ctx.has(node, i) else None
        if i in (1, 2, 4, 5, 6, 7) and v is not None and ctx.dims(v):
            if len(ctx.dims(v)) != 1 or ctx.dims(v)[0] != 1:
                raise ctx.fail(node, f"input {i} must be a scalar (per-tensor quantization), "
                                     f"got {list(ctx.dims(v))}")
            v = ctx.g.reshape(v, ())
        vals.append(v)
    a, b = vals[0], vals[3]
    qdt = quantized_dtype(ctx, node, ctx.dtype(a), QUANT_DTYPES, "input A")
    if ctx.dtype(b) != qdt:
        raise ctx.fail(node, f"inputs A and B are {qdt} and {ctx.dtype(b)}")
    g = ctx.g
    for i in (2, 5, 7):
        if vals[i] is None:
            vals[i] = g.constant(np.zeros((), qdt.np), qdt)
    for i in (1, 4, 6):
        if ctx.dtype(vals[i]) != f32:
            raise ctx.fail(node, f"scale input {i} is {ctx.dtype(vals[i])}, not float32")
    return vals


@contrib("QLinearAdd")
def qlinear_add(ctx: ImportContext, node: NodeView):
    g = ctx.g
    a, a_s, a_zp, b, b_s, b_zp, c_s, c_zp = _operands(ctx, node)
    ra, rb = g.div(a_s, c_s), g.div(b_s, c_s)
    za, zb, zc = (g.cast(v, f32) for v in (a_zp, b_zp, c_zp))
    bias = g.sub(g.sub(zc, g.mul(za, ra)), g.mul(zb, rb))

    def fma(x, y, z):  # x * y + z rounded once to float32 (x 8-bit, y and z float32)
        return g.cast(g.add(g.mul(g.cast(x, f64), g.cast(y, f64)), g.cast(z, f64)), f32)

    y = fma(a, ra, fma(b, rb, bias))
    zero = g.constant(np.zeros((), ctx.dtype(c_zp).np), ctx.dtype(c_zp))
    return [g.quantize(y, 1.0, zero)]


@contrib("QLinearMul")
def qlinear_mul(ctx: ImportContext, node: NodeView):
    g = ctx.g
    a, a_s, a_zp, b, b_s, b_zp, c_s, c_zp = _operands(ctx, node)
    y = g.mul(g.dequantize(a, a_s, a_zp), g.dequantize(b, b_s, b_zp))
    return [g.quantize(y, c_s, c_zp)]


# -- QOperator ops computed in float between a dequantize and a quantize ----------------------
def _zero_point(ctx: ImportContext, node: NodeView, i: int, qdt) -> Value:
    """Zero point input `i` as a scalar of `qdt` (zeros when absent)."""
    if not ctx.has(node, i):
        return ctx.g.constant(np.zeros((), qdt.np), qdt)
    zp = ctx.value(node, i)
    if ctx.dtype(zp) != qdt:
        raise ctx.fail(node, f"zero point input {i} is {ctx.dtype(zp)}, not {qdt}")
    return _scalar(ctx, node, zp, i)


def _scalar(ctx: ImportContext, node: NodeView, v: Value, i: int) -> Value:
    dims = ctx.dims(v)
    if dims and tuple(dims) != (1,):
        raise ctx.fail(node, f"input {i} must be a scalar (per-tensor quantization), got "
                             f"{list(dims)}")
    return ctx.g.reshape(v, ()) if dims else v


def _scale(ctx: ImportContext, node: NodeView, i: int) -> Value:
    v = ctx.value(node, i)
    if ctx.dtype(v) != f32:
        raise ctx.fail(node, f"scale input {i} is {ctx.dtype(v)}, not float32")
    return _scalar(ctx, node, v, i)


def _dequantized(ctx: ImportContext, node: NodeView, i: int) -> Value:
    """Input `i` (8-bit) dequantized with scale input i + 1 and zero point input i + 2."""
    q = ctx.value(node, i)
    qdt = quantized_dtype(ctx, node, ctx.dtype(q), QUANT_DTYPES, f"input {i}")
    return ctx.g.dequantize(q, _scale(ctx, node, i + 1), _zero_point(ctx, node, i + 2, qdt))


def _float_op(ctx: ImportContext, node: NodeView, op_type: str, xs: list[Value],
              attrs: dict) -> Value:
    """The standard ONNX `op_type` with `attrs` on the float values `xs` (its converter)."""
    names = [f"{node.outputs[0]}::{op_type}:{i}" for i in range(len(xs))]
    for name, x in zip(names, xs, strict=True):
        ctx.env[name] = Tensor(value=x)
    view = NodeView(op_type, node.name, names, node.outputs[:1], attrs)
    return CONVERTERS[op_type](ctx, view)[0]


def _requantized(ctx: ImportContext, node: NodeView, y: Value, i: int, qdt) -> Value:
    """Float y quantized with scale input `i` and zero point input i + 1 (else `qdt` zeros)."""
    zp = _zero_point(ctx, node, i + 1, ctx.dtype(ctx.value(node, i + 1))
                     if ctx.has(node, i + 1) else qdt)
    quantized_dtype(ctx, node, ctx.dtype(zp), QUANT_DTYPES, "the output zero point")
    return ctx.g.quantize(y, _scale(ctx, node, i), zp)


def _qdt(ctx: ImportContext, node: NodeView, i: int = 0):
    return quantized_dtype(ctx, node, ctx.dtype(ctx.value(node, i)), QUANT_DTYPES, "input X")


def _no_channels_last(ctx: ImportContext, node: NodeView) -> None:
    if node.attr("channels_last", 0):
        raise ctx.fail(node, "channels_last=1 is not supported (braze imports NCHW pooling)")


@contrib("QLinearSigmoid", "QLinearLeakyRelu")
def qlinear_unary(ctx: ImportContext, node: NodeView):
    op = node.op_type[len("QLinear"):]
    attrs = {"alpha": node.attr("alpha", 0.01)} if op == "LeakyRelu" else {}
    y = _float_op(ctx, node, op, [_dequantized(ctx, node, 0)], attrs)
    return [_requantized(ctx, node, y, 3, _qdt(ctx, node))]


@contrib("QLinearGlobalAveragePool")
def qlinear_global_average_pool(ctx: ImportContext, node: NodeView):
    """ONNX Runtime's MLAS arithmetic: per channel the integer sum of x - x_zero_point over the
    H * W (...) positions, requantized with `x_scale / (y_scale * float32(H * W))` as
    QLinearMatMul is (rint, plus y_zero_point, saturated)."""
    _no_channels_last(ctx, node)
    g = ctx.g
    x = ctx.value(node, 0)
    qdt = _qdt(ctx, node)
    dims = ctx.dims(x)
    if len(dims) < 3:
        raise ctx.fail(node, f"needs an input of rank >= 3 ([N, C, ...]), got {list(dims)}")
    spatial = tuple(range(2, len(dims)))
    centred = g.sub(g.cast(x, f64), g.cast(_zero_point(ctx, node, 2, qdt), f64))
    acc = g.cast(g.sum(centred, spatial, keepdims=True), i32)  # exact: |sum| < 2^32
    scale = g.div(_scale(ctx, node, 1), g.mul(_scale(ctx, node, 3), _row_length(g, dims[2:])))
    zp = _zero_point(ctx, node, 4, ctx.dtype(ctx.value(node, 4)) if ctx.has(node, 4) else qdt)
    return [requantize(ctx, node, acc, scale, zp)]


@contrib("QLinearAveragePool")
def qlinear_average_pool(ctx: ImportContext, node: NodeView):
    """ONNX Runtime's arithmetic: each window's dequantized values summed in float32 in row-major
    order, divided by the window's size (its real elements unless count_include_pad), then
    `rint(y / y_scale + y_zero_point)` (the zero point added before rounding), saturated.
    Symbolic spatial sizes fall back to braze's average pool (whose sums may run in another
    order: a value at a rounding boundary may then differ by one quantum); ORT's 1-D pooling
    rounds differently at rare ties (1 random case in 400)."""
    _no_channels_last(ctx, node)
    g = ctx.g
    attrs = {k: v for k, v in node.attrs.items() if k != "channels_last"}
    xd = _dequantized(ctx, node, 0)
    if all(isinstance(d, int) for d in ctx.dims(xd)):
        y = _window_average_in_order(ctx, node, xd, attrs)
    else:
        y = _float_op(ctx, node, "AveragePool", [xd], attrs)
    qdt = _qdt(ctx, node)
    zp = _zero_point(ctx, node, 4, ctx.dtype(ctx.value(node, 4)) if ctx.has(node, 4) else qdt)
    shifted = g.add(g.div(y, _scale(ctx, node, 3)), g.cast(zp, f32))
    return [g.quantize(shifted, 1.0, g.constant(np.zeros((), ctx.dtype(zp).np), ctx.dtype(zp)))]


def _window_average_in_order(ctx: ImportContext, node: NodeView, x: Value, attrs: dict) -> Value:
    """AveragePool of static-shaped float32 x with every window summed in row-major order."""
    g = ctx.g
    name = f"{node.outputs[0]}::AveragePool:0"
    ctx.env[name] = Tensor(value=x)
    view = NodeView("AveragePool", node.name, [name], node.outputs[:1], attrs)
    x, n, kernel, strides, triples = pool_setup(ctx, view)
    spatial = [(lo, hi + extra) for lo, hi, extra in triples]
    sizes = [int(d) + lo + hi for d, (lo, hi) in zip(ctx.dims(x)[2:], spatial, strict=True)]
    outs = [(size - k) // s + 1 for size, k, s in zip(sizes, kernel, strides, strict=True)]

    def window_sums(v: Value) -> Value:
        v = g.pad(v, [(0, 0), (0, 0)] + spatial)
        total = None
        for offsets in itertools.product(*(range(k) for k in kernel)):
            part = v
            for d, (off, s, o) in enumerate(zip(offsets, strides, outs, strict=True)):
                part = g.slice(part, 2 + d, off, off + (o - 1) * s + 1, s)
            total = part if total is None else g.add(total, part)
        return total

    if node.attr("count_include_pad", 0):
        count = g.constant(np.float32(math.prod(kernel)), f32)
    else:
        count = window_sums(g.constant(np.ones((1, 1) + tuple(ctx.dims(x)[2:]), np.float32),
                                       f32))
    return g.div(window_sums(x), count)


@contrib("QLinearSoftmax")
def qlinear_softmax(ctx: ImportContext, node: NodeView):
    """ONNX Runtime's lookup-table softmax, in its arithmetic: per row (the `axis`, or before
    opset 13 the axes from `axis` flattened, as the `opset` attribute says) of D values,
    `t = float32(exp((x - max(x) + c / x_scale) * x_scale))` in float64 with
    `c = max(0, log(float32(FLT_MAX / D)) - 5)`, then
    `rint(fma(t, (1 / sum(t)) * floor(1 / y_scale), y_zp))`, saturated (the float softmax
    quantized differs wherever 1 / y_scale is not an integer); a NaN (an infinite x_scale,
    which quantize_static calibrates from an attention mask of -inf) gives 0. ONNX Runtime
    sums rows of 32 and more in vector lanes: a value at a rounding boundary may then differ
    by one quantum."""
    g = ctx.g
    opset = int(node.attr("opset", ctx.opset))
    x = ctx.value(node, 0)
    qdt = _qdt(ctx, node)
    dims = ctx.dims(x)
    rank = len(dims)
    axis = int(node.attr("axis", -1 if opset >= 13 else 1))
    if not -rank <= axis < rank:
        raise ctx.fail(node, f"axis {axis} is out of range for rank {rank}")
    axis %= rank
    row = dims[axis:] if opset < 13 else (dims[axis],)
    if opset < 13:
        x = g.reshape(x, tuple(dims[:axis]) + (-1,))
    red = len(ctx.dims(x)) - 1 if opset < 13 else axis
    xf = g.cast(x, f64)
    x_scale = g.cast(_scale(ctx, node, 1), f64)
    shift = g.maximum(g.sub(g.activation(g.cast(g.div(
        g.constant(np.finfo(np.float32).max, f32), _row_length(g, row)), f64), "log"), 5.0), 0.0)
    centred = g.sub(xf, g.reduce_max(xf, red, keepdims=True))
    level = g.add(centred, g.div(shift, x_scale))
    t = g.cast(g.activation(g.mul(level, x_scale), "exp"), f32)
    one = g.constant(np.float32(1.0), f32)
    y_levels = g.activation(g.div(one, _scale(ctx, node, 3)), "floor")
    multiplier = g.mul(g.div(one, g.sum(t, red, keepdims=True)), y_levels)
    zp = _zero_point(ctx, node, 4, ctx.dtype(ctx.value(node, 4)) if ctx.has(node, 4) else qdt)
    fused = g.add(g.mul(g.cast(t, f64), g.cast(multiplier, f64)), g.cast(zp, f64))  # exact
    zero = g.constant(np.zeros((), ctx.dtype(zp).np), ctx.dtype(zp))
    fused = g.where(g.isnan(fused), 0.0, fused)  # ORT's int32 conversion of NaN, cast: 0
    y = g.quantize(g.cast(fused, f32), 1.0, zero)
    return [g.reshape(y, dims) if opset < 13 else y]


def _row_length(g, dims) -> Value:
    """The product of `dims` as a float32 scalar (a run-time value when symbolic)."""
    n = SymDim.of(1)
    for d in dims:
        n = n * SymDim.of(d)
    if n.is_const:
        return g.constant(np.float32(n.const), f32)
    return g.sym_const((n.to_dim(),), shape=(), dtype=f32)


@contrib("QLinearConcat")
def qlinear_concat(ctx: ImportContext, node: NodeView):
    """Inputs: Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) per operand."""
    if (len(node.inputs) - 2) % 3:
        raise ctx.fail(node, f"needs 2 + 3 * n inputs, got {len(node.inputs)}")
    xs = [_dequantized(ctx, node, i) for i in range(2, len(node.inputs), 3)]
    y = _float_op(ctx, node, "Concat", xs, {"axis": node.attr("axis")})
    qdt = ctx.dtype(ctx.value(node, 1))
    quantized_dtype(ctx, node, qdt, QUANT_DTYPES, "Y_zero_point")
    return [ctx.g.quantize(y, _scale(ctx, node, 0), _zero_point(ctx, node, 1, qdt))]


@contrib("QGemm")
def qgemm(ctx: ImportContext, node: NodeView):
    """alpha * (A' - a_zp) @ (B' - b_zp) + C (int32, in the product's scale), computed in
    integers; float32 out as `acc * (alpha * a_scale * b_scale)`, or with y_scale requantized
    as QLinearMatMul is (`acc * (alpha * a_scale * b_scale / y_scale)`, half to even)."""
    g = ctx.g
    a, b = ctx.value(node, 0), ctx.value(node, 3)
    if node.attr("transA", 0):
        a = g.transpose(a, (1, 0))
    b_zp = ctx.opt_value(node, 5)
    if node.attr("transB", 0):
        b = g.transpose(b, (1, 0))
    acc = integer_matmul(ctx, node, a, b, ctx.opt_value(node, 2), b_zp)
    if ctx.has(node, 6):
        c = ctx.value(node, 6)
        if ctx.dtype(c) != i32:
            raise ctx.fail(node, f"C must be int32, got {ctx.dtype(c)}")
        acc = g.add(acc, c)
    a_scale = _scale(ctx, node, 1)
    b_scale = ctx.value(node, 4)
    if ctx.dtype(b_scale) != f32:
        raise ctx.fail(node, f"scale input 4 is {ctx.dtype(b_scale)}, not float32")
    if ctx.dims(b_scale) == (1,):
        b_scale = g.reshape(b_scale, ())
    scale = g.mul(g.mul(ctx.const_like(float(node.attr("alpha", 1.0)), a_scale), a_scale),
                  b_scale)
    if not ctx.has(node, 7):
        return [g.mul(g.cast(acc, f32), scale)]
    return [requantize(ctx, node, acc, g.div(scale, _scale(ctx, node, 7)),
                       _zero_point(ctx, node, 8, _qdt(ctx, node)))]


# -- ORT's optimizer's fusions of dynamically quantized matmuls -------------------------------
def _scaled_product(ctx: ImportContext, node: NodeView, acc: Value, a_scale: Value,
                    b_scale: Value, bias_at: int) -> Value:
    """float32(acc) * (a_scale * b_scale) (+ bias input `bias_at`), b_scale scalar or per
    column [N]."""
    g = ctx.g
    for s in (a_scale, b_scale):
        if ctx.dtype(s) != f32:
            raise ctx.fail(node, f"scales must be float32, got {ctx.dtype(s)}")
    if ctx.dims(a_scale):
        a_scale = _scalar(ctx, node, a_scale, 2)
    if ctx.dims(b_scale) == (1,):
        b_scale = g.reshape(b_scale, ())
    y = g.mul(g.cast(acc, f32), g.mul(a_scale, b_scale))
    return g.add(y, ctx.value(node, bias_at)) if ctx.has(node, bias_at) else y


@contrib("MatMulIntegerToFloat")
def matmul_integer_to_float(ctx: ImportContext, node: NodeView):
    """Inputs A, B, a_scale, b_scale, a_zero_point?, b_zero_point?, bias?: MatMulInteger's
    int32 product, then float32 times a_scale * b_scale, plus bias."""
    acc = integer_matmul(ctx, node, ctx.value(node, 0), ctx.value(node, 1),
                         ctx.opt_value(node, 4), ctx.opt_value(node, 5))
    return [_scaled_product(ctx, node, acc, ctx.value(node, 2), ctx.value(node, 3), 6)]


@contrib("DynamicQuantizeMatMul")
def dynamic_quantize_matmul(ctx: ImportContext, node: NodeView):
    """Inputs A (float32), B, b_scale, b_zero_point?, bias?: A quantized to uint8 as
    DynamicQuantizeLinear does, then MatMulIntegerToFloat's arithmetic."""
    q, a_scale, a_zp = dynamic_quantized(ctx, node, ctx.value(node, 0))
    acc = integer_matmul(ctx, node, q, ctx.value(node, 1), a_zp, ctx.opt_value(node, 3))
    return [_scaled_product(ctx, node, acc, a_scale, ctx.value(node, 2), 4)]
