"""MKL's packed-weight sgemm (kernels/mkl_packed.py): the weight packed once, MKL's compute over
the whole product, the epilogue after; against NumPy at odd sizes, and every GEMM site of
the executor (linear, plain matmul, attention block) run on it against the interpreter."""
import numpy as np
import pytest

import braze as bz
from braze import models
from braze.runtime.kernels import c_snippets, mkl_packed

needs_mkl = pytest.mark.skipif(not mkl_packed.available(), reason="no MKL or no C compiler")


def _gelu(y):
    from braze.ir.ops.elementwise import Unary, UnaryFn

    return Unary(UnaryFn.GELU).reference(y)


@needs_mkl
@pytest.mark.parametrize("rows,k,n", [(1, 1, 1), (5, 13, 7), (37, 45, 71), (130, 96, 200)])
@pytest.mark.parametrize("epilogue", ["none", "bias", "bias_gelu", "gelu"])
def test_matches_numpy(rows, k, n, epilogue):
    rng = np.random.default_rng(rows * 1000 + k)
    x = rng.standard_normal((rows, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    bias = rng.standard_normal(n, dtype=np.float32) if "bias" in epilogue else None
    act = c_snippets.ACT_CODES["gelu"] if "gelu" in epilogue else 0
    packed = mkl_packed.pack(w)
    out = np.full((rows, n), np.nan, np.float32)
    assert mkl_packed.gemm(x, packed, out, bias, act)
    want = x.astype(np.float64) @ w
    if bias is not None:
        want = want + bias
    if act:
        want = _gelu(want.astype(np.float32))
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5 * np.sqrt(k))


@needs_mkl
def test_operands_that_do_not_fit_are_declined_untouched():
    w = np.ones((8, 6), np.float32)
    packed = mkl_packed.pack(w)
    out = np.full((4, 6), 7.0, np.float32)
    assert not mkl_packed.gemm(np.ones((4, 9), np.float32), packed, out, None, 0)   # k
    assert not mkl_packed.gemm(np.ones((4, 8), np.float64), packed, out, None, 0)   # dtype
    assert not mkl_packed.gemm(np.ones((8, 4), np.float32).T, packed, out, None, 0)  # strides
    assert not mkl_packed.gemm(np.ones((4, 8), np.float32), packed, out,
                               np.ones(5, np.float32), 0)                          # bias
    assert (out == 7.0).all()
    assert mkl_packed.pack(np.ones((2, 3, 4), np.float32)) is None
    assert mkl_packed.pack(np.ones((3, 4), np.float64)) is None


@needs_mkl
@pytest.mark.parametrize("build", [lambda: models.bert_encoder(2, 64, 4, batch=2, seq=9),
                                   lambda: models.llama_tiny()], ids=["bert", "llama"])
def test_models_run_every_gemm_on_it(monkeypatch, build):
    monkeypatch.setenv("BRAZE_FP32_GEMM", "mkl_packed")
    g = build()
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params)
    feeds = bz.random_feeds(g, 3)
    rows = exe.dispatch_report(feeds).rows
    assert sum("MKL packed-weight sgemm" in r[3] for r in rows) >= 2
    for got, want in zip(exe(feeds), bz.interpret(g, feeds, params), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
