"""GPT-2 blocks builder (braze.models.gpt2) against an independent NumPy GPT-2 written here:
pre-norm, causal per-head attention from c_attn column slices, tanh GELU, final LayerNorm."""
import math

import numpy as np

import braze as bz
from braze.models import gpt2_blocks


def _layer_norm(x, gamma, beta, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def reference_gpt2(p, x, *, layers, heads, eps):
    p = {k: np.asarray(v, np.float64) for k, v in p.items()}
    x = np.asarray(x, np.float64)
    B, S, E = x.shape
    D = E // heads
    for i in range(layers):
        w = lambda name: p[f"layer{i}.{name}"]  # noqa: B023
        h = _layer_norm(x, w("ln1.gamma"), w("ln1.beta"), eps)
        c_attn = h @ w("attn.qkv.weight") + w("attn.qkv.bias")
        ctx = np.zeros_like(x)
        for b in range(B):
            for hd in range(heads):
                q = c_attn[b, :, hd * D:(hd + 1) * D]
                k = c_attn[b, :, E + hd * D:E + (hd + 1) * D]
                v = c_attn[b, :, 2 * E + hd * D:2 * E + (hd + 1) * D]
                for t in range(S):  # query t sees keys 0..t
                    s = k[:t + 1] @ q[t] / math.sqrt(D)
                    e = np.exp(s - s.max())
                    ctx[b, t, hd * D:(hd + 1) * D] = (e / e.sum()) @ v[:t + 1]
        x = x + ctx @ w("attn.out.weight") + w("attn.out.bias")
        h = _layer_norm(x, w("ln2.gamma"), w("ln2.beta"), eps)
        up = _gelu_tanh(h @ w("ffn.up.weight") + w("ffn.up.bias"))
        x = x + up @ w("ffn.down.weight") + w("ffn.down.bias")
    return _layer_norm(x, p["final_norm.gamma"], p["final_norm.beta"], eps)


def _run_and_compare(g, x, params, ref):
    (out,) = bz.interpret(g, {"hidden": x}, params)
    assert out.dtype == np.float32 and out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    (out64,) = bz.interpret(g, {"hidden": x}, params, float64=True)
    np.testing.assert_allclose(out64, ref, rtol=1e-9, atol=1e-9)


def test_gpt2_blocks_match_numpy_causal_pre_norm_gpt2():
    g = gpt2_blocks(layers=2, hidden=32, heads=4, batch=2, seq=7)
    params = bz.init_params(g, seed=0)
    x = np.random.default_rng(1).standard_normal((2, 7, 32)).astype(np.float32)
    _run_and_compare(g, x, params, reference_gpt2(params, x, layers=2, heads=4, eps=1e-5))


def test_gpt2_is_causal_later_tokens_do_not_change_earlier_outputs():
    g = gpt2_blocks(layers=2, hidden=32, heads=4, batch=1, seq=6, seed=5)
    x = np.random.default_rng(2).standard_normal((1, 6, 32)).astype(np.float32)
    y = x.copy()
    y[:, 4:] = np.random.default_rng(3).standard_normal((1, 2, 32))  # (LN ignores a shift)
    (ox,) = bz.interpret(g, {"hidden": x})
    (oy,) = bz.interpret(g, {"hidden": y})
    np.testing.assert_allclose(ox[:, :4], oy[:, :4], rtol=1e-6, atol=1e-6)
    assert not np.allclose(ox[:, 4:], oy[:, 4:], atol=1e-3)


def test_gpt2_default_config_and_seeded_weights():
    g = gpt2_blocks(seed=11)
    assert g.inputs[0].op.shape.dims == (2, 8, 64)
    assert g.node_by_name("layer1.attn.qkv.weight").op.shape.dims == (64, 192)
    assert g.node_by_name("layer1.ffn.up.weight").op.shape.dims == (64, 256)
    expected = bz.init_params(gpt2_blocks(), seed=11)
    assert set(g.weights) == set(expected)
    for name, arr in expected.items():
        np.testing.assert_array_equal(g.weights[name], arr)
    x = np.random.default_rng(3).standard_normal((2, 8, 64)).astype(np.float32)
    (out,) = bz.interpret(g, {"hidden": x})
    ref = reference_gpt2(expected, x, layers=2, heads=4, eps=1e-5)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_gpt2_op_counts_fused_c_attn_narrowed_per_layer():
    counts = gpt2_blocks(layers=3, hidden=32, heads=4, batch=1, seq=4).op_counts()
    assert counts == {
        "layer_norm": 2 * 3 + 1, "matmul": 4 * 3, "add": 6 * 3, "narrow": 3 * 3,
        "reshape": 4 * 3, "transpose": 4 * 3, "attention": 3, "gelu_approx": 3,
    }


def test_gpt2_param_names():
    g = gpt2_blocks(layers=1, hidden=16, heads=2, batch=1, seq=4)
    assert {n.op.name for n in g.params} == {
        "layer0.ln1.gamma", "layer0.ln1.beta", "layer0.attn.qkv.weight", "layer0.attn.qkv.bias",
        "layer0.attn.out.weight", "layer0.attn.out.bias", "layer0.ln2.gamma", "layer0.ln2.beta",
        "layer0.ffn.up.weight", "layer0.ffn.up.bias", "layer0.ffn.down.weight",
        "layer0.ffn.down.bias", "final_norm.gamma", "final_norm.beta",
    }
