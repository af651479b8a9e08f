"""Whole quantized models: a float 2-layer MLP and a small conv net built with onnx.helper,
quantized by onnxruntime.quantization (quantize_static with a calibration reader of random data
in QDQ and QOperator formats, the MLP's QOperator form with com.microsoft QLinearAdd, and
quantize_dynamic, also as ORT's optimizer saves it), and a CNN classifier whose QOperator form
uses ORT's other contrib QLinear ops, import into braze; the interpreter gives ONNX Runtime's
outputs bit for bit (with ORT's graph optimizations on, which fuse QDQ pairs into integer
kernels, and off), and the compiled executor too up to float32 rounding of the dynamic models'
final float multiply-add."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import braze as bz  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")  # the quantizer's pre-processing advice


def _model(name, nodes, x_shape, weights):
    inits = [numpy_helper.from_array(v, k) for k, v in weights.items()]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, x_shape)], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def mlp(rng):
    w = {"w1": rng.normal(size=(32, 64)) * 0.2, "b1": rng.normal(size=64) * 0.1,
         "w2": rng.normal(size=(64, 10)) * 0.2, "b2": rng.normal(size=10) * 0.1}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"]),
             helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]),
             helper.make_node("MatMul", ["h2", "w2"], ["h3"]),
             helper.make_node("Add", ["h3", "b2"], ["y"])]
    return _model("mlp", nodes, [8, 32], {k: v.astype(np.float32) for k, v in w.items()})


def convnet(rng):
    w = {"w1": rng.normal(size=(8, 3, 3, 3)) * 0.3, "b1": rng.normal(size=8) * 0.1,
         "w2": rng.normal(size=(4, 8, 3, 3)) * 0.2, "b2": rng.normal(size=4) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["y"])]
    return _model("cnn", nodes, [2, 3, 12, 12], {k: v.astype(np.float32) for k, v in w.items()})


def classifier(rng):
    """A CNN classifier whose QOperator form has ORT's contrib QLinearLeakyRelu,
    QLinearSigmoid, QLinearConcat, QLinearAveragePool, QLinearGlobalAveragePool, QGemm and
    QLinearSoftmax."""
    w = {"w1": rng.normal(size=(8, 3, 3, 3)) * 0.3, "b1": rng.normal(size=8) * 0.1,
         "w2": rng.normal(size=(8, 8, 3, 3)) * 0.2, "b2": rng.normal(size=8) * 0.1,
         "wf": rng.normal(size=(10, 16)) * 0.3, "bf": rng.normal(size=10) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("LeakyRelu", ["c1"], ["a"], alpha=0.1),
             helper.make_node("Conv", ["a", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c2"], ["s"]),
             helper.make_node("Concat", ["a", "s"], ["cat"], axis=1),
             helper.make_node("AveragePool", ["cat"], ["ap"], kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["ap"], ["gap"]),
             helper.make_node("Flatten", ["gap"], ["flat"]),
             helper.make_node("Gemm", ["flat", "wf", "bf"], ["fc"], transB=1),
             helper.make_node("Softmax", ["fc"], ["y"], axis=-1)]
    return _model("classifier", nodes, [2, 3, 12, 12],
                  {k: v.astype(np.float32) for k, v in w.items()})


class RandomReader(quantization.CalibrationDataReader):
    def __init__(self, shape, rng):
        self.batches = iter([{"x": rng.normal(size=shape).astype(np.float32)}
                             for _ in range(8)])

    def get_next(self):
        return next(self.batches, None)


def _quantize(tmp_path, build, how, rng):
    m = build(rng)
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    src, dst = tmp_path / "float.onnx", tmp_path / f"{how}.onnx"
    onnx.save(m, src)
    if how.startswith("dynamic"):
        quantization.quantize_dynamic(src, dst, weight_type=quantization.QuantType.QInt8)
        if how == "dynamic-ort-optimized":  # com.microsoft DynamicQuantizeMatMul and kin
            so = ort.SessionOptions()
            so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
            ort.InferenceSession(str(dst), so, providers=["CPUExecutionProvider"])
            dst = tmp_path / "optimized.onnx"
    else:
        fmt = quantization.QuantFormat.QDQ if how == "qdq" else quantization.QuantFormat.QOperator
        quantization.quantize_static(src, dst, RandomReader(shape, rng), quant_format=fmt)
    return dst, shape


CASES = [(mlp, "qdq"), (mlp, "qoperator"), (mlp, "dynamic"), (convnet, "qdq"),
         (convnet, "qoperator"), (convnet, "dynamic"), (classifier, "qoperator"),
         (mlp, "dynamic-ort-optimized")]


@pytest.mark.parametrize("build, how", CASES, ids=[f"{b.__name__}-{h}" for b, h in CASES])
def test_quantized_model_matches_onnx_runtime(tmp_path, build, how):
    rng = np.random.default_rng(0)
    path, shape = _quantize(tmp_path, build, how, rng)
    g = bz.import_onnx(path)
    kinds = {n.op.kind for n in g.nodes}
    assert "quantize" in kinds
    if how == "dynamic-ort-optimized":
        model_ops = {n.op_type for n in onnx.load(path).graph.node}
        assert {"DynamicQuantizeMatMul", "MatMulIntegerToFloat"} & model_ops
    exe = bz.compile(g)
    for seed in range(3):
        x = np.random.default_rng(seed + 10).normal(size=shape).astype(np.float32)
        for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                      ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
            so = ort.SessionOptions()
            so.graph_optimization_level = level
            want = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(
                None, {"x": x})[0]
            np.testing.assert_array_equal(bz.interpret(g, {"x": x})[0], want)
            got = exe({"x": x})[0]
            if how.startswith("dynamic"):  # float32 epilogue: the region may fuse mul + add
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
            else:
                np.testing.assert_array_equal(got, want)
