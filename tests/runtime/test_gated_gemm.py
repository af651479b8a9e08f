"""The gated GEMM epilogue: a matmul (or bias-only fused_matmul_bias_act) on a static weight
whose only reader is fused_swiglu runs as one step, braze's packed-weight GEMM writing
act(gate) * up per tile (packed_gemm.pack_gated / gemm_gated). Checked against the reference
interpreter on random inputs at odd sizes (M 1..37, F not a multiple of 16, odd K), both gate
orders, every activation, bias / no bias, 1 and 2 threads, batch 1 and > 1; and the cases that
must stay two steps (the product also an output or read twice, an activated GEMM, a weight fed
at run time, the opt-out switches), which still compute the right result."""
import numpy as np
import pytest

import braze as bz
from braze.ir.ops.elementwise import UnaryFn
from braze.ir.ops.fused_simple import FusedSwiGLU
from braze.models.llama import llama_decoder
from braze.runtime.kernels import Dispatch, c_snippets
from braze.runtime.kernels import packed_gemm as pg

pytestmark = pytest.mark.skipif(pg.lib() is None, reason="no C compiler")

ACTS = ["silu", "gelu", "gelu_approx", "sigmoid", "quick_gelu", "tanh"]  # tanh: the span path
FUSED = "braze packed-weight GEMM + "


@pytest.fixture(autouse=True)
def gated_on(monkeypatch):
    monkeypatch.setenv("BRAZE_PACKED_GEMM", "1")
    monkeypatch.setenv("BRAZE_GATED_GEMM", "1")


def _mlp(batch, m, k, f, gate_first=True, act="silu", bias=False, fused_op=False):
    """x [batch, m, k] @ w [k, 2f] (+ b) -> fused_swiglu."""
    g = bz.Graph("gated")
    x = g.input("x", bz.Shape((batch, m, k)))
    w = g.param("w", bz.Shape((k, 2 * f)))
    b = g.param("b", bz.Shape((2 * f,))) if bias else None
    h = g.linear_fused(x, w, b) if bias or fused_op else g.matmul(x, w)
    g.set_outputs([g.fused_swiglu(h, gate_first, act)])
    return g


def _run_matches(g, threads=2, rtol=2e-4, atol=2e-5, seeds=(0, 1)):
    params = bz.init_params(g, 3)
    exe = bz.compile(g, params=params, fuse=False, threads=threads)
    for seed in seeds:
        feeds = bz.random_feeds(g, seed)
        want = bz.interpret(g, feeds, params)
        for got, ref in zip(exe(feeds), want, strict=True):
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)
    return exe


def _gated_steps(exe):
    prog = exe._last
    return [s for s in prog.steps if s.into is not None]


def _assert_fused(exe, act):
    (step,) = _gated_steps(exe)
    assert isinstance(step.into.op, FusedSwiGLU)
    assert step.kernel.name.startswith(FUSED) and step.kernel.name.endswith(f"gated {act}")
    rows = {kind: (d, impl) for _, kind, d, impl in exe.dispatch_report().rows}
    assert rows["fused_swiglu"][0] == Dispatch.NATIVE
    assert rows["fused_swiglu"][1].startswith(f"in the epilogue of %{step.node.id}")
    # the [.., 2F] product has no buffer: only the fused step writes, and only the gated output
    assert all(s.into is None for s in exe._last.steps if s is not step)
    assert step.node.value not in {b.key for b in exe.plan.buffers}


@pytest.mark.parametrize("m, k, f", [(1, 1, 1), (1, 31, 40), (5, 17, 7), (13, 65, 33),
                                     (37, 257, 70), (6, 300, 16), (29, 513, 130)])
@pytest.mark.parametrize("gate_first", [True, False])
def test_matmul_then_swiglu_is_one_step_and_matches(m, k, f, gate_first):
    exe = _run_matches(_mlp(1, m, k, f, gate_first))
    _assert_fused(exe, "silu")


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("gate_first", [True, False])
def test_every_activation_bias_and_thread_count(act, bias, threads, gate_first):
    g = _mlp(3, 11, 77, 45, gate_first, act, bias, fused_op=True)
    exe = _run_matches(g, threads=threads)
    _assert_fused(exe, act)
    assert _gated_steps(exe)[0].kernel.name.startswith(FUSED + "bias + ") == bias


@pytest.mark.parametrize("batch, m", [(1, 37), (4, 9), (2, 1)])
def test_batch_dims_are_rows(batch, m):
    _assert_fused(_run_matches(_mlp(batch, m, 129, 50, bias=True)), "silu")


def test_bias_fed_at_run_time_is_laid_out_per_call():
    g = bz.Graph("gated")
    x = g.input("x", bz.Shape((2, 7, 19)))
    b = g.input("b", bz.Shape((2 * 21,)))
    w = g.param("w", bz.Shape((19, 2 * 21)))
    g.set_outputs([g.fused_swiglu(g.linear_fused(x, w, b), gate_first=False)])
    _assert_fused(_run_matches(g), "silu")


def _one_gemm_kinds(exe):
    return [s.node.op.label for s in exe._last.steps]


def test_product_also_an_output_is_not_fused():
    g = bz.Graph("gated")
    x = g.input("x", bz.Shape((1, 9, 33)))
    h = g.matmul(x, g.param("w", bz.Shape((33, 2 * 20))))
    g.set_outputs([g.fused_swiglu(h), h])
    exe = _run_matches(g)
    assert not _gated_steps(exe) and _one_gemm_kinds(exe) == ["matmul", "fused_swiglu"]


@pytest.mark.parametrize("second", ["relu", "swiglu"])
def test_product_read_twice_is_not_fused(second):
    g = bz.Graph("gated")
    x = g.input("x", bz.Shape((2, 5, 33)))
    h = g.matmul(x, g.param("w", bz.Shape((33, 2 * 20))))
    other = g.relu(h) if second == "relu" else g.fused_swiglu(h, gate_first=False)
    g.set_outputs([g.fused_swiglu(h), other])
    exe = _run_matches(g)
    assert not _gated_steps(exe)
    assert len(exe._last.steps) == 3


def test_activated_gemm_and_fed_weight_are_not_fused():
    g = bz.Graph("gated")
    x = g.input("x", bz.Shape((1, 6, 24)))
    act_first = g.linear_fused(x, g.param("w", bz.Shape((24, 2 * 18))), None, "relu")
    fed = g.matmul(x, g.input("w2", bz.Shape((24, 2 * 18))))
    g.set_outputs([g.fused_swiglu(act_first), g.fused_swiglu(fed)])
    exe = _run_matches(g)
    assert not _gated_steps(exe) and len(exe._last.steps) == 4


@pytest.mark.parametrize("switch", ["BRAZE_GATED_GEMM", "BRAZE_PACKED_GEMM"])
def test_opt_out_keeps_two_steps(switch, monkeypatch):
    monkeypatch.setenv(switch, "0")
    exe = _run_matches(_mlp(2, 7, 40, 24, bias=True))
    assert not _gated_steps(exe)
    assert _one_gemm_kinds(exe) == ["fused_matmul_bias_act", "fused_swiglu"]


def test_mkl_packed_product_runs_before_the_gated_kernel(monkeypatch):
    """Where MKL's packed sgemm is the choice for the plain product by the gate / up weight,
    the MLP runs as that product and the gated kernel after it (faster than braze's packed
    GEMM with the gated epilogue there), with the same numbers."""
    from braze.runtime.kernels import mkl_packed

    if not mkl_packed.available():
        pytest.skip("MKL's packed sgemm is not installed")
    monkeypatch.setenv("BRAZE_FP32_GEMM", "mkl_packed")
    exe = _run_matches(_mlp(2, 7, 40, 24, bias=True))
    assert not _gated_steps(exe)
    rows = {kind: impl for _, kind, _, impl in exe.dispatch_report().rows}
    assert rows["fused_matmul_bias_act"].startswith("MKL packed-weight sgemm")
    assert _one_gemm_kinds(exe) == ["fused_matmul_bias_act", "fused_swiglu"]


def test_fusion_pipeline_llama_mlp_runs_gated():
    g = llama_decoder(layers=2, hidden=48, heads=4, kv_heads=2,
                      intermediate=70, batch=2, seq=5, seed=0)
    params = dict(g.weights)
    exe = bz.compile(g, params=params, threads=2)
    for seed in (0, 1):
        feeds = bz.random_feeds(g, seed)
        want = bz.interpret(g, feeds, params)
        for got, ref in zip(exe(feeds), want, strict=True):
            np.testing.assert_allclose(got, ref, rtol=2e-4, atol=2e-4)
    assert len(_gated_steps(exe)) == 2
    profile = exe.profile(bz.random_feeds(g, 2))
    assert sum(r.kind.endswith("+ fused_swiglu") for r in profile.rows) == 2


@pytest.mark.parametrize("m, k, f", [(1, 1, 1), (37, 17, 40), (5, 769, 130), (200, 300, 33)])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("gate_first", [True, False])
def test_kernel_matches_float64(m, k, f, act, gate_first):
    rng = np.random.default_rng(m + k + f)
    x = rng.standard_normal((m, k)).astype("f4")
    w = (rng.standard_normal((k, 2 * f)) / np.sqrt(k)).astype("f4")
    bias = rng.standard_normal(2 * f).astype("f4")
    packed = pg.pack_gated(w, gate_first)
    assert packed.n == 2 * -(-f // pg.PANEL) * pg.PANEL and packed.out_cols == f
    ref = FusedSwiGLU(gate_first, UnaryFn(act))
    for b in (bias, None):
        out = np.full((m, f), np.nan, np.float32)
        paired = None if b is None else pg.gate_up_pairs(b, gate_first)
        assert pg.gemm_gated(x, packed, out, paired, c_snippets.ACT_CODES[act])
        h = x.astype("f8") @ w.astype("f8") + (0 if b is None else b)
        np.testing.assert_allclose(out, ref.reference(h), rtol=1e-4, atol=2e-5)


def test_kernel_declines_what_does_not_fit():
    w = np.ones((8, 10), np.float32)
    packed = pg.pack_gated(w)
    x, out = np.ones((3, 8), np.float32), np.empty((3, 5), np.float32)
    assert not pg.gemm_gated(x, packed, out, None, 0)  # no activation
    assert not pg.gemm_gated(x, pg.pack(w), out, None, 3)  # a plain packed weight
    assert not pg.gemm(x, packed, np.empty((3, 10), np.float32), None, 0)  # a gated one
    assert not pg.gemm_gated(x, packed, np.empty((3, 6), np.float32), None, 3)
    assert pg.pack_gated(np.ones((8, 9), np.float32)) is None  # odd: no halves


@pytest.mark.parametrize("m, k", [(1, 1024), (37, 2048), (130, 1024), (3000, 2048)])
@pytest.mark.parametrize("gated", [False, True])
def test_rows_4kb_apart_match_float64(m, k, gated):
    """K a multiple of 1024: x is copied once into padded rows (or, past PAD_X_FLOATS, per
    tile, the m = 3000 case); either way the product is the same."""
    rng = np.random.default_rng(m + k)
    x = rng.standard_normal((m, k)).astype("f4")
    w = (rng.standard_normal((k, 2 * 24)) / np.sqrt(k)).astype("f4")
    h = x.astype("f8") @ w.astype("f8")
    assert (m * (k + 16) <= pg.PAD_X_FLOATS) == (m < 3000)
    if gated:
        out = np.full((m, 24), np.nan, np.float32)
        assert pg.gemm_gated(x, pg.pack_gated(w), out, None, c_snippets.ACT_CODES["silu"])
        want = FusedSwiGLU(True, UnaryFn.SILU).reference(h)
    else:
        out = np.full((m, 48), np.nan, np.float32)
        assert pg.gemm(x, pg.pack(w), out, None, 0)
        want = h
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=2e-5)
