"""Native kernels against the reference interpreter on random inputs, odd sizes included:
matmul epilogues, norms (residual, exposed sum), softmax, activations, gated MLPs, rope,
attention (every mask kind, GQA, softcap, query blocking) and the fused attention block."""
import numpy as np
import pytest

import braze as bz
from braze.ir.ops.attention import rope_tables
from braze.runtime.kernels import Dispatch, c_snippets, native

pytestmark = pytest.mark.skipif(native.lib() is None, reason="no C compiler on this machine")


def _compiled_matches(g, params=None, symbols=None, rtol=2e-5, atol=2e-5, seeds=(0, 1)):
    params = params if params is not None else bz.init_params(g, 0)
    exe = bz.compile(g, params=params, fuse=False)
    for seed in seeds:
        feeds = bz.random_feeds(g, seed, symbols)
        want = bz.interpret(g, feeds, params)
        got = exe(feeds)
        for a, w in zip(got, want, strict=True):
            np.testing.assert_allclose(a, w, rtol=rtol, atol=atol)
    return exe


def _implementations(exe, kind):
    return {impl for _, k, _, impl in exe.dispatch_report().rows if k == kind}


def _native_kinds(exe):
    return {kind for _, kind, d, _ in exe.dispatch_report().rows if d == Dispatch.NATIVE}


@pytest.mark.parametrize("act", [None, "gelu", "gelu_approx", "silu", "relu", "sigmoid", "tanh",
                                 "quick_gelu"])
@pytest.mark.parametrize("bias", [True, False])
def test_matmul_epilogues(act, bias):
    g = bz.Graph("mm")
    x = g.input("x", bz.Shape((3, 7, 13)))
    w = g.param("w", bz.Shape((13, 29)))
    b = g.param("b", bz.Shape((29,))) if bias else None
    g.set_outputs([g.linear_fused(x, w, b, act)])
    exe = _compiled_matches(g, rtol=1e-5, atol=1e-5)
    assert "fused_matmul_bias_act" in _native_kinds(exe)


@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("residual, expose", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, False)])
def test_row_norms(rms, residual, expose, affine):
    g = bz.Graph("norm")
    x = g.input("x", bz.Shape((2, 5, 37)))
    gamma = g.param("g", bz.Shape((37,))) if affine[0] else None
    beta = g.param("b", bz.Shape((37,))) if affine[1] else None
    if residual:
        r = g.input("r", bz.Shape((2, 5, 37)))
        build = g.fused_residual_rms_norm if rms else g.fused_residual_ln
        y = build(x, r, gamma, beta, eps=1e-5, expose_sum=expose)
        outs = list(y) if expose else [y]
    else:
        outs = [(g.rms_norm if rms else g.layer_norm)(x, gamma, beta, eps=1e-5)]
    g.set_outputs(outs)
    exe = _compiled_matches(g, rtol=1e-4, atol=1e-5)
    assert len(_native_kinds(exe)) == 1


@pytest.mark.parametrize("shape, groups", [((2, 6, 5, 7), 3), ((1, 12, 37), 12),
                                           ((3, 8, 4, 3, 5), 2), ((2, 5), 5), ((1, 4, 1), 1)])
@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, False)])
def test_group_norm(shape, groups, affine):
    """One native step (wav2vec2's GroupNorm(512, 512), exported as InstanceNormalization,
    had decomposed into 9 passes); spatial ranks 0-3, a group per channel, one group."""
    g = bz.Graph("group_norm")
    x = g.input("x", bz.Shape(shape))
    c = shape[1]
    gamma = g.param("g", bz.Shape((c,))) if affine[0] else None
    beta = g.param("b", bz.Shape((c,))) if affine[1] else None
    g.set_outputs([g.group_norm(g.mul(x, x), groups, gamma, beta, eps=1e-5)])
    params = bz.init_params(g, 0)
    for name in params:  # gamma / beta away from 1 / 0, so a channel mix-up shows
        params[name] = np.random.default_rng(7).standard_normal(params[name].shape,
                                                                dtype=np.float32)
    exe = _compiled_matches(g, params, rtol=1e-4, atol=1e-5)
    assert _implementations(exe, "group_norm") == {"C group norm"}


def test_softmax_activations_and_gated():
    g = bz.Graph("misc")
    x = g.input("x", bz.Shape((3, 11, 18)))
    outs = [g.softmax(x, -1), g.gelu(x), g.gelu_approx(x), g.silu(x), g.quick_gelu(x),
            g.fused_swiglu(x, gate_first=False), g.fused_swiglu(x, act="gelu_approx")]
    g.set_outputs(outs)
    exe = _compiled_matches(g, rtol=1e-5, atol=2e-6)
    assert {"softmax", "gelu", "fused_swiglu"} <= _native_kinds(exe)


@pytest.mark.parametrize("shape, axis", [((3, 11, 18), 1), ((2, 7, 5, 300), 1),
                                         ((4, 9, 3), 0), ((5, 6, 1), 1)])
def test_softmax_over_an_inner_axis(shape, axis):
    """A softmax over another axis than the last (ConvBERT's dynamic conv kernels): vectors
    across the values after the axis, more than one 256-column block included; a column of
    only -inf gives zeros, as the reference does."""
    g = bz.Graph("softmax_axis")
    x = g.input("x", bz.Shape(shape))
    g.set_outputs([g.softmax(x, axis)])
    exe = _compiled_matches(g, rtol=1e-5, atol=2e-6)
    assert _native_kinds(exe) == {"softmax"}
    xs = np.random.default_rng(3).standard_normal(shape, dtype=np.float32)
    xs[(0,) * axis + (slice(None),)] = -np.inf  # a whole column (along the axis) masked
    (got,), (want,) = exe({"x": xs}), bz.interpret(g, {"x": xs})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)
    assert not got[(0,) * axis + (slice(None),)].any()


@pytest.mark.parametrize("shape, axis", [((4, 17), 1), ((3, 5, 4), 1), ((3, 1, 4), 1)])
def test_softmax_of_nan_among_minus_inf_is_nan(shape, axis):
    """A row (or column, along a non-last axis) whose values are NaN and -inf is NaN, as the
    reference gives: the max skips the NaN, and the row had taken the fully-masked path to
    zeros, hiding the NaN. Only -inf still gives zeros; a NaN among finite values NaN."""
    g = bz.Graph("softmax_nan")
    g.set_outputs([g.softmax(g.input("x", bz.Shape(shape)), axis)])
    exe = bz.compile(g, fuse=False)
    assert _native_kinds(exe) == {"softmax"}
    xs = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    xs = np.moveaxis(xs, axis, -1)   # rows along the softmax axis, written as last
    xs[0, ...] = np.nan
    xs[1, ..., 0], xs[1, ..., 1:] = np.nan, -np.inf
    xs[2, ..., :] = -np.inf
    xs = np.moveaxis(xs, -1, axis)
    (got,), (want,) = exe({"x": xs}), bz.interpret(g, {"x": xs})
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(want).sum() == 2 * xs.size // shape[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("interleaved, n_rot", [(False, None), (True, None), (False, 4)])
def test_rope(interleaved, n_rot):
    g = bz.Graph("rope")
    x = g.input("x", bz.Shape((2, 3, 5, 8)))
    cos, sin = rope_tables(5, n_rot or 8)
    c = g.constant(cos.reshape(1, 1, 5, -1))
    s = g.constant(sin.reshape(1, 1, 5, -1))
    g.set_outputs([g.rope(x, c, s, interleaved=interleaved, n_rot=n_rot)])
    exe = _compiled_matches(g, rtol=1e-5, atol=1e-6)
    assert "rope" in _native_kinds(exe)


@pytest.mark.parametrize("kind, window", [("none", 0), ("causal", 0), ("sliding_window", 3),
                                          ("custom", 0), ("bias", 0)])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (6, 1)])
def test_attention_every_mask_kind_and_gqa(kind, window, heads):
    hq, hkv = heads
    g = bz.Graph("attn")
    q = g.input("q", bz.Shape((2, hq, 9, 8)))
    k = g.input("k", bz.Shape((2, hkv, 9, 8)))
    v = g.input("v", bz.Shape((2, hkv, 9, 6)))
    mask = g.input("m", bz.Shape((2, 1, 1, 9))) if kind in ("custom", "bias") else None
    g.set_outputs([g.attention(q, k, v, mask, kind=kind, window=window, scale=0.3,
                               softcap=20.0 if kind == "none" else None)])
    exe = _compiled_matches(g, rtol=1e-5, atol=1e-6)
    assert "attention" in _native_kinds(exe)
    _assert_c_kernel(exe, "attention")


def _assert_c_kernel(exe, kind):
    impls = _implementations(exe, kind)
    assert len(impls) == 1
    assert "(batch, kv head" in impls.pop()


@pytest.mark.parametrize("kind, window", [("causal", 0), ("sliding_window", 4), ("none", 0)])
@pytest.mark.parametrize("sq, sk", [(5, 13), (13, 5), (33, 33)])
def test_attention_queries_and_keys_of_different_lengths(kind, window, sq, sk, monkeypatch):
    from braze.runtime.kernels import attention_native

    monkeypatch.setattr(attention_native, "KEY_BLOCK", 16)  # several key chunks
    g = bz.Graph("cross")
    q = g.input("q", bz.Shape((2, 3, sq, 7)))
    k = g.input("k", bz.Shape((2, 3, sk, 7)))
    v = g.input("v", bz.Shape((2, 3, sk, 5)))
    g.set_outputs([g.attention(q, k, v, kind=kind, window=window)])
    exe = _compiled_matches(g, rtol=1e-5, atol=1e-6)
    _assert_c_kernel(exe, "attention")


def test_attention_fully_masked_rows_give_zeros():
    g = bz.Graph("attn")
    q = g.input("q", bz.Shape((1, 2, 3, 4)))
    m = g.input("m", bz.Shape((1, 1, 3, 3)))
    g.set_outputs([g.attention(q, q, q, m)])
    exe = bz.compile(g, fuse=False)
    feeds = {"q": np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype("f4"),
             "m": np.array([[[[-np.inf] * 3, [0, -np.inf, 0], [0, 0, 0]]]], "f4")}
    np.testing.assert_allclose(exe(feeds)[0], bz.interpret(g, feeds)[0], atol=1e-6)
    assert not exe(feeds)[0][0, :, 0].any()


def test_long_sequences_are_processed_in_blocks(monkeypatch):
    from braze.runtime.kernels import attention_native

    monkeypatch.setattr(attention_native, "KEY_BLOCK", 16)  # 13 online-softmax key chunks
    monkeypatch.setattr(attention_native, "QUERY_BLOCK", 12)
    g = bz.Graph("long")
    q = g.input("q", bz.Shape((1, 2, 200, 8)))
    k = g.input("k", bz.Shape((1, 1, 200, 8)))
    g.set_outputs([g.attention(q, k, k, kind="causal")])
    exe = _compiled_matches(g, rtol=1e-5, atol=1e-6)
    core_steps = [s for s in next(iter(exe._programs.values())).steps
                  if s.node.op.kind == "attention"]
    assert core_steps and exe.plan.peak < 200 * 200 * 2 * 4 // 4  # scores were never whole


@pytest.mark.parametrize("rope", ["none", "rotate_half", "interleaved"])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)])
def test_fused_attention_block(rope, heads):
    hq, hkv = heads
    d = 8
    g = bz.Graph("block")
    x = g.input("x", bz.Shape((2, 5, 24)))
    w_qkv = g.param("wqkv", bz.Shape((24, (hq + 2 * hkv) * d)))
    w_o = g.param("wo", bz.Shape((hq * d, 24)))
    b_qkv = g.param("bqkv", bz.Shape(((hq + 2 * hkv) * d,)))
    cos, sin = rope_tables(5, d)
    extra = {}
    if rope != "none":
        extra = {"cos": g.constant(cos), "sin": g.constant(sin)}
    y = g.fused_attention_block(x, w_qkv, w_o, b_qkv=b_qkv, num_heads=hq, num_kv_heads=hkv,
                                mask_kind="causal", rope=rope, **extra)
    g.set_outputs([y])
    exe = _compiled_matches(g, rtol=1e-4, atol=1e-5)
    assert "fused_attention_block" in _native_kinds(exe)
    impl = _implementations(exe, "fused_attention_block").pop()
    assert "C heads" in impl


def test_generated_region_kernels_match_and_broadcast():
    body = bz.Graph("body")
    a = body.input("in0", bz.Shape((4, 5, 6)))
    b = body.input("in1", bz.Shape((6,)))
    c = body.input("in2", bz.Shape((4, 1, 6)))
    t = body.gelu_approx(body.add(a, b))
    u = body.where(body.gt(t, 0.1), body.mul(t, c), body.exp(body.neg(t)))
    body.set_outputs([u, body.sigmoid(body.sub(u, 1.0))])
    g = bz.Graph("r")
    ins = [g.input("x", bz.Shape((4, 5, 6))), g.param("bias", bz.Shape((6,))),
           g.input("z", bz.Shape((4, 1, 6)))]
    g.set_outputs(list(g.elementwise_region(body, ins)))
    exe = _compiled_matches(g, rtol=1e-5, atol=1e-6)
    kinds = {kind: d for _, kind, d, _ in exe.dispatch_report().rows}
    assert kinds["elementwise_region"] == Dispatch.GENERATED


@pytest.mark.parametrize("m, n, k", [(1, 29, 13), (7, 45, 5), (67, 33, 17), (130, 3, 9)])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("act", [None, "gelu", "relu"])
def test_gemm_bias_act_slabs(m, n, k, transposed, act):
    """The one-region GEMM + epilogue: row slabs (large m) and column slabs (small m), weights
    as stored or as a transposed view, with and without bias."""
    from braze.runtime.kernels import blas, fused

    if blas.sgemm_address() is None:
        pytest.skip("no MKL cblas_sgemm")
    rng = np.random.default_rng(m * n + k)
    x = rng.standard_normal((m, k)).astype("f4")
    w = rng.standard_normal((n, k)).astype("f4").T if transposed else \
        rng.standard_normal((k, n)).astype("f4")
    for bias in (rng.standard_normal(n).astype("f4"), None):
        out = np.full((m, n), np.nan, np.float32)
        assert fused.gemm_bias_act(native.lib(), x, w, out, bias, c_snippets.ACT_CODES[act])
        want = x.astype("f8") @ w.astype("f8") + (0 if bias is None else bias)
        if act == "relu":
            want = np.maximum(want, 0)
        elif act == "gelu":
            from scipy.special import erf

            want = 0.5 * want * (1 + erf(want / np.sqrt(2)))
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_gemm_bias_act_declines_what_it_cannot_run():
    from braze.runtime.kernels import fused

    x = np.ones((4, 6), np.float32)
    out = np.zeros((4, 5), np.float32)
    strided = np.ones((6, 10), np.float32)[:, ::2]  # neither rows nor columns contiguous
    assert not fused.gemm_bias_act(native.lib(), x, strided, out, None, 0)
    assert not fused.gemm_bias_act(native.lib(), x, np.ones((6, 5)), out, None, 0)  # float64
    assert not out.any()


def test_kernels_above_the_parallel_threshold_match():
    """Memory-bound kernels run on one thread below cc.PARALLEL_MIN_ELEMENTS and threaded
    above it: the threaded path against the interpreter (the small tests cover the other)."""
    from braze.runtime.codegen import cc

    cols = 1000
    rows = cc.PARALLEL_MIN_ELEMENTS // cols + 7
    g = bz.Graph("big")
    x = g.input("x", bz.Shape((rows, cols)))
    r = g.input("r", bz.Shape((rows, cols)))
    gamma = g.param("g", bz.Shape((cols,)))
    y, s = g.fused_residual_ln(x, r, gamma, None, eps=1e-5, expose_sum=True)
    outs = [y, s, g.softmax(x, -1), g.gelu(x), g.fused_swiglu(g.concat([x, r], -1)),
            g.add(g.mul(x, r), 1.0)]
    g.set_outputs(outs)
    exe = _compiled_matches(g, rtol=1e-4, atol=1e-5, seeds=(0,))
    assert {"fused_residual_ln", "softmax", "gelu", "fused_swiglu"} <= _native_kinds(exe)


@pytest.mark.parametrize("rms", [False, True])
def test_row_norms_threaded_from_their_own_threshold(rms):
    """Row norms take both threads from cc.PARALLEL_MIN_NORM_ELEMENTS (below the other
    memory-bound kernels' bar): residual sum and norm at that size against the interpreter."""
    from braze.runtime.codegen import cc

    cols = 384
    rows = cc.PARALLEL_MIN_NORM_ELEMENTS // cols + 5
    assert cc.PARALLEL_MIN_NORM_ELEMENTS <= rows * cols < cc.PARALLEL_MIN_ELEMENTS
    g = bz.Graph("norms")
    x = g.input("x", bz.Shape((rows, cols)))
    r = g.input("r", bz.Shape((rows, cols)))
    gamma = g.param("g", bz.Shape((cols,)))
    norm = g.fused_residual_rms_norm if rms else g.fused_residual_ln
    y, s = norm(x, r, gamma, None, eps=1e-5, expose_sum=True)
    g.set_outputs([y, s])
    exe = _compiled_matches(g, rtol=1e-4, atol=1e-5, seeds=(0, 1))
    assert ("fused_residual_rms_norm" if rms else "fused_residual_ln") in _native_kinds(exe)


@pytest.mark.parametrize("x_shape", [(3, 7, 13), (300, 13), (1, 13)])
def test_plain_matmul_with_2d_weights(x_shape, monkeypatch):
    monkeypatch.setenv("BRAZE_PACKED_GEMM", "0")  # the BLAS path (packed is the default)
    monkeypatch.delenv("BRAZE_FP32_GEMM", raising=False)  # which would take precedence
    g = bz.Graph("mm")
    x = g.input("x", bz.Shape(x_shape))
    w = g.param("w", bz.Shape((13, 29)))
    g.set_outputs([g.mm(x, w)])
    exe = _compiled_matches(g, rtol=1e-5, atol=1e-5)
    impl = _implementations(exe, "matmul").pop()
    from braze.runtime.kernels import blas

    assert ("tiles" in impl) == (blas.sgemm_address() is not None)


@pytest.mark.parametrize("op", ["clamp", "leaky_relu", "rsqrt"])
def test_single_elementwise_ops_have_native_kernels(op):
    """A lone clamp (ReLU6 after a conv), leaky_relu or rsqrt (GroupNorm's) forms no region;
    each has its own kernel, NaN and in-place included, matching the reference."""
    g = bz.Graph(op)
    x = g.input("x", bz.Shape((5, 131)))
    y = {"clamp": lambda: g.clamp(x, 0.0, 6.0), "leaky_relu": lambda: g.leaky_relu(x, 0.2),
         "rsqrt": lambda: g.rsqrt(x)}[op]()
    g.set_outputs([g.add(y, y)])  # a reader after it: y's buffer may be x's
    exe = bz.compile(g, fuse=False)
    rng = np.random.default_rng(3)
    xs = (rng.standard_normal((5, 131)) * 5).astype(np.float32)
    if op == "rsqrt":
        xs = np.abs(xs) + 0.01
    xs[0, :3] = np.nan
    feeds = {"x": xs}
    (got,), (want,) = exe(feeds), bz.interpret(g, feeds)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    rows = [r for r in exe.dispatch_report().rows if r[1] == op]
    assert rows and rows[0][2] == "native", rows


@pytest.mark.parametrize("a_shape, b_shape, transposed_b, sliced", [
    ((12, 33, 17), (12, 17, 40), False, False),     # the batch over the threads
    ((5, 2, 9, 16), (5, 2, 16, 7), False, False),   # leading dims collapsed
    ((12, 33, 17), (12, 40, 17), True, False),      # b read transposed (k @ q^T)
    ((10, 21, 8), (10, 8, 19), False, True),        # the first columns of a wider a
    ((1, 30, 20), (1, 20, 10), False, False),       # one matrix: tiles of it
])
def test_batched_matmul_of_activations(a_shape, b_shape, transposed_b, sliced):
    """blas.matmul of 3-D (or more) operands, batch by batch, against float64: one native
    call where every matrix has the same strides, strided and transposed views included."""
    from braze.runtime.kernels import blas

    rng = np.random.default_rng(7)
    a = rng.standard_normal(a_shape[:-1] + (a_shape[-1] * (2 if sliced else 1),),
                            dtype=np.float32)[..., :a_shape[-1]]
    b = rng.standard_normal(b_shape, dtype=np.float32)
    b = b.swapaxes(-1, -2) if transposed_b else b
    out = np.empty(a.shape[:-1] + (b.shape[-1],), np.float32)
    blas.matmul(a, b, out)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_sigmoid_of_large_negative_values_is_zero_without_a_warning():
    """exp(-x) overflows to inf below -88: sigmoid is exactly 0 there, and neither the
    compiled kernel nor the reference prints NumPy's overflow warning on every call."""
    import warnings

    g = bz.Graph("s")
    x = g.input("x", bz.Shape((5,)))
    g.set_outputs([g.sigmoid(x)])
    feeds = {"x": np.array([-1000, -89, 0, 5, 1000], np.float32)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = bz.compile(g, fuse=False)(feeds)[0]
        want = bz.interpret(g, feeds)[0]
    np.testing.assert_array_equal(got, want)
    assert got[0] == 0.0 and got[-1] == 1.0
