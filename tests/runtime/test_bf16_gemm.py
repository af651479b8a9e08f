"""The bf16 GEMM path of the compiled executor (kernels/bf16_gemm.py): under the bf16 policy a
GEMM on a static bf16-valued weight runs a bf16 GEMM (MKL's or braze's), reading the operand
before the policy's rounding and rounding it itself; the rounding casts are left out of the
run. Checked against the reference interpreter on the policy's graph (`exe.graph`), odd sizes
included."""
import ml_dtypes
import numpy as np
import pytest

import braze as bz
from braze import models
from braze.runtime.kernels import bf16_gemm

needs_bf16 = pytest.mark.skipif(not bf16_gemm.available(),
                                reason="no MKL bf16 GEMM or no AMX / AVX512-BF16 CPU here")


def _policy_reference(exe, feeds, params=None):
    return bz.interpret(exe.graph, feeds, params or {})


def _rows(exe, g) -> list[tuple]:
    return exe.dispatch_report(bz.random_feeds(g, 0)).rows


def _close(got, want):
    """Within 4e-3 of the output's largest magnitude, and 99% of elements within rtol 1e-3:
    the GEMM sums in another order than NumPy, and an f32 difference in the last bit can flip
    a later operand's bf16 rounding (one bf16 step, 2**-8 relative) now and then."""
    for g, w in zip(got, want, strict=True):
        scale = max(1.0, float(np.abs(w).max()))
        assert np.abs(g - w).max() < 4e-3 * scale
        assert np.mean(np.abs(g - w) <= 1e-3 * np.abs(w) + 1e-4 * scale) > 0.99


@pytest.mark.skipif(bf16_gemm._lib() is None, reason="no C compiler")
def test_rounding_matches_ml_dtypes_on_edge_values():
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2 ** 32, 50_000, dtype=np.uint64).astype(np.uint32)
    special = np.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0x00008000,
                        0x7F800000, 0xFF800000, 0x7FC00001, 0x7F800001, 0x80000000],
                       np.uint32)  # ties to even both ways, max, denormal, inf, NaNs, -0
    x = np.concatenate([bits, special]).view(np.float32).reshape(-1, 10)
    out = np.empty(x.shape, np.uint16)
    bf16_gemm._lib().round_bf16(x.ctypes.data, 10, out.ctypes.data, x.shape[0], 10)
    with np.errstate(invalid="ignore"):
        want = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    finite = np.isfinite(x) | np.isinf(x)
    np.testing.assert_array_equal(out[finite], want[finite])
    assert np.isnan(out[~finite].view(ml_dtypes.bfloat16).astype(np.float32)).all()


def _mlp(rows: int, k: int, n: int) -> bz.Graph:
    g = bz.Graph("mlp")
    x = g.input("x", bz.Shape((rows, k)))
    h = g.layer_norm(x, g.param("gamma", bz.Shape((k,))), g.param("beta", bz.Shape((k,))))
    h = g.linear_fused(h, g.param("w1", bz.Shape((k, n))), g.param("b1", bz.Shape((n,))), "gelu")
    y = g.linear_fused(h, g.param("w2", bz.Shape((n, k))), g.param("b2", bz.Shape((k,))))
    g.set_outputs([g.add(y, x)])
    return g


@needs_bf16
@pytest.mark.parametrize("rows,k,n", [(5, 13, 7), (64, 96, 160), (1, 8, 33)])
def test_linear_layers_run_the_bf16_gemm(rows, k, n):
    g = _mlp(rows, k, n)
    params = bz.init_params(g, seed=1)
    exe = bz.compile(g, params=params, precision="bf16", threads=2)
    rows_ = _rows(exe, g)
    gemms = [r for r in rows_ if r[1].startswith("fused_matmul_bias_act")]
    assert len(gemms) == 2 and all("bf16 GEMM" in r[3] for r in gemms)
    folded = [r for r in rows_ if r[1] == "cast" and
              r[3].startswith(("done inside", "in the epilogue"))]
    assert len(folded) == 4  # each GEMM's operand: cast to bf16 and back, no step of its own
    for seed in (2, 3):
        feeds = bz.random_feeds(g, seed)
        _close(exe(feeds), _policy_reference(exe, feeds, params))


@needs_bf16
def test_f32_and_unrounded_operands_keep_the_f32_gemm():
    g = _mlp(8, 32, 48)
    params = bz.init_params(g, seed=1)
    exe = bz.compile(g, params=params, threads=1)
    assert not any("bf16" in r[3] for r in _rows(exe, g))
    # a policy graph compiled without the policy: the weights are bf16 numbers, but nothing
    # says the kernel may round its operand: the f32 GEMM runs
    fused, _ = bz.fuse(g, "cpu")
    from braze.passes.precision import apply_precision

    policy_graph, _ = apply_precision(fused, "bf16")
    plain = bz.compile(policy_graph, params=params, threads=1, fuse=False)
    assert not any("bf16" in r[3] for r in _rows(plain, policy_graph))


@needs_bf16
def test_attention_block_projects_qkv_and_output_in_bf16():
    g = models.bert_encoder(2, 64, 4, batch=2, seq=8)
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params, precision="bf16")
    blocks = [r for r in _rows(exe, g) if r[1].startswith("fused_attention_block")]
    assert len(blocks) == 2
    # q/k/v and the output on a bf16 GEMM (MKL's or braze's, whichever measured faster here)
    assert all("bf16 GEMM" in r[3] and "f32 GEMM" not in r[3] for r in blocks)
    feeds = bz.random_feeds(g, 5)
    _close(exe(feeds), _policy_reference(exe, feeds, params))


@pytest.mark.skipif(bf16_gemm._lib() is None, reason="no C compiler")
def test_attention_block_without_the_bf16_gemm_rounds_the_result_itself(monkeypatch):
    """The policy rounds the attention result (the block's round_attention); compiled without
    the policy (no bf16 GEMM) the kernel rounds it in place before its f32 output projection,
    and matches the policy graph's interpreter far closer than without that rounding."""
    from braze.passes.precision import apply_precision

    g = models.bert_encoder(1, 64, 4, batch=2, seq=8)
    fused, _ = bz.fuse(g, "cpu")
    policy_graph, _ = apply_precision(fused, "bf16")
    params = bz.init_params(g, 0)
    feeds = bz.random_feeds(g, 2)
    want = bz.interpret(policy_graph, feeds, params)[0]

    def error() -> float:
        exe = bz.compile(policy_graph, params=params, fuse=False)
        blocks = [r for r in _rows(exe, policy_graph)
                  if r[1].startswith("fused_attention_block")]
        assert len(blocks) == 1 and "bf16 GEMM" not in blocks[0][3]
        return float(np.abs(exe(feeds)[0] - want).mean())

    rounded = error()
    monkeypatch.setattr(bf16_gemm, "round_through", lambda a, dtype: None)
    assert rounded * 10 < error()


@pytest.mark.skipif(bf16_gemm._lib() is None, reason="no C compiler")
def test_round_through_matches_the_policy_casts():
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2 ** 32, 70_000, dtype=np.uint64).astype(np.uint32)
    special = np.array([0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x00008000, 0x7F800000,
                        0xFF800000, 0x7FC00001, 0x7F800001, 0x80000000], np.uint32)
    x = np.concatenate([bits, special]).view(np.float32)
    got = x.copy()
    bf16_gemm.round_through(got, bz.bf16)
    with np.errstate(invalid="ignore", over="ignore"):
        want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    nan = np.isnan(x)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert np.isnan(got[nan]).all()
    half = x[:100].copy()
    bf16_gemm.round_through(half, bz.f16)
    with np.errstate(invalid="ignore", over="ignore"):
        np.testing.assert_array_equal(half, x[:100].astype(np.float16).astype(np.float32))


@needs_bf16
@pytest.mark.parametrize("weights", ["auto", "mkl"])
def test_gated_mlp_runs_bf16_product_then_gate(weights, monkeypatch):
    """With braze's bf16 kernels, act(gate) * up is their GEMM's epilogue; with MKL's the
    C gated kernel runs after the product."""
    if weights == "mkl" and bf16_gemm._mkl() is None:
        pytest.skip("no MKL bf16 GEMM")
    monkeypatch.setenv("BRAZE_BF16_GEMM", weights)
    g = models.llama_tiny()
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params, precision="bf16")
    rows = _rows(exe, g)
    gated = [r for r in rows if r[1] == "fused_swiglu"]
    assert gated
    if weights == "auto" and bf16_gemm._own():
        assert all(r[3].startswith("in the epilogue") and "gated silu" in r[3] for r in gated)
    else:
        assert all(r[3].startswith("C gated") for r in gated)
    assert sum("bf16 GEMM" in r[3] for r in rows) >= 4
    feeds = bz.random_feeds(g, 1)
    _close(exe(feeds), _policy_reference(exe, feeds, params))


@needs_bf16
def test_new_weights_are_prepared_again():
    g = _mlp(16, 32, 24)
    params = bz.init_params(g, seed=1)
    exe = bz.compile(g, params=params, precision="bf16")
    feeds = bz.random_feeds(g, 0)
    before = exe(feeds)[0].copy()
    new = bz.init_params(g, seed=7)
    exe.update_weights(new)
    after = exe(feeds)[0]
    assert not np.allclose(before, after)
    _close([after], _policy_reference(exe, feeds, new))
