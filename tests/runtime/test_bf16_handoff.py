"""The bf16 hand-off between GEMMs (fused.rounded_output, KernelContext.handoff): under the bf16
policy a GEMM whose product only the policy's rounding for the next GEMM reads writes that
product in bf16 from its epilogue, and the next GEMM reads those bf16 values as its operand.
Checked against the reference interpreter on the policy's graph, odd sizes included, and
against NumPy for the AMX kernel's bf16 operand and bf16 output. The model-level tests run on
each of braze's bf16 GEMMs this CPU has (AMX tiles, AVX512-BF16)."""
import ml_dtypes
import numpy as np
import pytest

import braze as bz
from braze.runtime.kernels import amx_gemm, bf16_gemm, dpbf16_gemm

needs_amx = pytest.mark.skipif(not (amx_gemm.available() and bf16_gemm.available()),
                               reason="no AMX-BF16 here")
OWN = [kind for kind, here in (("amx", amx_gemm.available()), ("dp", dpbf16_gemm.available()))
       if here and bf16_gemm.available()]
# each of braze's own bf16 GEMMs here (the hand-off and the gated epilogue are theirs alone)
own_kinds = pytest.mark.parametrize(
    "own", OWN or [pytest.param("amx", marks=pytest.mark.skip(reason="no braze bf16 GEMM"))])
BF16 = ml_dtypes.bfloat16


def _bf16(a):
    return np.asarray(a, np.float32).astype(BF16).astype(np.float32)


def _gelu(v):
    from scipy.special import erf
    return 0.5 * v * (1 + erf(v / np.sqrt(2)))


@pytest.mark.parametrize("rows,k,n", [(1, 32, 16), (37, 64, 33), (64, 96, 40), (100, 13, 70),
                                      (33, 320, 64), (300, 64, 40), (600, 96, 72),
                                      (130, 64, 200)])
@pytest.mark.parametrize("epilogue", ["none", "bias+gelu"])
@pytest.mark.parametrize("kernel", ["amx", "dp"])
def test_braze_kernels_read_bf16_and_write_bf16(rows, k, n, epilogue, kernel):
    """On braze's AMX and AVX512-BF16 GEMMs alike: a bf16 operand gives the f32 operand's
    numbers; a bf16 result is the f32 result rounded, but for the GELU epilogue's own
    approximation (a rational erf): against the exact GELU of the f32 product, a result may be
    one bf16 step off only at a near tie (within 2^-14 relative of one, or within the f32
    sums' rounding, 2^-19 of their terms' magnitudes), within that rounding of the sums
    (results near zero), or in the left tail (v < -1.5), where 0.5 v (1 + erf) cancels as
    libmvec's erff form does."""
    gemm = {"amx": amx_gemm, "dp": dpbf16_gemm}[kernel]
    if not gemm.available():
        pytest.skip(f"no {kernel} bf16 GEMM here")
    weight = {"amx": amx_gemm.AmxWeight, "dp": dpbf16_gemm.DpWeight}[kernel]
    rng = np.random.default_rng(rows * k + n)
    x = rng.standard_normal((rows, k)).astype(BF16)
    w = _bf16(rng.standard_normal((k, n)))
    bias, act = (_bf16(rng.standard_normal(n)), 1) if epilogue != "none" else (None, 0)
    x16 = np.zeros(gemm.scratch_elems(rows, k), np.uint16)
    pre = x.astype(np.float64) @ w + (0 if bias is None else bias)
    want = _gelu(pre) if act else pre
    out = np.full((rows, n), np.nan, np.float32)
    assert gemm.gemm(x.astype(np.float32), weight(w), out, bias, act, x16)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    out16 = np.full((rows, n), np.nan, BF16)
    assert gemm.gemm(x, weight(w), out16, bias, act, x16)
    got, exact = out16.view(np.uint16), want.astype(np.float32).astype(BF16).view(np.uint16)
    if not act:
        np.testing.assert_array_equal(got, out.astype(BF16).view(np.uint16))
        return
    off = got != exact
    tail = pre < -1.5  # off there by at most a few float32 ulps of v, as 1 + erf cancels
    assert (np.abs(out16.astype(np.float64) - want)[tail] <= 2e-7 * np.abs(pre[tail])
            + np.abs(want[tail]) * 2.0 ** -8).all()
    one_step = np.abs(got.astype(np.int32) - exact.astype(np.int32)) == 1
    step = np.abs(want.astype(np.float32).astype(BF16).astype(np.float64) - want)
    ulp = np.spacing(np.abs(want).astype(BF16)).astype(np.float64)
    sums = np.abs(x.astype(np.float64)) @ np.abs(w) + np.abs(bias)  # the f32 sums' scale
    near_tie = np.abs(step - ulp / 2) <= np.abs(want) * 2.0 ** -14 + sums * 2.0 ** -19
    # near zero the f32 sums' rounding (32 f32 ulps of their terms' magnitudes here, the GELU's
    # slope at most 1.13) can be several bf16 steps of a small result
    in_sums = np.abs(out16.astype(np.float64) - want) <= sums * 2.0 ** -19
    assert (tail | (one_step & near_tie) | in_sums)[off].all()


def _mlp(rows: int, k: int, n: int, second_weight_input: bool = False,
         product_out: bool = False) -> bz.Graph:
    g = bz.Graph("mlp")
    x = g.input("x", bz.Shape((rows, k)))
    h = g.linear_fused(x, g.param("w1", bz.Shape((k, n))), g.param("b1", bz.Shape((n,))), "gelu")
    w2 = g.input("w2", bz.Shape((n, k))) if second_weight_input else g.param("w2", bz.Shape((n, k)))
    y = g.linear_fused(h, w2, g.param("b2", bz.Shape((k,))))
    g.set_outputs([g.add(y, x)] + ([h] if product_out else []))
    return g


def _compile(g, params):
    return bz.compile(g, params=params, precision="bf16", threads=2)


def _report(exe, feeds):
    return {r[0].split()[0]: r for r in exe.dispatch_report(feeds).rows}


def _close(got, want):
    """Within 4e-3 of the output's largest magnitude, and the median element within 1e-5 of
    it: the kernels sum in another order than NumPy, and an f32 difference in the last bit can
    flip one operand element's bf16 rounding, which then moves its whole row (in a tiny model,
    a few percent of the elements) by up to a bf16 step."""
    for a, b in zip(got, want, strict=True):
        scale = max(1.0, float(np.abs(b).max()))
        assert np.abs(a - b).max() < 4e-3 * scale
        assert np.median(np.abs(a - b)) <= 1e-5 * scale


@own_kinds
@pytest.mark.parametrize("rows,k,n", [(5, 13, 7), (70, 64, 96), (33, 96, 160), (1, 32, 64)])
def test_up_projection_hands_bf16_to_the_down_projection(rows, k, n, own, monkeypatch):
    monkeypatch.setenv("BRAZE_BF16_GEMM", own)
    g = _mlp(rows, k, n)
    params = bz.init_params(g, seed=1)
    exe = _compile(g, params)
    rows_ = exe.dispatch_report(bz.random_feeds(g, 0)).rows
    gemms = [r for r in rows_ if r[1] == "fused_matmul_bias_act"]
    assert "(gelu, bf16 out)" in gemms[0][3] and "bf16 operand handed over" in gemms[1][3]
    epilogue = [r for r in rows_ if r[1] == "cast" and r[3].startswith("in the epilogue")]
    assert len(epilogue) == 1  # the product's cast to bf16: written by the up projection
    assert sum(r[2] == "native" and r[1] == "cast" for r in rows_) == 4  # none runs alone
    for seed in (2, 3):
        feeds = bz.random_feeds(g, seed)
        _close(exe(feeds), bz.interpret(exe.graph, feeds, params))


@own_kinds
def test_a_product_that_is_also_an_output_is_not_handed_over(own, monkeypatch):
    monkeypatch.setenv("BRAZE_BF16_GEMM", own)
    g = _mlp(16, 64, 96, product_out=True)
    params = bz.init_params(g, seed=1)
    exe = _compile(g, params)
    feeds = bz.random_feeds(g, 4)
    names = [r[3] for r in exe.dispatch_report(feeds).rows if r[1] == "fused_matmul_bias_act"]
    assert not any("bf16 out" in s or "handed over" in s for s in names)
    _close(exe(feeds), bz.interpret(exe.graph, feeds, params))


def test_mkl_weights_keep_the_f32_product(monkeypatch):
    if bf16_gemm._mkl() is None:
        pytest.skip("no MKL bf16 GEMM")
    monkeypatch.setenv("BRAZE_BF16_GEMM", "mkl")
    g = _mlp(16, 64, 96)
    params = bz.init_params(g, seed=1)
    exe = _compile(g, params)
    feeds = bz.random_feeds(g, 5)
    names = [r[3] for r in exe.dispatch_report(feeds).rows if r[1] == "fused_matmul_bias_act"]
    assert all("MKL bf16 GEMM" in s and "operand rounded in" in s for s in names)
    _close(exe(feeds), bz.interpret(exe.graph, feeds, params))


@own_kinds
def test_a_reader_that_is_no_bf16_gemm_gets_the_rounded_values_cast_back(own, monkeypatch):
    """The down projection's weight is a graph input (no static bf16 weight to pack): the up
    projection still writes bf16, and the cast back to f32 runs as its own step."""
    monkeypatch.setenv("BRAZE_BF16_GEMM", own)
    g = _mlp(24, 64, 96, second_weight_input=True)
    params = bz.init_params(g, seed=1)
    exe = _compile(g, params)
    feeds = bz.random_feeds(g, 6)
    feeds["w2"] = _bf16(feeds["w2"])
    rows_ = exe.dispatch_report(feeds).rows
    gemms = [r for r in rows_ if r[1] == "fused_matmul_bias_act"]
    assert "bf16 out" in gemms[0][3] and "handed over" not in gemms[1][3]
    assert any(r[1] == "cast" and r[2] == "native" and r[3] == "cast" for r in rows_)
    _close(exe(feeds), bz.interpret(exe.graph, feeds, params))


def test_f32_programs_hand_nothing_over():
    g = _mlp(8, 32, 48)
    params = bz.init_params(g, seed=1)
    exe = bz.compile(g, params=params)
    feeds = bz.random_feeds(g, 7)
    assert not any("bf16" in r[3] for r in exe.dispatch_report(feeds).rows)
    np.testing.assert_allclose(exe(feeds)[0], bz.interpret(g, feeds, params)[0], rtol=1e-4,
                               atol=1e-4)


@pytest.mark.parametrize("weights", OWN + ["mkl"])
def test_gated_mlp_hands_bf16_to_the_down_projection(weights, monkeypatch):
    """act(gate) * up is written in bf16 (by braze's GEMM's gated epilogue, or by the C gated
    kernel after MKL's product) and read as it is by the down projection."""
    if weights == "mkl" and bf16_gemm._mkl() is None:
        pytest.skip("no MKL bf16 GEMM")
    from braze import models

    monkeypatch.setenv("BRAZE_BF16_GEMM", weights)
    g = models.llama_tiny()
    params = bz.init_params(g, 0)
    exe = _compile(g, params)
    feeds = bz.random_feeds(g, 8)
    rows_ = exe.dispatch_report(feeds).rows
    gated = [r for r in rows_ if r[1] == "fused_swiglu"]
    assert gated and all("gated silu, bf16 out" in r[3] for r in gated)
    epilogue = weights != "mkl"
    assert all(r[3].startswith("in the epilogue") == epilogue for r in gated)
    handed = [r for r in rows_ if r[1] == "matmul" and "bf16 operand handed over" in r[3]]
    assert len(handed) == len(gated)
    _close(exe(feeds), bz.interpret(exe.graph, feeds, params))


@pytest.mark.parametrize("weights", OWN + ["mkl"])
def test_attention_block_hands_bf16_through_its_core(weights, monkeypatch):
    """In a fused attention block on braze's bf16 GEMMs the q/k/v projections write bf16 for
    the bf16 attention core (AMX or AVX512-BF16) and the core writes bf16 for the output
    projection; with MKL's GEMMs, f32 as before. The same numbers either way (the policy
    rounds exactly those values)."""
    if weights == "mkl" and bf16_gemm._mkl() is None:
        pytest.skip("no MKL bf16 GEMM")
    from braze import models
    from braze.runtime.kernels import attention

    if attention._bf16_core() is None:
        pytest.skip("no bf16 attention core")
    monkeypatch.setenv("BRAZE_BF16_GEMM", weights)
    g = models.bert_encoder(1, 64, 4, batch=2, seq=24)  # one layer: attention spreads a
    params = bz.init_params(g, 0)                        # rounding flip over every position
    exe = _compile(g, params)
    feeds = bz.random_feeds(g, 9)
    blocks = [r for r in exe.dispatch_report(feeds).rows if r[1] == "fused_attention_block"]
    assert len(blocks) == 1
    inside = "bf16 q/k/v and output"
    assert all((inside in r[3]) == (weights != "mkl") for r in blocks)
    _close(exe(feeds), bz.interpret(exe.graph, feeds, params))


@own_kinds
def test_rope_keeps_f32_q_k_v_but_hands_the_output_over(own, monkeypatch):
    """LLaMA's rope works on the f32 projections before the core rounds them: q/k/v stay f32,
    the core's output still goes to the output projection in bf16."""
    from braze import models
    from braze.runtime.kernels import attention

    if attention._bf16_core() is None:
        pytest.skip("no bf16 attention core")
    monkeypatch.setenv("BRAZE_BF16_GEMM", own)
    g = models.llama_tiny()
    params = bz.init_params(g, 0)
    exe = _compile(g, params)
    feeds = bz.random_feeds(g, 1)
    blocks = [r for r in exe.dispatch_report(feeds).rows if r[1] == "fused_attention_block"]
    assert blocks and all(", bf16 output" in r[3] and "bf16 q/k/v" not in r[3] for r in blocks)
    _close(exe(feeds), bz.interpret(exe.graph, feeds, params))


def test_f32_programs_never_ask_for_the_amx_attention_core(monkeypatch):
    """Asking builds the AMX core's C library (seconds on a cold kernel cache): an f32 compile
    of a model with fused attention blocks must not."""
    from braze import models
    from braze.runtime.kernels import attention_amx

    def asked():
        raise AssertionError("an f32 program asked for the AMX attention core")

    monkeypatch.setattr(attention_amx, "available", asked)
    g = models.bert_encoder(1, 64, 4, batch=1, seq=8)
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params)
    feeds = bz.random_feeds(g, 2)
    assert any(r[1] == "fused_attention_block" for r in exe.dispatch_report(feeds).rows)
    np.testing.assert_allclose(exe(feeds)[0], bz.interpret(g, feeds, params)[0], rtol=1e-4,
                               atol=1e-4)
