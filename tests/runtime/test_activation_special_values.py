"""Activations of special values give the reference's wherever they run (GEMM and conv
epilogues, fp32 and the bf16 policy, standalone kernels, generated regions).
- A NaN stays NaN, as in the reference (NumPy) and PyTorch: the kernels build with
  -ffast-math, under which the scalar forms' comparisons and the range clamps (min / max
  before exp) had turned it into 0, 1 or 6 (relu in a region, relu6, sigmoid, the tanh GELU).
- Large inputs: the AVX-512 tanh GELU (c_snippets.gelu_tanh16, gelu_tanh_row_bf16) clamped
  its exp argument t = -2u only from above; for v >~ 8e4, t < -1e12 is outside exp16's range
  (its reduction loses its bits and the polynomial overflows to -inf), so GELU_tanh(v) = v
  came out -0.
- -inf: the AVX-512 tanh GELU gave 0 where the reference and PyTorch give NaN."""
import numpy as np
import pytest

import braze as bz
from braze.runtime.kernels import Dispatch, conv_native, conv_nhwc

pytestmark = pytest.mark.skipif(conv_native.lib() is None, reason="no C compiler here")
ACTS = ["relu", "relu6", "gelu", "gelu_approx", "silu", "sigmoid", "quick_gelu", "hard_swish",
        "tanh"]
BIG = np.array([1e5, -1e5, 3e5, -3e5, 1e6, -1e6, 1e8, -1e8, 1e12, -1e12, 8e4, 2e4],
               np.float32)


def _gemm(g, act):
    x = g.input("x", bz.Shape((16, 32)))
    y = g.add(g.mm(x, g.param("w", bz.Shape((32, 64)))), g.param("b", bz.Shape((64,))))
    return g.activation(y, act)


def _standalone(g, act):
    return g.activation(g.input("x", bz.Shape((64, 300))), act)


def _region(g, act):
    return g.activation(g.mul(g.add(g.input("x", bz.Shape((64, 300))), 1.0), 2.0), act)


def _conv(g, act):
    x = g.input("x", bz.Shape((1, 64, 9, 8)))
    y = g.conv2d(x, g.param("w", bz.Shape((96, 64, 3, 3))), g.param("b", bz.Shape((96,))), 1, 1)
    y = g.activation(y, act)
    return g.conv2d(y, g.param("w2", bz.Shape((32, 96, 1, 1))), None, 1, 0)  # keeps y NHWC


PATHS = {"gemm": _gemm, "standalone": _standalone, "region": _region, "conv": _conv}


def _run(path, act, precision, monkeypatch, fill):
    """(compiled, reference) outputs of PATHS[path] with `fill` applied to the input x; the
    kernels ran it, not the NumPy reference."""
    monkeypatch.setattr(conv_nhwc, "MIN_MACS", 0)  # a small conv: let it take NHWC
    g = bz.Graph("special")
    g.set_outputs([PATHS[path](g, act)])
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params, precision=precision)
    feeds = bz.random_feeds(g, 0)
    fill(feeds["x"].reshape(-1))
    rows = exe.dispatch_report().rows
    assert not [r for r in rows if r[2] == Dispatch.REFERENCE], rows
    return exe(feeds)[0], bz.interpret(exe.graph, feeds, params)[0]


@pytest.mark.parametrize("precision", [None, "bf16"])
@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("act", ACTS)
def test_an_activation_keeps_a_nan(act, path, precision, monkeypatch):
    def fill(x):
        x[[3, 200]] = np.nan

    got, want = _run(path, act, precision, monkeypatch, fill)
    assert np.isnan(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


@pytest.mark.parametrize("precision", [None, "bf16"])
@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("act", ACTS)
def test_an_activation_of_an_infinity(act, path, precision, monkeypatch):
    """+-inf give the reference's inf, 0 or NaN; the AVX-512 tanh GELU (gelu_tanh16, the bf16
    GEMM's gelu_tanh_row_bf16) gave 0 at -inf, where -inf * (1 + tanh(-inf)) is NaN."""
    def fill(x):
        x[[3, 200]] = -np.inf
        x[[7, 230]] = np.inf

    got, want = _run(path, act, precision, monkeypatch, fill)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    tol = 1e-2 if precision else 1e-4
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("precision", [None, "bf16"])
@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("act", ACTS)
def test_an_activation_of_a_large_input(act, path, precision, monkeypatch):
    def fill(x):
        x[: x.size // 2] = np.resize(BIG, x.size // 2)  # half the inputs large, either sign

    got, want = _run(path, act, precision, monkeypatch, fill)
    tol = 1e-2 if precision else 1e-4
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("precision", [None, "bf16"])
def test_gelu_tanh_is_the_identity_far_right(precision):
    g = bz.Graph("gelu_tanh")
    g.set_outputs([g.activation(g.input("x", bz.Shape((2, 48))), "gelu_approx")])
    exe = bz.compile(g, precision=precision)
    x = np.tile(np.array([1e4, 8e4, 1e5, 1e6, 1e10, 3e38, -1e5, -3e38], np.float32), (2, 6))
    got = exe({"x": x})[0]
    np.testing.assert_array_equal(got, np.where(x > 0, x, np.float32(0)))


def test_gelu_tanh_of_minus_inf_in_the_bf16_hand_off():
    """A GEMM whose tanh-GELU result only the next bf16 GEMM reads writes it in bf16
    (gelu_tanh_row_bf16): a -inf there is NaN too, and so is every output it reaches."""
    g = bz.Graph("handoff")
    h = _gemm(g, "gelu_approx")
    g.set_outputs([g.mm(h, g.param("w2", bz.Shape((64, 32))))])
    params = bz.init_params(g, 0)
    params["b"][0] = -np.inf
    exe = bz.compile(g, params=params, precision="bf16")
    feeds = bz.random_feeds(g, 0)
    got, want = exe(feeds)[0], bz.interpret(exe.graph, feeds, params)[0]
    assert np.isnan(want).all() and np.isnan(got).all()
