"""QuantizeLinear / DequantizeLinear for braze's quantize and dequantize (fake_quantize is written
as its decomposition, the pair). Before opset 19 ONNX takes only float32 x and scales: a float16 /
bfloat16 x or scale is cast to float32 around the op, which is what ONNX Runtime computes in
anyway, so the bits stay braze's."""
from __future__ import annotations

from ...ir.dtypes import f32, f64
from ...ir.ops.quant import Dequantize, Quantize
from .builder import ExportError, onnx_type
from .registry import exporter

_F32_ONLY_BEFORE = 19  # QuantizeLinear-19 / DequantizeLinear-19 add float16 and bfloat16


def _axis(n) -> dict:
    return {} if n.op.axis is None else {"axis": n.op.axis}


def _no_f64(n, dtype) -> None:
    if dtype == f64:
        raise ExportError(f"cannot export node {n.describe()}: ONNX's QuantizeLinear / "
                          "DequantizeLinear have no float64 form and braze computes this one in "
                          "float64; use a float32 scale (and x)")


def _to_f32(b, name: str, dtype) -> str:
    return name if dtype == f32 else b.op1("Cast", name, to=onnx_type(f32))


@exporter(Quantize)
def quantize(b, n, ins, target):
    x, scale, zp = ins
    dt = b.g.shape_of(n.inputs[0]).dtype
    _no_f64(n, dt)
    if dt != f32 and b.opset < _F32_ONLY_BEFORE:
        x, scale = _to_f32(b, x, dt), _to_f32(b, scale, dt)
    return [b.op1("QuantizeLinear", x, scale, zp, **_axis(n))]


@exporter(Dequantize)
def dequantize(b, n, ins, target):
    q, scale, zp = ins
    dt = n.outputs[0].dtype
    _no_f64(n, dt)
    if dt == f32 or b.opset >= _F32_ONLY_BEFORE:
        return [b.op1("DequantizeLinear", q, scale, zp, **_axis(n))]
    y = b.op1("DequantizeLinear", q, _to_f32(b, scale, dt), zp, **_axis(n))
    return [b.op1("Cast", y, to=onnx_type(dt))]
