"""A NaN reaching an activation stays NaN wherever it runs (GEMM and conv epilogues, fp32 and
the bf16 policy, standalone kernels, generated regions), as in the reference (NumPy) and
PyTorch: the kernels build with -ffast-math, under which the scalar forms' comparisons and
the range clamps (min / max before exp) had turned it into 0, 1 or 6 (relu in a region,
relu6, sigmoid, the tanh GELU)."""
import numpy as np
import pytest

import braze as bz
from braze.runtime.kernels import Dispatch, conv_native, conv_nhwc

pytestmark = pytest.mark.skipif(conv_native.lib() is None, reason="no C compiler here")
ACTS = ["relu", "relu6", "gelu", "gelu_approx", "silu", "sigmoid", "quick_gelu", "hard_swish",
        "tanh"]


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


@pytest.mark.parametrize("precision", [None, "bf16"])
@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("act", ACTS)
def test_an_activation_keeps_a_nan(act, path, precision, monkeypatch):
    monkeypatch.setattr(conv_nhwc, "MIN_MACS", 0)  # a small conv: let it take NHWC
    g = bz.Graph("nan")
    g.set_outputs([PATHS[path](g, act)])
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params, precision=precision)
    feeds = bz.random_feeds(g, 0)
    feeds["x"].flat[[3, 200]] = np.nan
    want = bz.interpret(exe.graph, feeds, params)[0]
    got = exe(feeds)[0]
    assert np.isnan(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    rows = exe.dispatch_report().rows  # the kernels ran it, not the NumPy reference
    assert not [r for r in rows if r[2] == Dispatch.REFERENCE], rows
