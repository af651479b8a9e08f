"""braze's AVX512-BF16 GEMM (kernels/dpbf16_gemm.py): exact bf16 products accumulated in f32,
against NumPy at sizes that cut across its panels, micro blocks, K blocks and tiles (odd k
included), with every epilogue, bf16 operands and results, and the gated epilogue; declined
operands leave the output alone; under the bf16 policy it runs the models' GEMMs and matches
the policy graph's interpreter; the bf16 GEMM a weight shape runs is measured once."""
import json

import ml_dtypes
import numpy as np
import pytest

import braze as bz
from braze import models
from braze.ir.ops.elementwise import Unary, UnaryFn
from braze.runtime.kernels import bf16_gemm, c_snippets, dpbf16_gemm
from braze.runtime.kernels.packed_gemm import gate_up_pairs

needs_dp = pytest.mark.skipif(not dpbf16_gemm.available(), reason="no AVX512-BF16 here")
BF16 = ml_dtypes.bfloat16


def _bf16(a):
    return np.asarray(a, np.float32).astype(BF16).astype(np.float32)


def _act(v, act):
    if not act:
        return v
    with np.errstate(over="ignore"):
        return Unary(UnaryFn(act)).reference(np.asarray(v, np.float32)).astype(np.float64)


@needs_dp
@pytest.mark.parametrize("rows,k,n", [(1, 1, 1), (5, 13, 7), (7, 33, 17), (37, 45, 71),
                                      (13, 255, 100), (200, 300, 130), (130, 1000, 70),
                                      (400, 64, 64)])
@pytest.mark.parametrize("epilogue", ["none", "bias", "bias_gelu", "silu", "gelu_approx"])
def test_matches_numpy(rows, k, n, epilogue):
    rng = np.random.default_rng(rows + 7 * k + n)
    x = rng.standard_normal((rows, k), dtype=np.float32)
    w = _bf16(rng.standard_normal((k, n), dtype=np.float32))
    bias = rng.standard_normal(n, dtype=np.float32) if "bias" in epilogue else None
    act = {"bias_gelu": "gelu", "silu": "silu", "gelu_approx": "gelu_approx"}.get(epilogue)
    out = np.full((rows, n), np.nan, np.float32)
    x16 = np.empty(dpbf16_gemm.scratch_elems(rows, k), np.uint16)
    assert dpbf16_gemm.gemm(x, dpbf16_gemm.DpWeight(w), out, bias, c_snippets.ACT_CODES[act], x16)
    want = _act(_bf16(x).astype(np.float64) @ w + (0 if bias is None else bias), act)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


@needs_dp
@pytest.mark.parametrize("rows,k,n", [(5, 14, 7), (37, 64, 33), (200, 96, 48), (9, 13, 20),
                                      (300, 512, 40)])
@pytest.mark.parametrize("out16", [False, True])
def test_bf16_operand_and_bf16_result(rows, k, n, out16):
    """bf16 operands are read in place (even k) or copied (odd k); a bf16 result is the f32
    result rounded to nearest even."""
    rng = np.random.default_rng(rows * k + n)
    x = rng.standard_normal((rows, k)).astype(BF16)
    w = _bf16(rng.standard_normal((k, n)))
    bias = rng.standard_normal(n, dtype=np.float32)
    weight = dpbf16_gemm.DpWeight(w)
    x16 = np.zeros(dpbf16_gemm.scratch_elems(rows, k), np.uint16)
    f32 = np.full((rows, n), np.nan, np.float32)
    assert dpbf16_gemm.gemm(x.astype(np.float32), weight, f32, bias, 0, x16)
    np.testing.assert_allclose(f32, x.astype(np.float64) @ w + bias, rtol=1e-5,
                               atol=1e-5 * np.sqrt(k))
    out = np.full((rows, n), np.nan, BF16 if out16 else np.float32)
    assert dpbf16_gemm.gemm(x, weight, out, bias, 0, x16)
    want = f32.astype(BF16) if out16 else f32
    np.testing.assert_array_equal(out.view(np.uint16) if out16 else out,
                                  want.view(np.uint16) if out16 else want)


@needs_dp
@pytest.mark.parametrize("rows,k,f", [(5, 13, 7), (37, 64, 40), (130, 96, 100), (7, 256, 16)])
@pytest.mark.parametrize("gate_first", [True, False])
@pytest.mark.parametrize("out16", [False, True])
@pytest.mark.parametrize("act", ["silu", "sigmoid", "quick_gelu", "gelu", "relu", "tanh"])
def test_gated_epilogue(rows, k, f, gate_first, out16, act):
    rng = np.random.default_rng(rows + k + f)
    x = rng.standard_normal((rows, k), dtype=np.float32)
    w = _bf16(rng.standard_normal((k, 2 * f)) / np.sqrt(k))
    bias = rng.standard_normal(2 * f, dtype=np.float32)
    weight = dpbf16_gemm.DpWeight(w, gate_first)
    assert weight.gated and weight.out_cols == f
    out = np.full((rows, f), np.nan, BF16 if out16 else np.float32)
    x16 = np.empty(dpbf16_gemm.scratch_elems(rows, k), np.uint16)
    assert dpbf16_gemm.gemm(x, weight, out, gate_up_pairs(bias, gate_first),
                            c_snippets.ACT_CODES[act], x16)
    full = _bf16(x).astype(np.float64) @ w + bias
    gate, up = (full[:, :f], full[:, f:]) if gate_first else (full[:, f:], full[:, :f])
    want = _act(gate, act) * up
    tol = 2.0 ** -8 if out16 else 1e-5
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=tol,
                               atol=tol * np.abs(want).max())


@needs_dp
def test_operands_that_do_not_fit_are_declined_untouched():
    w = dpbf16_gemm.DpWeight(np.ones((40, 24), np.float32))
    out = np.full((3, 24), 7.0, np.float32)
    x16 = np.empty(dpbf16_gemm.scratch_elems(3, 40), np.uint16)
    x = np.ones((3, 40), np.float32)
    assert not dpbf16_gemm.gemm(np.ones((3, 41), np.float32), w, out, None, 0, x16)     # k
    assert not dpbf16_gemm.gemm(x, w, out, None, 0, x16[:3 * 40 - 1])                   # scratch
    assert not dpbf16_gemm.gemm(x, w, out, np.ones(23, np.float32), 0, x16)             # bias
    assert not dpbf16_gemm.gemm(np.ones((40, 3), np.float32).T, w, out, None, 0, x16)   # strides
    assert not dpbf16_gemm.gemm(x, w, out.astype(np.float64), None, 0, x16)             # dtype
    assert (out == 7.0).all()
    assert dpbf16_gemm.gemm(x, w, out, None, 0, x16) and (out == 40.0).all()


KINDS = {"amx": "braze bf16 GEMM (AMX tiles)", "mkl": "MKL bf16 GEMM",
         "dp": "braze bf16 GEMM (AVX512-BF16)"}


@pytest.mark.parametrize("kind", ["amx", "dp"])
@pytest.mark.parametrize("build", [lambda: models.bert_encoder(2, 64, 4, batch=2, seq=9),
                                   lambda: models.llama_tiny()], ids=["bert", "llama"])
def test_models_run_their_bf16_gemms_on_braze_kernels(monkeypatch, build, kind):
    """Forced to one of braze's bf16 GEMMs (the AMX one: test_amx_gemm.py's kernel tests)."""
    monkeypatch.setenv("BRAZE_BF16_GEMM", kind)
    if kind not in bf16_gemm._kinds():
        pytest.skip(f"no {KINDS[kind]} here")
    g = build()
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params, precision="bf16")
    feeds = bz.random_feeds(g, 4)
    rows = exe.dispatch_report(feeds).rows
    assert sum(KINDS[kind] in r[3] for r in rows) >= 2
    assert not any(name in r[3] for r in rows for other, name in KINDS.items() if other != kind)
    want = bz.interpret(exe.graph, feeds, params)
    for got, w in zip(exe(feeds), want, strict=True):
        scale = max(1.0, float(np.abs(w).max()))
        assert np.abs(got - w).max() < 4e-3 * scale


@pytest.mark.skipif(len(bf16_gemm._kinds()) < 2, reason="one bf16 GEMM here: nothing to measure")
def test_the_fastest_bf16_gemm_is_measured_once_per_shape(monkeypatch, tmp_path):
    from braze.runtime.kernels import gemm_choice

    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("BRAZE_GEMM_CHOICES", raising=False)
    monkeypatch.setattr(gemm_choice, "_choices", None)
    monkeypatch.delenv("BRAZE_BF16_GEMM", raising=False)
    g = models.bert_encoder(1, 64, 4, batch=1, seq=8)
    exe = bz.compile(g, params=bz.init_params(g, 0), precision="bf16")
    rows = exe.dispatch_report(bz.random_feeds(g, 0)).rows
    saved = json.loads(next(tmp_path.glob("gemm_choice_*.json")).read_text())
    key = gemm_choice.bf16_key
    bf16 = {k: v for k, v in saved.items() if k.startswith(key(0, 0).split(":")[0] + ":")}
    assert set(bf16) == {key(64, 192), key(64, 64), key(64, 256), key(256, 64)}
    assert set(bf16.values()) <= set(bf16_gemm._kinds())
    mlp = [r for r in rows if r[1] == "fused_matmul_bias_act"]
    assert KINDS[bf16[key(64, 256)]] in mlp[0][3] and KINDS[bf16[key(256, 64)]] in mlp[1][3]


@needs_dp
@pytest.mark.parametrize("rows,k,n", [(37, 64, 33), (130, 96, 200), (5, 13, 7), (64, 256, 64)])
def test_tanh_gelu_bf16_result(rows, k, n):
    """A bf16 result of the tanh GELU (v sigmoid(2u) with a vector exp, c_snippets.BF16_ROW) is
    the exact function's value rounded to bf16, but one step off at near ties; no value is
    further off than one bf16 step (plus the f32 sums' own rounding near zero), the left tail
    (e^-2u past float32's range) included."""
    rng = np.random.default_rng(rows + k + n)
    x = rng.standard_normal((rows, k), dtype=np.float32)
    w = _bf16(rng.standard_normal((k, n)) / np.sqrt(k) * 4)
    bias = rng.standard_normal(n, dtype=np.float32)
    out = np.full((rows, n), np.nan, BF16)
    x16 = np.empty(dpbf16_gemm.scratch_elems(rows, k), np.uint16)
    act = c_snippets.ACT_CODES["gelu_approx"]
    assert dpbf16_gemm.gemm(x, dpbf16_gemm.DpWeight(w), out, bias, act, x16)
    v = _bf16(x).astype(np.float64) @ w + bias
    # v sigmoid(2u), in float64: 0.5 v (1 + tanh u) cancels to 0 in the left tail
    want = v / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))
    got = out.astype(np.float64)
    step = np.spacing(np.abs(want).astype(BF16)).astype(np.float64)
    sums = np.abs(_bf16(x).astype(np.float64)) @ np.abs(w) + np.abs(bias)
    assert (np.abs(got - want) <= step + sums * 2.0 ** -19).all()
    assert np.mean(got == want.astype(np.float32).astype(BF16).astype(np.float64)) > 0.97
    assert (v < -4).any() and (v > 4).any()  # both tails reached
