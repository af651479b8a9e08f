"""Resize's keep_aspect_ratio_policy takes its one scale over every axis in `axes`, which
defaults to all axes, batch and channels included (their size ratio is 1): `not_larger` with
larger spatial sizes keeps the input's size, as ONNX Runtime does; a policy scale that would
resize the batch or channel axis is refused naming the node."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import braze as bz  # noqa: E402
from braze.errors import FrontendError  # noqa: E402


def _model(sizes, policy, axes=None):
    extra = {} if axes is None else {"axes": axes}
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="rs", mode="nearest",
                            keep_aspect_ratio_policy=policy, **extra)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(sizes, np.int64), "sizes")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _ort(model, x):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("sizes,policy,axes", [
    ([1, 2, 10, 14], "not_larger", None),   # batch / channel ratio 1 caps the scale at 1
    ([1, 2, 3, 4], "not_smaller", None),    # ... and floors it at 1
    ([10, 9], "not_larger", [2, 3]),
    ([3, 11], "not_smaller", [2, 3]),
])
def test_policy_scale_over_all_listed_axes_matches_onnxruntime(sizes, policy, axes):
    model = _model(sizes, policy, axes)
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 7)).astype(np.float32)
    want = _ort(model, x)
    g = bz.import_onnx(model)
    for got in (bz.interpret(g, {"x": x})[0], bz.compile(g, "cpu")({"x": x})[0]):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_negative_axes_are_the_spatial_axes():
    """axes [-2, -1] are [2, 3] (ONNX Runtime 1.32 leaves the size unchanged there instead)."""
    x = np.random.default_rng(1).standard_normal((1, 2, 5, 7)).astype(np.float32)
    want = _ort(_model([10, 9], "not_larger", [2, 3]), x)
    g = bz.import_onnx(_model([10, 9], "not_larger", [-2, -1]))
    assert want.shape == (1, 2, 6, 9)
    np.testing.assert_array_equal(bz.compile(g, "cpu")({"x": x})[0], want)


def test_policy_scale_that_resizes_channels_is_refused():
    with pytest.raises(FrontendError, match=r"rs.*axis 1 \(batch / channels, 2 -> 1\)"):
        bz.import_onnx(_model([1, 2, 3, 11], "not_larger"))
