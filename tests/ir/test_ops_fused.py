"""Fused op kinds: shape inference (symbolic dims included), and for each kind the fused node,
its decomposition and its direct reference all equal an independent NumPy computation."""
import math

import numpy as np
import pytest

import braze as bz
from braze.interpret import decomposition_graph
from braze.ir.ops.attention import MaskKind, rope_tables
from braze.ir.ops.fused import (
    FusedAttentionBlock,
    FusedConvBiasAct,
    FusedMatMulBiasAct,
    FusedResidualLN,
    FusedResidualRmsNorm,
    FusedRmsNormReshape,
    FusedSwiGLU,
    FusedTransformerLayer,
    LayerStyle,
    MlpKind,
    NormKind,
    RopeMode,
)

F64 = bz.f64
RNG = np.random.default_rng(7)


# -- independent NumPy meanings ----------------------------------------------------------------
_erf = np.vectorize(math.erf)


def np_gelu(x):
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def np_silu(x):
    return x / (1 + np.exp(-x))


def np_ln(x, gamma, beta, eps, first_axis=-1):
    axes = tuple(range(first_axis % x.ndim, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    return y * (1 if gamma is None else gamma) + (0 if beta is None else beta)


def np_rms(x, gamma, beta, eps):
    y = x / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps)
    return y * (1 if gamma is None else gamma) + (0 if beta is None else beta)


def np_rope(x, cos, sin, interleaved, n_rot):
    n = n_rot or x.shape[-1]
    out = x.copy()
    for i in range(n // 2):
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + n // 2)
        c, s = cos[:, i], sin[:, i]
        out[..., a] = x[..., a] * c - x[..., b] * s
        out[..., b] = x[..., b] * c + x[..., a] * s
    return out


def np_attention(q, k, v, *, causal=False, bias=None, scale=None, softcap=None):
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = q @ k.swapaxes(-1, -2) * (scale or 1 / math.sqrt(q.shape[-1]))
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if causal:
        sq = q.shape[2]
        s = np.where(np.tril(np.ones((sq, sq), bool)), s, -1e300)
    if bias is not None:
        s = s + bias
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def np_attention_block(x, w_qkv, b_qkv, w_o, b_o, hq, hkv, d, rope=None, **kw):
    b, s, _ = x.shape
    qkv = x @ w_qkv + (0 if b_qkv is None else b_qkv)

    def heads(start, h):
        return qkv[..., start:start + h * d].reshape(b, s, h, d).transpose(0, 2, 1, 3)

    q, k, v = heads(0, hq), heads(hq * d, hkv), heads((hq + hkv) * d, hkv)
    if rope is not None:
        q, k = np_rope(q, *rope), np_rope(k, *rope)
    o = np_attention(q, k, v, **kw).transpose(0, 2, 1, 3).reshape(b, s, hq * d)
    return o @ w_o + (0 if b_o is None else b_o)


# -- harness -----------------------------------------------------------------------------------
def rand(*dims):
    return RNG.standard_normal(dims)


def fused_and_decomposed(op, arrays, dims=None):
    """Outputs of (a graph holding one `op` node, the same graph with `op.decompose` instead).
    `dims` optionally gives the graph input dims (symbols allowed); arrays are the feeds."""
    outs = []
    for decompose in (False, True):
        g = bz.Graph("t")
        ins = [g.input(f"a{i}", bz.Shape(dims[i] if dims else a.shape, F64))
               for i, a in enumerate(arrays)]
        res = op.decompose(g, ins) if decompose else g.add_node(op, ins)
        g.set_outputs(list(res) if isinstance(res, tuple) else [res])
        outs.append(bz.interpret(g, {f"a{i}": a for i, a in enumerate(arrays)}))
    return outs


def check_all_ways(op, arrays, expected, *, direct=True, dims=None):
    """Fused node, decomposition and (if `direct`) op.reference equal `expected` (a list)."""
    fused, decomposed = fused_and_decomposed(op, arrays, dims)
    ways = [fused, decomposed]
    if direct:
        ref = op.reference(*arrays)
        ways.append(list(ref) if isinstance(ref, tuple) else [ref])
    for got in ways:
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-9)


def infer(op, *shapes):
    return op.infer(tuple(bz.Shape(s, F64) for s in shapes))


# -- FusedMatMulBiasAct -------------------------------------------------------------------------
def test_matmul_bias_act_infers_symbolic_batch_and_rejects_matrix_bias():
    op = FusedMatMulBiasAct(bz.UnaryFn.GELU, True)
    assert infer(op, ("batch", "seq", 8), (8, 16), (16,)).dims == ("batch", "seq", 16)
    assert infer(FusedMatMulBiasAct(None, False), ("b", 8), (8, 4)).dims == ("b", 4)
    with pytest.raises(bz.ShapeError, match="rank <= 1"):
        infer(op, (3, 8), (8, 16), (3, 16))
    with pytest.raises(bz.ShapeError, match="contracting"):
        infer(op, (3, 7), (8, 16), (16,))
    with pytest.raises(bz.ShapeError, match="takes 3 inputs"):
        op.check_arity(2)


@pytest.mark.parametrize("act, has_bias", [
    (None, True), (bz.UnaryFn.GELU, True), (bz.UnaryFn.SILU, False), (bz.UnaryFn.TANH, True),
    (bz.UnaryFn.EXP, True),
])
def test_matmul_bias_act_matches_numpy(act, has_bias):
    x, w, b = rand(2, 3, 8), rand(8, 5), rand(5)
    y = x @ w + (b if has_bias else 0)
    want = {None: y, bz.UnaryFn.GELU: np_gelu(y), bz.UnaryFn.SILU: np_silu(y),
            bz.UnaryFn.TANH: np.tanh(y), bz.UnaryFn.EXP: np.exp(y)}[act]
    op = FusedMatMulBiasAct(act, has_bias)
    check_all_ways(op, [x, w, b] if has_bias else [x, w], [want])


# -- FusedSwiGLU --------------------------------------------------------------------------------
@pytest.mark.parametrize("gate_first", [True, False])
def test_swiglu_honours_gate_first(gate_first):
    h = rand(2, 3, 12)
    first, second = h[..., :6], h[..., 6:]
    gate, up = (first, second) if gate_first else (second, first)
    check_all_ways(FusedSwiGLU(gate_first), [h], [np_silu(gate) * up])


def test_swiglu_gate_first_changes_the_result_and_infers_half_width():
    h = rand(4, 10)
    assert not np.allclose(FusedSwiGLU(True).reference(h), FusedSwiGLU(False).reference(h))
    assert infer(FusedSwiGLU(), ("batch", 10)).dims == ("batch", 5)
    with pytest.raises(bz.ShapeError, match="even"):
        infer(FusedSwiGLU(), (4, 7))


# -- residual + norm ----------------------------------------------------------------------------
def test_residual_ln_exposes_the_sum_as_second_output():
    x, r, gamma, beta = rand(2, 3, 8), rand(2, 3, 8), rand(8), rand(8)
    op = FusedResidualLN(1e-5, -1, True, True, True)
    s = x + r
    check_all_ways(op, [x, r, gamma, beta], [np_ln(s, gamma, beta, 1e-5), s])
    outs = infer(op, ("batch", 3, 8), ("batch", 3, 8), (8,), (8,))
    assert [o.dims for o in outs] == [("batch", 3, 8)] * 2


def test_residual_ln_without_sum_has_one_output_and_keeps_its_axis():
    x, r, gamma = rand(2, 3, 4), rand(2, 3, 4), rand(3, 4)
    op = FusedResidualLN(1e-3, 1, True, False, False)
    check_all_ways(op, [x, r, gamma], [np_ln(x + r, gamma, None, 1e-3, first_axis=1)])
    assert infer(op, (2, 3, 4), (2, 3, 4), (3, 4)).dims == (2, 3, 4)
    with pytest.raises(bz.ShapeError, match="gamma"):
        infer(op, (2, 3, 4), (2, 3, 4), (4,))


def test_residual_rms_norm_with_gamma_beta_and_sum():
    x, r, gamma, beta = rand(3, 16), rand(3, 16), rand(16), rand(16)
    op = FusedResidualRmsNorm(1e-6, -1, True, True, True)
    s = x + r
    check_all_ways(op, [x, r, gamma, beta], [np_rms(s, gamma, beta, 1e-6), s])
    plain = FusedResidualRmsNorm(1e-6, -1, False, False, False)
    check_all_ways(plain, [x, r], [np_rms(s, None, None, 1e-6)])
    assert plain.input_roles() == ("x", "residual")
    assert op.param_init_hint(2) == "one" and op.param_init_hint(3) is None


# -- FusedRmsNormReshape ------------------------------------------------------------------------
def test_rms_norm_reshape_normalizes_each_head_with_symbolic_batch():
    x, gamma = rand(2, 5, 32), rand(8)
    op = FusedRmsNormReshape(1e-6, True, False, ("b", 5, 4, 8))
    assert infer(op, ("b", 5, 32), (8,)).dims == ("b", 5, 4, 8)
    want = np_rms(x.reshape(2, 5, 4, 8), gamma, None, 1e-6)
    check_all_ways(op, [x, gamma], [want], direct=False, dims=[("b", 5, 32), (8,)])
    static = FusedRmsNormReshape(1e-6, True, False, (2, 5, 4, 8))
    check_all_ways(static, [x, gamma], [want])
    with pytest.raises(bz.ShapeError):
        infer(op, ("b", 5, 32), (32,))


def test_rms_norm_reshape_builder_resolves_minus_one():
    g = bz.Graph("qk_norm")
    x = g.input("x", bz.Shape(("batch", "seq", 24)))
    gamma = g.param("g", bz.Shape((6,)))
    y = g.fused_rms_norm_reshape(x, ("batch", "seq", -1, 6), gamma)
    assert g.shape_of(y).dims == ("batch", "seq", 4, 6)
    assert g.node(y).op.dims == ("batch", "seq", 4, 6)


# -- FusedAttentionBlock ------------------------------------------------------------------------
def _block_arrays(e, hq, hkv, d, e_out, s=5, b=2):
    w = (hq + 2 * hkv) * d
    return rand(b, s, e), rand(e, w) * 0.3, rand(w), rand(hq * d, e_out) * 0.3, rand(e_out)


def test_attention_block_infers_symbolic_batch_and_seq():
    op = FusedAttentionBlock(4, 2, 8, MaskKind.CAUSAL, rope=RopeMode.ROTATE_HALF,
                             has_qkv_bias=False, has_out_bias=True)
    assert op.input_roles() == ("x", "w_qkv", "w_o", "b_o", "cos", "sin")
    out = infer(op, ("batch", "seq", 32), (32, 64), (32, 48), (48,), ("seq", 4), ("seq", 4))
    assert out.dims == ("batch", "seq", 48)
    with pytest.raises(bz.ShapeError, match="w_qkv"):
        infer(op, ("batch", "seq", 32), (32, 60), (32, 48), (48,), ("seq", 4), ("seq", 4))
    with pytest.raises(bz.ShapeError, match="divide"):
        infer(FusedAttentionBlock(4, 3, 8), (1, 2, 8), (8, 80), (80,), (32, 8), (8,))


def test_attention_block_gqa_rope_causal_matches_numpy():
    hq, hkv, d, e = 4, 2, 8, 16
    x, w_qkv, _, w_o, _ = _block_arrays(e, hq, hkv, d, e)
    cos, sin = (t.astype(np.float64) for t in rope_tables(5, 6))
    op = FusedAttentionBlock(hq, hkv, d, MaskKind.CAUSAL, rope=RopeMode.ROTATE_HALF, n_rot=6,
                             has_qkv_bias=False, has_out_bias=False)
    want = np_attention_block(x, w_qkv, None, w_o, None, hq, hkv, d,
                              rope=(cos, sin, False, 6), causal=True)
    check_all_ways(op, [x, w_qkv, w_o, cos, sin], [want])


def test_attention_block_interleaved_rope_scale_and_softcap():
    hq, hkv, d, e = 2, 1, 4, 8
    x, w_qkv, b_qkv, w_o, b_o = _block_arrays(e, hq, hkv, d, 6)
    cos, sin = (t.astype(np.float64) for t in rope_tables(5, 4))
    op = FusedAttentionBlock(hq, hkv, d, MaskKind.NONE, 0, 0.3, 2.0, RopeMode.INTERLEAVED)
    want = np_attention_block(x, w_qkv, b_qkv, w_o, b_o, hq, hkv, d,
                              rope=(cos, sin, True, None), scale=0.3, softcap=2.0)
    check_all_ways(op, [x, w_qkv, b_qkv, w_o, b_o, cos, sin], [want])


def test_attention_block_with_bias_mask_and_projection_biases():
    hq = hkv = 2
    d, e = 4, 8
    x, w_qkv, b_qkv, w_o, b_o = _block_arrays(e, hq, hkv, d, e)
    bias = rand(1, hq, 5, 5)
    op = FusedAttentionBlock(hq, hkv, d, MaskKind.BIAS)
    assert op.input_roles() == ("x", "w_qkv", "b_qkv", "w_o", "b_o", "mask")
    want = np_attention_block(x, w_qkv, b_qkv, w_o, b_o, hq, hkv, d, bias=bias)
    check_all_ways(op, [x, w_qkv, b_qkv, w_o, b_o, bias], [want])


def test_attention_block_builder_derives_heads_and_runs_with_symbolic_dims():
    g = bz.Graph("attn")
    x = g.input("x", bz.Shape(("batch", "seq", 16), F64))
    cos = g.input("cos", bz.Shape(("seq", 2), F64))
    sin = g.input("sin", bz.Shape(("seq", 2), F64))
    w_qkv = g.param("w_qkv", bz.Shape((16, 32), F64))   # (Hq + 2 Hkv) * D = (2 + 2) * 8
    w_o = g.param("w_o", bz.Shape((16, 16), F64))
    y = g.fused_attention_block(x, w_qkv, w_o, num_heads=2, cos=cos, sin=sin, n_rot=4,
                                mask_kind="causal")
    op = g.node(y).op
    assert (op.num_kv_heads, op.head_dim, op.rope) == (1, 8, RopeMode.ROTATE_HALF)
    assert g.shape_of(y).dims == ("batch", "seq", 16)
    g.set_outputs([y])
    params = bz.init_params(g, seed=1)
    xs = rand(3, 4, 16)
    c, s = (t.astype(np.float64) for t in rope_tables(4, 4))
    (got,) = bz.interpret(g, {"x": xs, "cos": c, "sin": s}, params)
    want = np_attention_block(xs, params["w_qkv"], None, params["w_o"], None, 2, 1, 8,
                              rope=(c, s, False, 4), causal=True)
    np.testing.assert_allclose(got, want, rtol=1e-5)


# -- FusedTransformerLayer ----------------------------------------------------------------------
def test_transformer_layer_post_norm_bert_style():
    e, f, hq, d = 8, 12, 2, 4
    attn = FusedAttentionBlock(hq, hq, d)
    op = FusedTransformerLayer(LayerStyle.POST_NORM, attn, NormKind.LAYER, 1e-5, MlpKind.GELU)
    assert op.input_roles() == ("x", "w_qkv", "b_qkv", "w_o", "b_o", "norm1_gamma",
                                "norm1_beta", "w1", "b1", "w2", "b2", "norm2_gamma",
                                "norm2_beta")
    x, w_qkv, b_qkv, w_o, b_o = _block_arrays(e, hq, hq, d, e)
    g1, be1, g2, be2 = 1 + rand(e) * 0.1, rand(e), 1 + rand(e) * 0.1, rand(e)
    w1, b1, w2, b2 = rand(e, f) * 0.3, rand(f), rand(f, e) * 0.3, rand(e)
    a = np_attention_block(x, w_qkv, b_qkv, w_o, b_o, hq, hq, d)
    h = np_ln(x + a, g1, be1, 1e-5)
    want = np_ln(h + np_gelu(h @ w1 + b1) @ w2 + b2, g2, be2, 1e-5)
    arrays = [x, w_qkv, b_qkv, w_o, b_o, g1, be1, w1, b1, w2, b2, g2, be2]
    check_all_ways(op, arrays, [want], direct=False)
    assert infer(op, ("batch", "seq", e), *[a.shape for a in arrays[1:]]).dims == (
        "batch", "seq", e)


def test_transformer_layer_pre_norm_llama_style():
    e, f, hq, hkv, d = 16, 20, 4, 2, 4
    attn = FusedAttentionBlock(hq, hkv, d, MaskKind.CAUSAL, rope=RopeMode.ROTATE_HALF,
                               has_qkv_bias=False, has_out_bias=False)
    op = FusedTransformerLayer(LayerStyle.PRE_NORM, attn, NormKind.RMS, 1e-6, MlpKind.SWIGLU,
                               has_mlp_bias=False, has_norm_beta=False)
    assert op.input_roles() == ("x", "w_qkv", "w_o", "cos", "sin", "norm1_gamma", "w_gate_up",
                                "w_down", "norm2_gamma")
    x, w_qkv, _, w_o, _ = _block_arrays(e, hq, hkv, d, e)
    cos, sin = (t.astype(np.float64) for t in rope_tables(5, d))
    g1, g2 = 1 + rand(e) * 0.1, 1 + rand(e) * 0.1
    wg, wu, wd = rand(e, f) * 0.3, rand(e, f) * 0.3, rand(f, e) * 0.3
    h = x + np_attention_block(np_rms(x, g1, None, 1e-6), w_qkv, None, w_o, None, hq, hkv, d,
                               rope=(cos, sin, False, None), causal=True)
    n2 = np_rms(h, g2, None, 1e-6)
    want = h + (np_silu(n2 @ wg) * (n2 @ wu)) @ wd
    arrays = [x, w_qkv, w_o, cos, sin, g1, np.concatenate([wg, wu], axis=1), wd, g2]
    check_all_ways(op, arrays, [want], direct=False)


def test_transformer_layer_pre_norm_gpt2_style_via_builder():
    e, f, hq, d = 8, 16, 2, 4
    attn = FusedAttentionBlock(hq, hq, d, MaskKind.CAUSAL)
    g = bz.Graph("gpt2_layer")
    x = g.input("x", bz.Shape(("batch", 5, e), F64))
    names = attn.input_roles()[1:] + ("norm1_gamma", "norm1_beta", "w1", "b1", "w2", "b2",
                                      "norm2_gamma", "norm2_beta")
    shapes = {"w_qkv": (e, 3 * hq * d), "b_qkv": (3 * hq * d,), "w_o": (hq * d, e), "b_o": (e,),
              "w1": (e, f), "b1": (f,), "w2": (f, e), "b2": (e,)}
    ins = {n: g.param(n, bz.Shape(shapes.get(n, (e,)), F64)) for n in names}
    y = g.fused_transformer_layer(x, ins, attn=attn, style="pre_norm", mlp="gelu_approx")
    g.set_outputs([y])
    p = bz.init_params(g, seed=3)
    assert np.allclose(p["norm1_gamma"], 1, atol=0.5)  # gammas are drawn around one
    xs = rand(2, 5, e)
    (got,) = bz.interpret(g, {"x": xs}, p)
    n1 = np_ln(xs, p["norm1_gamma"], p["norm1_beta"], 1e-5)
    h = xs + np_attention_block(n1, p["w_qkv"], p["b_qkv"], p["w_o"], p["b_o"], hq, hq, d,
                                causal=True)
    n2 = np_ln(h, p["norm2_gamma"], p["norm2_beta"], 1e-5)
    u = n2 @ p["w1"] + p["b1"]
    gelu_tanh = 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))
    np.testing.assert_allclose(got, h + gelu_tanh @ p["w2"] + p["b2"], rtol=1e-5)


def test_transformer_layer_rejects_swiglu_biases_and_missing_roles():
    attn = FusedAttentionBlock(1, 1, 4)
    op = FusedTransformerLayer(LayerStyle.PRE_NORM, attn, mlp=MlpKind.SWIGLU, has_mlp_bias=True)
    shapes = [(1, 2, 4), (4, 12), (12,), (4, 4), (4,), (4,), (4,), (4, 8), (4, 4), (4,), (4,)]
    with pytest.raises(bz.ShapeError, match="SWIGLU"):
        infer(op, *shapes)
    g = bz.Graph("t")
    x = g.input("x", bz.Shape((1, 2, 4)))
    with pytest.raises(bz.GraphError, match="missing"):
        g.fused_transformer_layer(x, {}, attn=attn)


# -- FusedConvBiasAct ---------------------------------------------------------------------------
def np_conv2d(x, w, b, stride, pad):
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, _, hp, wp = xp.shape
    o, c, kh, kw = w.shape
    ho, wo = (hp - kh) // stride + 1, (wp - kw) // stride + 1
    out = np.zeros((n, o, ho, wo))
    for i in range(ho):
        for j in range(wo):
            patch = xp[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    return out + b[None, :, None, None]


def test_conv_bias_act_matches_numpy_and_infers_symbolic_batch():
    x, w, b = rand(2, 3, 7, 7), rand(4, 3, 3, 3), rand(4)
    op = FusedConvBiasAct((2, 2), (1, 1, 1, 1), (1, 1), 1, bz.UnaryFn.RELU)
    check_all_ways(op, [x, w, b], [np.maximum(np_conv2d(x, w, b, 2, 1), 0)])
    assert infer(op, ("n", 3, 7, 7), (4, 3, 3, 3), (4,)).dims == ("n", 4, 4, 4)
    g = bz.Graph("c")
    xv = g.input("x", bz.Shape((1, 3, 8, 8)))
    y = g.fused_conv_bias_act(xv, g.param("w", bz.Shape((4, 3, 3, 3))),
                              g.param("b", bz.Shape((4,))), stride=2, padding=1, act="silu")
    assert g.node(y).op == FusedConvBiasAct((2, 2), (1, 1, 1, 1), (1, 1), 1, bz.UnaryFn.SILU)


# -- fusion-first builders ----------------------------------------------------------------------
def test_linear_fused_is_one_node_and_shared_pair_is_two_matmuls():
    g = bz.Graph("b")
    x = g.input("x", bz.Shape(("batch", 8)))
    w1, w2 = g.param("w1", bz.Shape((8, 4))), g.param("w2", bz.Shape((8, 6)))
    y = g.linear_fused(x, w1, g.param("b", bz.Shape((4,))), act="gelu")
    assert g.node(y).op == FusedMatMulBiasAct(bz.UnaryFn.GELU, True)
    a, c = g.shared_matmul_pair(x, w1, w2)
    assert g.count("matmul") == 2 and g.node(a).inputs[0] == g.node(c).inputs[0] == x
    assert g.shape_of(c).dims == ("batch", 6)


@pytest.mark.parametrize("gate_first", [True, False])
def test_fused_swiglu_ffn_equals_primitive_swiglu_ffn(gate_first):
    e, f = 6, 10
    wg, wu, wd = rand(e, f), rand(e, f), rand(f, e)
    gu = np.concatenate([wg, wu] if gate_first else [wu, wg], axis=1)
    g = bz.Graph("ffn")
    x = g.input("x", bz.Shape((3, e), F64))
    plain = g.swiglu_ffn(x, g.param("wg", bz.Shape((e, f), F64), wg),
                         g.param("wu", bz.Shape((e, f), F64), wu),
                         g.param("wd", bz.Shape((f, e), F64), wd))
    fused = g.fused_swiglu_ffn(x, g.param("gu", bz.Shape((e, 2 * f), F64), gu),
                               g.param("wd2", bz.Shape((f, e), F64), wd), gate_first)
    assert g.count(FusedSwiGLU) == 1
    g.set_outputs([plain, fused])
    xs = rand(3, e)
    a, b = bz.interpret(g, {"x": xs})
    want = (np_silu(xs @ wg) * (xs @ wu)) @ wd
    np.testing.assert_allclose(a, want, rtol=1e-5)
    np.testing.assert_allclose(b, want, rtol=1e-5)


def test_residual_builders_return_sum_only_when_asked():
    g = bz.Graph("r")
    x, r = g.input("x", bz.Shape((2, 8))), g.input("r", bz.Shape((2, 8)))
    gamma = g.param("g", bz.Shape((8,)))
    y, s = g.fused_residual_ln(x, r, gamma, expose_sum=True)
    assert g.node(y).op == FusedResidualLN(1e-5, -1, True, False, True) and s.index == 1
    z = g.fused_residual_rms_norm(x, r, gamma)
    assert isinstance(z, bz.Value) and g.node(z).op.input_roles() == ("x", "residual", "gamma")


def test_decomposition_graph_is_cached_per_op_and_shapes():
    op = FusedSwiGLU(False)
    shapes = [bz.Shape((2, 4), F64)]
    assert decomposition_graph(op, shapes) is decomposition_graph(FusedSwiGLU(False), shapes)
