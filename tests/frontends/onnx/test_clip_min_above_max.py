"""Clip whose constant min exceeds its max imports (ONNX: every element becomes max, as ONNX
Runtime computes min(max(x, min), max)) instead of failing braze's clamp check."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import braze as bz  # noqa: E402


@pytest.mark.parametrize("dtype,onnx_type", [(np.float32, TensorProto.FLOAT),
                                             (np.int64, TensorProto.INT64)])
def test_clip_min_above_max_gives_max_everywhere(dtype, onnx_type):
    node = helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="clip")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", onnx_type, [3, 4])],
        [helper.make_tensor_value_info("y", onnx_type, None)],
        [numpy_helper.from_array(np.array(1, dtype), "lo"),
         numpy_helper.from_array(np.array(-1, dtype), "hi")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = (np.random.default_rng(0).standard_normal((3, 4)) * 5).astype(dtype)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    g = bz.import_onnx(model)
    for got in (bz.interpret(g, {"x": x})[0], bz.compile(g, "cpu")({"x": x})[0]):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(want, np.full((3, 4), -1, dtype))
