"""quantize / dequantize / fake_quantize: the references equal ONNX Runtime's QuantizeLinear /
DequantizeLinear bit for bit (ties round half to even, saturation, NaN, per-axis, float16
inputs); inference refuses bad scales, zero points and axes naming the node; the builder makes
constants of the right dtypes; text IR and JSON round trip."""
from __future__ import annotations

import numpy as np
import pytest

import braze as bz
from braze.ir.dtypes import dtype_from_numpy
from braze.ir.ops.quant import Dequantize, Quantize

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402

_NP_TO_ONNX = {np.dtype(np.float32): onnx.TensorProto.FLOAT,
               np.dtype(np.float16): onnx.TensorProto.FLOAT16,
               np.dtype(np.int8): onnx.TensorProto.INT8,
               np.dtype(np.uint8): onnx.TensorProto.UINT8,
               np.dtype(np.int32): onnx.TensorProto.INT32}


def ort_node(op_type: str, x: np.ndarray, scale, zp, axis=None) -> np.ndarray:
    """One ONNX QuantizeLinear / DequantizeLinear node (opset 21) run by ONNX Runtime."""
    attrs = {} if axis is None else {"axis": axis}
    node = helper.make_node(op_type, ["x", "s", "z"], ["y"], **attrs)
    out_dt = np.asarray(zp).dtype if op_type == "QuantizeLinear" else np.asarray(scale).dtype
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", _NP_TO_ONNX[x.dtype], x.shape)],
        [helper.make_tensor_value_info("y", _NP_TO_ONNX[out_dt], None)],
        [numpy_helper.from_array(np.asarray(scale), "s"),
         numpy_helper.from_array(np.asarray(zp), "z")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def hard_floats(rng, shape, scale: float) -> np.ndarray:
    """Random floats with exact ties (k + 0.5 quanta), huge values, infinities and NaN."""
    x = rng.normal(size=shape) * 100 * scale
    ties = (rng.integers(-300, 300, size=shape) + 0.5) * scale
    x = np.where(rng.random(shape) < 0.3, ties, x)
    flat = x.reshape(-1)
    flat[:6] = [np.nan, np.inf, -np.inf, 1e30, -1e30, 2.5 * scale]
    return x


def braze_op(build, x: np.ndarray) -> np.ndarray:
    g = bz.Graph("q")
    v = g.input("x", bz.Shape(x.shape, dtype_from_numpy(x.dtype)))
    g.set_outputs([build(g, v)])
    return bz.interpret(g, {"x": x})[0]


@pytest.mark.parametrize("qdt", [np.int8, np.uint8])
@pytest.mark.parametrize("xdt", [np.float32, np.float16])
def test_per_tensor_quantize_is_onnx_runtime_bit_for_bit(qdt, xdt):
    rng = np.random.default_rng(0)
    for scale in (1.0, 0.1, 0.0123, 3.7):
        with np.errstate(over="ignore"):  # 1e30 and friends are inf in float16
            x = hard_floats(rng, (7, 33), scale).astype(xdt)
        zp = qdt(rng.integers(0, 20) if qdt is np.uint8 else rng.integers(-10, 10))
        s = xdt(scale)
        got = braze_op(lambda g, v, s=s, zp=zp: g.quantize(v, s, zp,
                                                           dtype=dtype_from_numpy(qdt)), x)
        want = ort_node("QuantizeLinear", x, s, zp)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_ties_round_half_to_even_and_saturate():
    x = np.array([2.5, -2.5, 3.5, 0.5, -0.5, 1000.0, -1000.0, np.nan], np.float32)
    got = braze_op(lambda g, v: g.quantize(v, 1.0), x)
    np.testing.assert_array_equal(got, np.array([2, -2, 4, 0, 0, 127, -128, -128], np.int8))
    got = braze_op(lambda g, v: g.quantize(v, 1.0, 128, dtype=bz.u8), x)
    np.testing.assert_array_equal(got, np.array([130, 126, 132, 128, 128, 255, 0, 0], np.uint8))


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("qdt", [np.int8, np.uint8])
def test_per_axis_quantize_and_dequantize_are_onnx_runtime_bit_for_bit(axis, qdt):
    rng = np.random.default_rng(1)
    shape = (4, 5, 6)
    n = shape[axis]
    scale = (rng.random(n) * 0.2 + 0.01).astype(np.float32)
    lo, hi = (0, 30) if qdt is np.uint8 else (-10, 10)
    zp = rng.integers(lo, hi, size=n).astype(qdt)
    x = hard_floats(rng, shape, 0.05).astype(np.float32)
    dt = dtype_from_numpy(qdt)
    q = braze_op(lambda g, v: g.quantize(v, scale, zp, axis=axis, dtype=dt), x)
    np.testing.assert_array_equal(q, ort_node("QuantizeLinear", x, scale, zp, axis=axis))
    y = braze_op(lambda g, v: g.dequantize(v, scale, zp, axis=axis), q)
    np.testing.assert_array_equal(y, ort_node("DequantizeLinear", q, scale, zp, axis=axis))


@pytest.mark.parametrize("qdt,sdt", [(np.int8, np.float32), (np.uint8, np.float16),
                                     (np.int32, np.float32)])
def test_per_tensor_dequantize_is_onnx_runtime_bit_for_bit(qdt, sdt):
    rng = np.random.default_rng(2)
    info = np.iinfo(qdt)
    q = rng.integers(max(info.min, -2**20), min(info.max, 2**20), size=(5, 9),
                     endpoint=True).astype(qdt)
    zp = qdt(0 if qdt is np.int32 else rng.integers(0, 9))
    s = sdt(0.0173)
    got = braze_op(lambda g, v: g.dequantize(v, s, zp), q)
    want = ort_node("DequantizeLinear", q, s, zp)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_fake_quantize_is_the_round_trip():
    rng = np.random.default_rng(3)
    x = hard_floats(rng, (3, 8), 0.02).astype(np.float32)
    got = braze_op(lambda g, v: g.fake_quantize(v, 0.02, 5), x)
    want = ort_node("DequantizeLinear", ort_node("QuantizeLinear", x, np.float32(0.02),
                                                 np.int8(5)), np.float32(0.02), np.int8(5))
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.float32


def _x(g, shape=(2, 3)):
    return g.input("x", bz.Shape(shape, bz.f32))


@pytest.mark.parametrize("build, message", [
    (lambda g, x: g.quantize(x, [0.1, 0.2], axis=1),
     r"quantize node %\d+ .*1-D scale of length 3 \(x.shape\[1\]\), got f32\[2\]"),
    (lambda g, x: g.quantize(x, 0.1, g.constant(np.int32(0))),
     r"quantize node %\d+ .*i8 or u8 zero_point"),
    (lambda g, x: g.quantize(x, 0.1, axis=2), r"quantize node %\d+ .*axis 2 is out of range"),
    (lambda g, x: g.quantize(x, g.constant(np.float16(0.1))),
     r"quantize node .*scale of x's dtype f32"),
    (lambda g, x: g.quantize(x, g.constant(np.array([0.1, 0.2, 0.3], np.float32))),
     r"axis=None needs a scalar scale"),
    (lambda g, x: g.dequantize(g.quantize(x, 0.1), 0.1, g.constant(np.uint8(0))),
     r"dequantize node %\d+ .*zero_point of q's dtype i8, got u8"),
    (lambda g, x: g.dequantize(x, 0.1), r"dequantize node .*i8, u8 or i32 q, got f32"),
])
def test_inference_refuses_bad_parameters_naming_the_node(build, message):
    g = bz.Graph("bad")
    with pytest.raises(bz.ShapeError, match=message):
        build(g, _x(g))


def test_a_zero_point_outside_the_dtype_is_refused():
    g = bz.Graph("q")
    with pytest.raises(bz.GraphError, match=r"zero_point 200 does not fit i8 \[-128, 127\]"):
        g.quantize(_x(g), 0.1, 200)


def test_builder_makes_constants_of_the_right_dtypes():
    g = bz.Graph("q")
    x = g.input("x", bz.Shape((2, 3), bz.f16))
    q = g.quantize(x, 0.5, 7, axis=-1, dtype=bz.u8)
    node = g.node(q)
    assert node.op == Quantize(axis=1)
    assert [str(g.shape_of(v)) for v in node.inputs] == ["f16[2, 3]", "f16[3]", "u8[3]"]
    y = g.dequantize(q, np.array([1.0, 2.0, 3.0], np.float32), axis=1)
    assert g.node(y).op == Dequantize(axis=1)
    assert str(g.shape_of(y)) == "f32[2, 3]"
    assert str(g.shape_of(g.dequantize(q, np.float16(0.5), np.uint8(7)))) == "f16[2, 3]"


def test_text_ir_and_json_round_trip(tmp_path):
    g = bz.Graph("q")
    x = _x(g)
    q = g.quantize(x, [0.1, 0.2, 0.3], [1, 2, 3], axis=1, dtype=bz.u8)
    g.set_outputs([q, g.dequantize(q, [0.1, 0.2, 0.3], g.constant(np.uint8([1, 2, 3])), axis=1),
                   g.fake_quantize(x, 0.05)])
    bz.verify(g)
    text = str(g)
    assert "quantize[axis=1]" in text and "fake_quantize(" in text
    feeds = {"x": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)}
    want = bz.interpret(g, feeds)
    bz.save(g, tmp_path / "q.json")
    for other in (bz.Graph.parse(text), bz.load(tmp_path / "q.json")):
        assert str(other) == text
        for a, b in zip(bz.interpret(other, feeds), want):
            np.testing.assert_array_equal(a, b)
