"""Resize whose `sizes` reads the batch and channel entries from the input's own shape
(`Concat(Shape(x)[:2], [h, w])`, as MobileViT exports write it) imports with a symbolic batch
and matches ONNX Runtime, as do symbolic spatial sizes; a size that is not a polynomial of the
input's dims (a scale of 1.5) is refused with the input_shapes hint."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import braze as bz  # noqa: E402
from braze.errors import FrontendError  # noqa: E402

F = TensorProto.FLOAT


def _model(spatial_from_shape: bool):
    inits = [numpy_helper.from_array(np.array([0], np.int64), "lo"),
             numpy_helper.from_array(np.array([2], np.int64), "mid"),
             numpy_helper.from_array(np.array([4], np.int64), "hi"),
             numpy_helper.from_array(np.array([6, 10], np.int64), "hw")]
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "lo", "mid"], ["nc"])]
    if spatial_from_shape:  # the spatial sizes are x's own (symbolic) height and width
        nodes.append(helper.make_node("Slice", ["s", "mid", "hi"], ["sp"]))
        nodes.append(helper.make_node("Concat", ["nc", "sp"], ["sizes"], axis=0))
    else:
        nodes.append(helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0))
    nodes.append(helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="upsample",
                                  mode="linear"))
    h = "h" if spatial_from_shape else 4
    graph = helper.make_graph(nodes, "resize", [helper.make_tensor_value_info(
        "x", F, ["batch", 3, h, 5])], [helper.make_tensor_value_info("y", F, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_sizes_with_the_inputs_own_batch_and_channels_import_and_match_onnxruntime():
    model = _model(spatial_from_shape=False)
    g = bz.import_onnx(model)
    assert g.shape_of(g.outputs[0]).dims == ("batch", 3, 6, 10)
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, {"x": x})
    (got,) = bz.interpret(g, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_symbolic_spatial_sizes_read_from_the_inputs_shape_import_and_match_onnxruntime():
    model = _model(spatial_from_shape=True)
    g = bz.import_onnx(model)
    assert g.shape_of(g.outputs[0]).dims == ("batch", 3, "h", 5)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape in ((2, 3, 4, 5), (1, 3, 7, 5)):
        x = np.random.default_rng(shape[2]).standard_normal(shape).astype(np.float32)
        (want,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(bz.compile(g)({"x": x})[0], want, rtol=1e-5, atol=1e-6)


def test_a_fractional_scale_of_a_symbolic_size_is_refused_with_the_input_shapes_hint():
    inits = [numpy_helper.from_array(np.array([1, 1, 1.5, 1.5], np.float32), "scales")]
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="upsample", mode="linear")
    graph = helper.make_graph([node], "resize", [helper.make_tensor_value_info(
        "x", F, ["batch", 3, "h", 5])], [helper.make_tensor_value_info("y", F, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(FrontendError, match=r"upsample.*scale 1.5 of symbolic dim 'h'.*"
                                            r"input_shapes"):
        bz.import_onnx(model)
