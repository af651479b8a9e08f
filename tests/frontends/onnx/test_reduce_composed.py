"""ONNX reductions braze imports as an elementwise map around a sum (ReduceL1, ReduceL2,
ReduceSumSquare, ReduceLogSum) or a max-shifted log-sum-exp (ReduceLogSumExp): one-node models
with axes as attribute (opset 13) or input (opset 18), keepdims on/off and the empty-axes no-op
agree with ONNX Runtime."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import braze as bz  # noqa: E402

OPS = ("ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")


def _model(op_type, axes, keepdims, opset, noop=0):
    inputs, inits, attrs = ["x"], [], {"keepdims": keepdims}
    if noop:
        attrs["noop_with_empty_axes"] = 1
    if axes is not None:
        if opset >= 18:
            inits.append(numpy_helper.from_array(np.asarray(axes, np.int64), "axes"))
            inputs.append("axes")
        else:
            attrs["axes"] = list(axes)
    node = helper.make_node(op_type, inputs, ["y"], name="red0", **attrs)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([node], "g", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=9)


def _check(m, x):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    (ref,) = sess.run(None, {"x": x})
    (got,) = bz.interpret(bz.import_onnx(m), {"x": x})
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("axes", [(1,), (-1, 0), None])
@pytest.mark.parametrize("op_type", OPS)
def test_matches_onnxruntime(op_type, axes, keepdims, opset):
    x = np.random.default_rng(1).standard_normal((3, 4, 5)).astype(np.float32)
    if op_type == "ReduceLogSum":
        x = np.abs(x) + 0.1
    if op_type == "ReduceLogSumExp":
        x = x * 40.0  # exp would overflow without the max shift
    _check(_model(op_type, axes, keepdims, opset), x)


@pytest.mark.parametrize("op_type", OPS)
def test_empty_axes_noop(op_type):
    x = np.abs(np.random.default_rng(2).standard_normal((3, 4, 5))).astype(np.float32) + 0.1
    _check(_model(op_type, None, 1, 18, noop=1), x)


def test_reduce_l2_is_sqrt_of_sum_of_squares():
    g = bz.import_onnx(_model("ReduceL2", (1,), 1, 18))
    assert g.count("reduce_sum") == 1 and g.count("sqrt") == 1 and g.count("square") == 1


def test_reduce_l2_of_a_zero_vector_has_a_zero_gradient_not_nan():
    """d sqrt(s) / ds is inf at s = 0, and the sum of squares has slope 0 there: 0 * inf gave
    NaN where torch's norm backward gives 0."""
    g = bz.import_onnx(_model("ReduceL2", (2,), 0, 18))
    loss = bz.Graph("loss")
    from braze.autodiff.reverse import clone_into

    loss.set_outputs([loss.sum(clone_into(loss, g)[g.outputs[0]])])
    x = np.random.default_rng(3).standard_normal((3, 4, 5)).astype(np.float32)
    x[0, 1] = 0.0
    norm, dx = bz.interpret(bz.grad_with_loss(loss, "x"), {"x": x})
    want = x / np.sqrt((x * x).sum(2, keepdims=True)).clip(1e-30)
    np.testing.assert_allclose(dx, want, rtol=1e-5, atol=1e-6)
    assert (dx[0, 1] == 0).all()
    _check(_model("ReduceL2", (2,), 0, 18), x)
