"""FusedLinear: act(x @ W + b) with W [in, out], for every activation (Gelu in its tanh form),
1-D and 2-D inputs, evaluated through one braze FusedMatMulBiasAct node."""
import math

import numpy as np
import pytest

import braze as bz
from braze.compat.axonml import (
    Activation,
    FusedLinear,
    fuse_matmul_bias,
    fuse_matmul_bias_gelu,
    fuse_matmul_bias_relu,
)

RNG = np.random.default_rng(0)
W = RNG.standard_normal((5, 3)).astype(np.float32)
B = RNG.standard_normal(3).astype(np.float32)
X = RNG.standard_normal((4, 5)).astype(np.float32)

EXPECTED_ACT = {
    Activation.NONE: lambda z: z,
    Activation.RELU: lambda z: np.maximum(z, 0),
    Activation.GELU: lambda z: 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi)
                                                      * (z + 0.044715 * z ** 3))),
    Activation.SIGMOID: lambda z: 1 / (1 + np.exp(-z)),
    Activation.TANH: np.tanh,
    Activation.SILU: lambda z: z / (1 + np.exp(-z)),
}


@pytest.mark.parametrize("act", list(EXPECTED_ACT))
@pytest.mark.parametrize("with_bias", [True, False])
def test_forward_matches_numpy_for_every_activation(act, with_bias):
    fl = FusedLinear(W, B if with_bias else None, act)
    z = X.astype(np.float64) @ W + (B if with_bias else 0)
    want = EXPECTED_ACT[act](z)
    got = fl.forward(X)
    assert got.shape == (4, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    one = fl.forward(X[1])
    assert one.shape == (3,)
    np.testing.assert_allclose(one, want[1], rtol=1e-5, atol=1e-6)


def test_gelu_is_the_tanh_approximation_not_erf():
    fl = fuse_matmul_bias_gelu(np.eye(2, dtype=np.float32), np.zeros(2, np.float32))
    x = np.array([[1.0, -2.0]], np.float32)
    erf_form = 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    tanh_form = EXPECTED_ACT[Activation.GELU](x.astype(np.float64))
    got = fl(x)
    np.testing.assert_allclose(got, tanh_form, rtol=1e-6)
    assert not np.allclose(got, erf_form, rtol=1e-6, atol=0)


def test_axonml_constructors_and_readme_example():
    w = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    b = np.array([0.5, 0.5], np.float32)
    np.testing.assert_allclose(fuse_matmul_bias_relu(w, b).forward([[1.0, 1.0]]), [[4.5, 6.5]])
    neg = np.array([[-1.0, 0.0]], np.float32)
    np.testing.assert_allclose(fuse_matmul_bias(w, b)(neg), [[-0.5, -1.5]])
    np.testing.assert_allclose(fuse_matmul_bias_relu(w, b)(neg), [[0.0, 0.0]])
    assert fuse_matmul_bias_gelu(w, b).activation is Activation.Gelu is Activation.GELU
    assert Activation.None_ is Activation.NONE


def test_forward_runs_a_braze_fused_matmul_bias_act_node():
    fl = FusedLinear(W, B, Activation.SILU)
    (node,) = [n for n in fl.graph.nodes if not n.op.source]
    assert node.op.kind == "fused_matmul_bias_act"
    assert node.op.act is bz.UnaryFn.SILU and node.op.has_bias
    (got,) = bz.interpret(fl.graph, {"x": X})
    np.testing.assert_array_equal(got, fl(X))


def test_shape_errors_raise_braze_shape_error_naming_the_sizes():
    fl = FusedLinear(W, B)
    with pytest.raises(bz.ShapeError, match="expects 5 input features.*got x with 4"):
        fl.forward(np.ones((2, 4), np.float32))
    with pytest.raises(bz.ShapeError, match=r"\[in_features\] or \[batch, in_features\]"):
        fl.forward(np.ones((2, 2, 5), np.float32))
    with pytest.raises(bz.ShapeError, match="bias must be"):
        FusedLinear(W, np.ones(5, np.float32))
    with pytest.raises(bz.ShapeError, match="weight must be 2-D"):
        FusedLinear(np.ones(5, np.float32))


def test_float64_weights_compute_in_float64():
    w64, x64 = W.astype(np.float64), X.astype(np.float64)
    got = FusedLinear(w64, B.astype(np.float64), Activation.TANH)(x64)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np.tanh(x64 @ w64 + B), rtol=1e-12)


@pytest.mark.parametrize("make", [
    lambda ax: ax.FusedLinear(np.array([[1 + 5j, 0], [0, 1]])),
    lambda ax: ax.FusedLinear(np.eye(2), np.array([1j, 0])),
    lambda ax: ax.FusedLinear(np.eye(2)).forward(np.array([1 + 5j, 2])),
    lambda ax: ax.FusedLinear(np.eye(2)).forward(["a", "b"]),
    lambda ax: ax.FusedLinear([[1, 2], [3]]),
    lambda ax: ax.fused_add_relu(1.0)(np.array([1 + 5j, 2])),
    lambda ax: ax.fused_add_relu(1.0)(None),
    lambda ax: ax.fused_add_relu(1.0)(np.array([object()])),
])
def test_non_real_inputs_are_braze_errors_not_silent_casts(make):
    from braze.compat import axonml as ax
    with pytest.raises(bz.GraphError, match="real numbers|no array"):
        make(ax)


def test_int_and_bool_inputs_still_compute_in_float32():
    from braze.compat import axonml as ax
    assert ax.FusedLinear([[1, 2], [3, 4]]).forward([1, 1]).tolist() == [4.0, 6.0]
    assert ax.fused_add_relu(1.0)(np.array([True, False])).tolist() == [2.0, 1.0]
