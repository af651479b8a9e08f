"""ONNX activations braze writes in primitives (ops/elementwise.py): Elu, Selu, Mish, PRelu and
Softplus; and the trigonometric / hyperbolic family braze has as unary functions (Tan, Asin,
Acos, Atan, Sinh, Cosh, Asinh, Acosh, Atanh). Each one-node model is imported and run by
braze's interpreter and compiled CPU executable and compared with ONNX Runtime, on inputs that
include large magnitudes (where a naive exp overflows); a PRelu slope that does not broadcast
to the input is refused."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import braze as bz  # noqa: E402
from braze.errors import FrontendError  # noqa: E402

F32 = TensorProto.FLOAT


def data(shape, seed=0, spread=3.0):
    """Random values with a few large ones (+-100, +-1e4) among them."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * spread).astype(np.float32)
    flat = x.reshape(-1)
    flat[: min(4, flat.size)] = [100.0, -100.0, 1e4, -1e4][: min(4, flat.size)]
    return x


def unary(make_model, op, shape, opset=17, **attrs):
    node = helper.make_node(op, ["x"], ["y"], name="act", **attrs)
    return make_model([node], [("x", F32, shape)], [("y", F32, None)], opset=opset)


@pytest.mark.parametrize("attrs", [{}, dict(alpha=0.5), dict(alpha=2.5)])
@pytest.mark.parametrize("shape", [[7], [2, 3, 5], [1, 4, 3, 3]])
def test_elu(make_model, matches_ort, attrs, shape):
    matches_ort(unary(make_model, "Elu", shape, **attrs), {"x": data(shape)})


@pytest.mark.parametrize("attrs", [{}, dict(alpha=1.2), dict(gamma=2.0),
                                   dict(alpha=0.7, gamma=0.9)])
@pytest.mark.parametrize("shape", [[5, 3], [2, 1, 7]])
def test_selu(make_model, matches_ort, attrs, shape):
    matches_ort(unary(make_model, "Selu", shape, **attrs), {"x": data(shape, seed=1)})


@pytest.mark.parametrize("shape", [[9], [2, 3, 4, 5]])
def test_mish(make_model, matches_ort, shape):
    matches_ort(unary(make_model, "Mish", shape, opset=18), {"x": data(shape, seed=2)})


@pytest.mark.parametrize("opset", [11, 17])
def test_softplus_does_not_overflow(make_model, matches_ort, opset):
    shape = [3, 6]
    g = matches_ort(unary(make_model, "Softplus", shape, opset=opset), {"x": data(shape)})
    (y,) = bz.interpret(g, {"x": np.array([[1e4, -1e4, 0, 80, 90, 100]] * 3, np.float32)})
    assert np.isfinite(y).all() and y[0, 0] == 1e4


def prelu(make_model, x_dims, slope, opset=16):
    node = helper.make_node("PRelu", ["x", "slope"], ["y"], name="prelu")
    return make_model([node], [("x", F32, x_dims)], [("y", F32, None)],
                      [numpy_helper.from_array(slope, "slope")], opset=opset)


@pytest.mark.parametrize("x_shape,slope_shape", [
    ([2, 3, 4, 5], [3, 1, 1]),      # per channel, as torch exports nn.PReLU(C)
    ([2, 3, 4, 5], [1]),            # one slope
    ([2, 3, 4, 5], [5]),            # along the trailing axis (ONNX aligns at the end)
    ([2, 3, 4, 5], [4, 5]),
    ([4, 6], [6]),                  # [N, C] features
    ([3, 1, 7], [1, 7]),
    ([2, 3, 4, 5], [2, 3, 4, 5]),   # elementwise
])
@pytest.mark.parametrize("opset", [11, 16])
def test_prelu_broadcasts_the_slope_unidirectionally(make_model, matches_ort, x_shape,
                                                     slope_shape, opset):
    slope = np.random.default_rng(3).standard_normal(slope_shape).astype(np.float32)
    matches_ort(prelu(make_model, x_shape, slope, opset), {"x": data(x_shape, seed=4)})


def test_prelu_keeps_a_symbolic_batch(make_model, matches_ort):
    slope = np.array([0.1, 0.2, 0.3], np.float32).reshape(3, 1, 1)
    m = prelu(make_model, ["batch", 3, 4, 4], slope)
    g = matches_ort(m, {"x": data([5, 3, 4, 4])})
    assert g.shape_of(g.outputs[0]).dims[0] == "batch"


@pytest.mark.parametrize("x_shape,slope_shape,hint", [
    ([2, 3, 4, 5], [3], r"\[3, 1, 1\]"),   # per-channel slope stored flat: says how to store it
    ([2, 3, 4, 5], [2, 3, 4, 5, 1], ""),   # would grow x
    ([4, 6], [4, 1, 1], ""),
])
def test_prelu_slope_that_does_not_broadcast_is_an_error(make_model, x_shape, slope_shape,
                                                         hint):
    m = prelu(make_model, x_shape, np.ones(slope_shape, np.float32))
    with pytest.raises(FrontendError, match=r"prelu.*slope of shape .*does not broadcast.*"
                                            + hint):
        bz.import_onnx(m)


def test_new_activations_are_listed_as_supported():
    from braze.frontends.onnx.importer import SUPPORTED_OPS

    assert {"Elu", "Selu", "Mish", "PRelu"} <= set(SUPPORTED_OPS())


_TRIG = {"Tan": (-1.2, 1.2), "Asin": (-0.99, 0.99), "Acos": (-0.99, 0.99), "Atan": (-50, 50),
         "Sinh": (-8, 8), "Cosh": (-8, 8), "Asinh": (-1e3, 1e3), "Acosh": (1.0, 1e3),
         "Atanh": (-0.99, 0.99)}


@pytest.mark.parametrize("op", sorted(_TRIG))
def test_trigonometric_and_hyperbolic_functions(make_model, matches_ort, op):
    """In their domains, through the interpreter and compiled (a lone op and a region)."""
    lo, hi = _TRIG[op]
    x = np.random.default_rng(3).uniform(lo, hi, (4, 37)).astype(np.float32)
    matches_ort(unary(make_model, op, [4, 37], opset=13), {"x": x}, rtol=2e-6, atol=1e-6)
    nodes = [helper.make_node(op, ["x"], ["t"], name="f"),
             helper.make_node("Mul", ["t", "x"], ["y"], name="m")]
    region = make_model(nodes, [("x", F32, [4, 37])], [("y", F32, None)], opset=13)
    matches_ort(region, {"x": x}, rtol=2e-6, atol=1e-6)
