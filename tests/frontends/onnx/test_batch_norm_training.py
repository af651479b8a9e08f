"""Training-form BatchNormalization (ops/norm.py): normalization with the batch statistics of
the node's own input, as ONNX's spec and ONNX Runtime compute it. The weight standardization
the TorchScript exporter writes for BiT-style convolutions (an eval-mode model) folds into a
stored weight at import; a run-time input is normalized in the graph; the running statistics
outputs match ONNX Runtime. Forms braze cannot give a defined meaning are refused with an error
that names the node and says what to change."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import braze as bz  # noqa: E402
from braze.errors import FrontendError  # noqa: E402

F32 = TensorProto.FLOAT


def rand(*shape, seed=0, positive=False):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return np.abs(a) + 0.5 if positive else a


def stats(c, seed=10):
    """scale, bias, input mean, input var (initializers s, b, m, v)."""
    return [numpy_helper.from_array(a, n) for a, n in zip(
        (rand(c, seed=seed), rand(c, seed=seed + 1), rand(c, seed=seed + 2),
         rand(c, seed=seed + 3, positive=True)), "sbmv")]


def reference(x, scale, bias, eps):
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (-1,) + (1,) * (x.ndim - 2)
    mean, var = x.mean(axes), x.var(axes)
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * \
        scale.reshape(shape) + bias.reshape(shape)


# -- a run-time input ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [[2, 3, 4, 5], [6, 3], [3, 3, 7], [1, 3, 2, 2]])
@pytest.mark.parametrize("attrs", [{}, dict(momentum=0.7, epsilon=1e-3)])
def test_training_mode_normalizes_with_batch_statistics(make_model, matches_ort, shape, attrs):
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"],
                            ["y", "running_mean", "running_var"], name="bn", training_mode=1,
                            **attrs)
    m = make_model([node], [("x", F32, shape)], [(o, F32, None) for o in node.output],
                   stats(shape[1]), opset=15)
    g = matches_ort(m, {"x": rand(*shape, seed=1) * 3 + 1}, atol=1e-4, rtol=1e-4)
    assert g.count("batch_norm") == 1


def test_training_mode_with_a_symbolic_batch(make_model, matches_ort):
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"],
                            ["y", "rm", "rv"], name="bn", training_mode=1)
    m = make_model([node], [("x", F32, ["n", 4, 3, 3])], [(o, F32, None) for o in "y rm rv"
                                                          .split()], stats(4), opset=15)
    g = matches_ort(m, {"x": rand(5, 4, 3, 3, seed=2)}, atol=1e-4, rtol=1e-4)
    assert g.shape_of(g.outputs[0]).dims[0] == "n"


def test_training_mode_with_y_alone(make_model):
    """ONNX makes the running statistics optional (ONNX Runtime insists on them): Y alone is
    the batch-normalized input."""
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn",
                            training_mode=1, epsilon=1e-4)
    m = make_model([node], [("x", F32, [2, 3, 5])], [("y", F32, None)], stats(3), opset=15)
    x = rand(2, 3, 5, seed=3)
    s, b = (numpy_helper.to_array(t) for t in stats(3)[:2])
    np.testing.assert_allclose(bz.interpret(bz.import_onnx(m), {"x": x})[0],
                               reference(x, s, b, 1e-4), rtol=1e-5, atol=1e-5)


def test_opset_12_statistics_outputs_mean_training(make_model, matches_ort):
    """Before opset 14 the running mean / var outputs make the node a training step."""
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"],
                            ["y", "mean", "var", "", ""], name="bn", momentum=0.6)
    m = make_model([node], [("x", F32, [3, 2, 4, 4])],
                   [(o, F32, None) for o in ("y", "mean", "var")], stats(2), opset=12)
    matches_ort(m, {"x": rand(3, 2, 4, 4, seed=4)}, atol=1e-4, rtol=1e-4)


def test_opset_12_saved_mean_is_the_batch_mean(make_model):
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"],
                            ["y", "", "", "saved_mean", ""], name="bn")
    m = make_model([node], [("x", F32, [3, 2, 5])], [(o, F32, None) for o in ("y", "saved_mean")],
                   stats(2), opset=12)
    x = rand(3, 2, 5, seed=5)
    s, b = (numpy_helper.to_array(t) for t in stats(2)[:2])
    y, mean = bz.interpret(bz.import_onnx(m), {"x": x})
    np.testing.assert_allclose(y, reference(x, s, b, 1e-5), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean, x.mean(axis=(0, 2)), rtol=1e-6, atol=1e-6)


# -- a stored input: folded at import -----------------------------------------------------------
def weight_standardized_conv(make_model, out_c=8, in_c=3, k=3, opset=17):
    """What torch.onnx.export (TorchScript) writes for BiT's WeightStandardizedConv2d:
    F.batch_norm(w.reshape(1, O, -1), None, None, training=True) in an eval-mode model."""
    w = rand(out_c, in_c, k, k, seed=5) * 0.2 + 0.05
    flat = w.reshape(1, out_c, -1)
    inits = [numpy_helper.from_array(flat, "w_flat"),
             numpy_helper.from_array(flat.transpose(0, 2, 1).copy(), "w_t"),
             numpy_helper.from_array(np.array(w.shape, np.int64), "w_shape"),
             numpy_helper.from_array(rand(out_c, seed=6), "bias")]
    nodes = [
        helper.make_node("Constant", [], ["ones"], value=numpy_helper.from_array(
            np.ones(out_c, np.float32))),
        helper.make_node("Constant", [], ["zeros"], value=numpy_helper.from_array(
            np.zeros(out_c, np.float32))),
        helper.make_node("ReduceMean", ["w_t"], ["rm"], axes=[0, 1], keepdims=0),
        helper.make_node("ReduceMean", ["w_t"], ["rm_k"], axes=[0, 1], keepdims=1),
        helper.make_node("Sub", ["w_t", "rm_k"], ["dev"]),
        helper.make_node("Mul", ["dev", "dev"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["rv"], axes=[0, 1], keepdims=0),
        helper.make_node("BatchNormalization", ["w_flat", "ones", "zeros", "rm", "rv"],
                         ["ws", "ws_mean", "ws_var"], name="/BatchNormalization",
                         epsilon=1e-6, momentum=1.0, training_mode=1),
        helper.make_node("Reshape", ["ws", "w_shape"], ["w_std"]),
        helper.make_node("Conv", ["x", "w_std", "bias"], ["y"], name="conv", pads=[1] * 4,
                         kernel_shape=[k, k]),
    ]
    return make_model(nodes, [("x", F32, ["n", in_c, 9, 7])], [("y", F32, None)], inits,
                      opset=opset)


@pytest.mark.parametrize("opset", [15, 17])
def test_weight_standardization_folds_into_a_stored_weight(make_model, matches_ort, opset):
    m = weight_standardized_conv(make_model, opset=opset)
    g = matches_ort(m, {"x": rand(2, 3, 9, 7, seed=7)}, atol=1e-4, rtol=1e-4)
    assert g.count("batch_norm") == 0
    folded = g.node_by_name("ws").op
    assert folded.kind == "param" and folded.name in g.weights
    w = g.weights["ws"]
    np.testing.assert_allclose(w.mean(axis=2), 0, atol=1e-6)
    np.testing.assert_allclose(w.var(axis=2), 1, atol=1e-4)
    fused, _ = bz.fuse(g, "cpu")
    assert fused.count("reduce") == 0


def test_stored_input_with_running_outputs(make_model, matches_ort):
    """Every input stored: Y and the running statistics are all computed at import."""
    x = numpy_helper.from_array(rand(4, 3, 2, seed=8) * 2, "xs")
    node = helper.make_node("BatchNormalization", ["xs", "s", "b", "m", "v"], ["ys", "rm", "rv"],
                            name="bn", training_mode=1, momentum=0.25)
    add = helper.make_node("Add", ["x", "ys"], ["y"])
    m = make_model([node, add], [("x", F32, [4, 3, 2])],
                   [("y", F32, None), ("rm", F32, None), ("rv", F32, None)],
                   [x] + stats(3), opset=15)
    g = matches_ort(m, {"x": rand(4, 3, 2, seed=9)}, atol=1e-5, rtol=1e-5)
    assert g.count("batch_norm") == 0 and g.count("reduce") == 0


def test_torch_weight_standardization_export(matches_ort, tmp_path):
    """The reproduction from the robustness sweep: a BiT-style conv exported by TorchScript."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F  # noqa: N812

    class WSConv(torch.nn.Conv2d):
        def forward(self, x):
            w = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None,
                             training=True, momentum=0.0, eps=1e-6).reshape_as(self.weight)
            return F.conv2d(x, w, self.bias, self.stride, self.padding)

    torch.manual_seed(0)
    m = WSConv(3, 8, 3, padding=1).eval()
    x = torch.randn(2, 3, 10, 6)
    path = tmp_path / "ws_conv.onnx"
    with warnings.catch_warnings():  # "batch_norm is set to train=True", legacy exporter
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (x,), str(path), input_names=["x"], opset_version=17,
                          dynamo=False)
    model = onnx.load(str(path))
    g = matches_ort(model, {"x": x.numpy()}, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        np.testing.assert_allclose(bz.interpret(g, {"x": x.numpy()})[0], m(x).numpy(),
                                   atol=1e-4, rtol=1e-4)


# -- refused ------------------------------------------------------------------------------------
def test_running_outputs_without_training_mode_are_an_error(make_model):
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"],
                            name="bn_eval")
    m = make_model([node], [("x", F32, [2, 3, 4])], [(o, F32, None) for o in ("y", "rm", "rv")],
                   stats(3), opset=15)
    with pytest.raises(FrontendError, match="bn_eval.*training_mode=0 has no running_mean.*"
                                            "set training_mode=1"):
        bz.import_onnx(m)


def test_opset_12_saved_var_output_is_an_error(make_model):
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"],
                            ["y", "mean", "var", "saved_mean", "saved_var"], name="bn_old")
    m = make_model([node], [("x", F32, [2, 3, 4])],
                   [(o, F32, None) for o in node.output], stats(3), opset=12)
    with pytest.raises(FrontendError, match="bn_old.*saved_var output"):
        bz.import_onnx(m)


def test_integer_input_is_an_error(make_model):
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"],
                            name="bn_int", training_mode=1)
    m = make_model([node], [("x", TensorProto.INT32, [2, 3])],
                   [(o, F32, None) for o in ("y", "rm", "rv")], stats(3), opset=15)
    with pytest.raises(FrontendError, match="bn_int"):
        bz.import_onnx(m)
