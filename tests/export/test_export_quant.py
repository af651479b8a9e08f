"""ONNX export of quantization (braze/export/onnx/ops_quant.py): quantize / dequantize become
QuantizeLinear / DequantizeLinear and fake_quantize the pair; ONNX Runtime runs the exported
model to the interpreter's bits (per tensor and per axis, int8 / uint8, float32 / float16 /
bfloat16 at opset 17, where float16 goes through float32 casts, and at opset 21), and the model
imports back to the same graph semantics."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import braze as bz
from braze.export.onnx import ExportError


def _ort(path, feeds):
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)


def _graph(xdt, qdt, axis):
    g = bz.Graph("quant")
    x = g.input("x", bz.Shape((3, 4, 50), xdt))
    n = 1 if axis is None else (3, 4, 50)[axis]
    scale = np.linspace(0.01, 0.05, n).astype(xdt.np)
    zp = (np.arange(n) % 7 + (100 if qdt == bz.u8 else -3)).astype(qdt.np)
    if axis is None:
        scale, zp = scale[0], zp[0]
    q = g.quantize(x, scale, zp, axis=axis, dtype=qdt)
    w = g.param("w_q", bz.Shape((3, 4, 50), bz.i8))
    wf = g.dequantize(w, np.float32(0.02), np.int8(1))
    fq = g.fake_quantize(g.mul(x, 0.5), scale, zp, axis=axis, dtype=qdt)
    g.set_outputs([q, g.dequantize(q, scale, zp, axis=axis), fq, wf])
    return g


@pytest.mark.parametrize("opset", [17, 21])
@pytest.mark.parametrize("xdt", [bz.f32, bz.f16])
@pytest.mark.parametrize("qdt", [bz.i8, bz.u8])
@pytest.mark.parametrize("axis", [None, 1, 2])
def test_exported_quantization_runs_in_onnx_runtime_to_the_interpreters_bits(
        tmp_path, opset, xdt, qdt, axis):
    g = _graph(xdt, qdt, axis)
    rng = np.random.default_rng(0)
    with np.errstate(over="ignore"):
        x = (rng.normal(size=(3, 4, 50)) * 2).astype(xdt.np)
    x.reshape(-1)[:4] = [np.nan, np.inf, -1e4, 0.025]
    params = {"w_q": rng.integers(-128, 128, (3, 4, 50)).astype(np.int8)}
    want = bz.interpret(g, {"x": x}, params)
    path = bz.export_onnx(g, tmp_path / "q.onnx", target="standard", opset=opset, params=params)
    model = onnx.load(path)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("QuantizeLinear") == 2 and ops.count("DequantizeLinear") == 3
    for got, w in zip(_ort(path, {"x": x}), want, strict=True):
        assert got.dtype == w.dtype
        np.testing.assert_array_equal(got, w)
    back = bz.import_onnx(path)
    for got, w in zip(bz.interpret(back, {"x": x}), want, strict=True):
        np.testing.assert_array_equal(got, w)


def test_bfloat16_quantize_exports_through_float32_before_opset_19(tmp_path):
    g = bz.Graph("q")
    x = g.cast(g.input("x", bz.Shape((2, 8), bz.f32)), bz.bf16)
    q = g.quantize(x, 0.05, 3)
    g.set_outputs([q, g.cast(g.dequantize(q, g.cast(g.constant(np.float32(0.05)), bz.bf16), 3),
                             bz.f32)])
    feeds = {"x": np.linspace(-3, 3, 16, dtype=np.float32).reshape(2, 8)}
    want = bz.interpret(g, feeds)
    path = bz.export_onnx(g, tmp_path / "q.onnx", target="standard", opset=17)
    ops = [n.op_type for n in onnx.load(path).graph.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops
    for got, w in zip(_ort(path, feeds), want, strict=True):
        np.testing.assert_array_equal(got, w)


def test_float64_quantization_is_refused_naming_the_node(tmp_path):
    g = bz.Graph("q")
    x = g.input("x", bz.Shape((4,), bz.f64))
    g.set_outputs([g.quantize(x, np.float64(0.1))])
    with pytest.raises(ExportError, match=r"node %\d+ \(quantize\).*float64"):
        bz.export_onnx(g, tmp_path / "q.onnx")
