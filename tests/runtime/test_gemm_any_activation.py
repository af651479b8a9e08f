"""A GEMM + bias + an activation the C epilogues lack (exp, erf, abs, ...; found by a held-out
sweep) keeps its native GEMM and applies NumPy's activation after it (fused.then_activation),
as the convs do; it had run the whole node on the NumPy reference, 4x slower at BERT's FFN
size. Biases of one value, (1,) or (), take the native GEMM too."""
import numpy as np
import pytest

import braze as bz
from braze.runtime.kernels import native

pytestmark = pytest.mark.skipif(native.lib() is None, reason="no C compiler here")
GEMMS = ("matmul", "fused_matmul_bias_act")


def _graph(act, bias_shape, x_shape):
    rng = np.random.default_rng(0)
    g = bz.Graph("mm")
    x = g.input("x", bz.Shape(x_shape))
    w = g.param("w", bz.Shape((40, 72)), (rng.standard_normal((40, 72)) / 7).astype(np.float32))
    b = g.param("b", bz.Shape(bias_shape), (rng.standard_normal(bias_shape) * 0.1
                                              ).astype(np.float32))
    y = g.add(g.matmul(x, w), b)
    g.set_outputs([y if act is None else g.activation(y, act)])
    return g


@pytest.mark.parametrize("precision", [None, "bf16"])
@pytest.mark.parametrize("x_shape", [(9, 40), (2, 7, 40)])
@pytest.mark.parametrize("act", ["exp", "erf", "abs", "sin", "asinh", "gelu", None])
def test_any_activation_keeps_the_native_gemm(act, x_shape, precision):
    g = _graph(act, (72,), x_shape)
    exe = bz.compile(g, precision=precision)
    feeds = bz.random_feeds(g, 1)
    rows = [r for r in exe.dispatch_report(feeds).rows if r[1] in GEMMS]
    assert [r[1] for r in rows] == ["fused_matmul_bias_act"]
    assert rows[0][2] == "native"
    numpy_after = act in ("exp", "erf", "abs", "sin", "asinh")
    assert rows[0][3].endswith(f", then NumPy {act}") == numpy_after, rows
    for seed in (1, 2):
        feeds = bz.random_feeds(g, seed)
        (got,), (want,) = exe(feeds), bz.interpret(exe.graph, feeds)
        tol = 2e-3 if precision else 1e-5
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("precision", [None, "bf16"])
@pytest.mark.parametrize("bias_shape", [(1,), ()])
def test_a_bias_of_one_value_takes_the_native_gemm(bias_shape, precision):
    g = _graph("relu", bias_shape, (2, 7, 40))
    exe = bz.compile(g, precision=precision)
    feeds = bz.random_feeds(g, 3)
    rows = [r for r in exe.dispatch_report(feeds).rows if r[1] in GEMMS]
    assert rows and all(r[2] == "native" for r in rows), rows
    (got,), (want,) = exe(feeds), bz.interpret(exe.graph, feeds)
    tol = 2e-3 if precision else 1e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("precision", [None, "bf16"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("act", ["relu", "abs", None])
def test_dot_of_two_vectors_with_bias_or_activation(act, bias, precision):
    """x[k] @ w[k] is one value (a 0-d output): fused with a bias or an activation, the GEMM
    kernel had read the output's last dim and crashed (IndexError; an ONNX fuzz found it)."""
    if act is None and not bias:
        pytest.skip("nothing fuses")
    g = bz.Graph("dot")
    x = g.input("x", bz.Shape((3,)))
    y = g.matmul(x, g.param("w", bz.Shape((3,)), np.array([-1, 0.5, 1], np.float32)))
    if bias:
        y = g.add(y, g.param("b", bz.Shape(()), np.float32(0.25)))
    g.set_outputs([y if act is None else g.activation(y, act)])
    feeds = {"x": np.array([1, 2, 3.5], np.float32)}
    got = bz.compile(g, precision=precision)(feeds)[0]
    assert got.shape == ()
    np.testing.assert_allclose(got, bz.interpret(g, feeds)[0], rtol=1e-2)
