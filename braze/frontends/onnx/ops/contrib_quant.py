"""ONNX Runtime's quantized element-wise contrib ops (com.microsoft), which
`onnxruntime.quantization.quantize_static(..., quant_format=QOperator)` writes between its
QLinearMatMul / QLinearConv nodes, computed as ONNX Runtime's MLAS kernels do:

- QLinearAdd: `fma(a, a_scale / c_scale, fma(b, b_scale / c_scale, bias))` with
  `bias = c_zp - a_zp * ra - b_zp * rb`, rounded half to even and saturated. The two fused
  multiply-adds are written exactly in float64 (8-bit times float32 products are exact there),
  each rounded once to float32.
- QLinearMul: `dequantize(a) * dequantize(b)` quantized with c's scale and zero point."""
from __future__ import annotations

import numpy as np

from ....ir.dtypes import f32, f64
from ....ir.ops.quant import QUANT_DTYPES
from ..context import ImportContext, NodeView
from .contrib import contrib
from .quant import quantized_dtype


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
