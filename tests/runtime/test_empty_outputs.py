"""Nodes with an empty output (a batch, a sequence or a width of 0) run the NumPy reference
(kernels.has_empty), as nodes reading an empty input do: the native kernels' blockings
divide by their block counts (a fed-weight GEMM of 0 rows raised SIGFPE and killed the
process) and several Python wrappers reshaped zero-size operands with -1."""
import numpy as np
import pytest

import braze as bz


def _fed_gemm(g):
    return [g.mm(g.input("x", bz.Shape((0, 6))), g.input("w", bz.Shape((6, 4))))]


def _stored_gemm_no_columns(g):
    x = g.input("x", bz.Shape((0, 5)))
    return [g.mm(x, g.param("w", bz.Shape((5, 0))))]


def _batched(g):
    return [g.matmul(g.input("x", bz.Shape((2, 0, 6))), g.param("w", bz.Shape((2, 6, 5))))]


def _linear(g):
    x = g.input("x", bz.Shape((0, 6)))
    return [g.linear_fused(x, g.param("w", bz.Shape((6, 8))), g.param("b", bz.Shape((8,))),
                           "gelu")]


def _conv(g):
    x = g.input("x", bz.Shape((0, 3, 5, 5)))
    return [g.relu(g.conv2d(x, g.param("w", bz.Shape((4, 3, 3, 3))), padding=1))]


def _conv_no_channels(g):
    x = g.input("x", bz.Shape((2, 3, 5, 5)))
    return [g.conv2d(x, g.param("w", bz.Shape((0, 3, 1, 1))))]


def _attention(g):
    x = g.input("x", bz.Shape((0, 2, 4, 8)))
    return [g.attention(x, x, x, kind="causal")]


def _attention_no_queries(g):
    x = g.input("x", bz.Shape((0, 2, 0, 8)))
    return [g.attention(x, x, x)]


CASES = {"fed gemm": _fed_gemm, "gemm N=0": _stored_gemm_no_columns, "batched": _batched,
         "linear_fused": _linear, "conv": _conv, "conv O=0": _conv_no_channels,
         "attention": _attention,
         "attention S=0": _attention_no_queries}


CONTRACTIONS = ("matmul", "fused_matmul_bias_act", "conv2d", "fused_conv_bias_act", "attention")


@pytest.mark.parametrize("precision", [None, "bf16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_empty_outputs_run_the_reference(case, precision):
    g = bz.Graph("empty")
    g.set_outputs(CASES[case](g))
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params, precision=precision)
    feeds = bz.random_feeds(g, 0)
    want = bz.interpret(exe.graph, feeds, params)
    for got, ref in zip(exe(feeds), want, strict=True):
        assert got.shape == ref.shape and got.dtype == ref.dtype
    rows = [r for r in exe.dispatch_report().rows if r[1] in CONTRACTIONS]
    assert rows and all(r[2] == "reference" for r in rows), rows


def test_a_symbolic_batch_of_zero_between_others():
    """One executable, batch 3, 0, 1, 0, 2 in a row: every binding matches the interpreter."""
    g = bz.Graph("b")
    x, w = g.input("x", bz.Shape(("b", 6))), g.input("w", bz.Shape((6, 4)))
    g.set_outputs([g.gelu(g.mm(x, w))])
    exe = bz.compile(g)
    rng = np.random.default_rng(0)
    for b in (3, 0, 1, 0, 2):
        feeds = {"x": rng.standard_normal((b, 6)).astype(np.float32),
                 "w": rng.standard_normal((6, 4)).astype(np.float32)}
        (got,), (want,) = exe(feeds), bz.interpret(g, feeds)
        assert got.shape == want.shape == (b, 4)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
