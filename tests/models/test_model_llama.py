"""LLaMA decoder builder (braze.models.llama) against an independent NumPy LLaMA written here:
RMSNorm, rotate-half RoPE per position, grouped-query causal attention, SwiGLU MLP."""
import math

import numpy as np

import braze as bz
from braze.models import llama_decoder, llama_small, llama_tiny


def _rms_norm(x, gamma, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * gamma


def _rope_tables(seq, dim, base):
    """cos/sin [seq, dim/2], rounded to float32 as a graph constant or feed would hold them."""
    inv_freq = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = np.arange(seq, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _rotate(vec, cos, sin):
    """Rotate-half RoPE of one head vector [D] at one position: pairs (j, j + D/2)."""
    half = vec.shape[-1] // 2
    a, b = vec[:half], vec[half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin])


def reference_llama(p, x, *, layers, heads, kv_heads, eps, base=10000.0):
    p = {k: np.asarray(v, np.float64) for k, v in p.items()}
    x = np.asarray(x, np.float64)
    B, S, E = x.shape
    D = E // heads
    cos, sin = (t.astype(np.float64) for t in _rope_tables(S, D, base))
    group = heads // kv_heads
    for i in range(layers):
        w = lambda name: p[f"layer{i}.{name}"]  # noqa: B023
        h = _rms_norm(x, w("ln1.gamma"), eps)
        q = (h @ w("attn.q.weight")).reshape(B, S, heads, D)
        k = (h @ w("attn.k.weight")).reshape(B, S, kv_heads, D)
        v = (h @ w("attn.v.weight")).reshape(B, S, kv_heads, D)
        for b in range(B):
            for t in range(S):
                for hd in range(heads):
                    q[b, t, hd] = _rotate(q[b, t, hd], cos[t], sin[t])
                for hd in range(kv_heads):
                    k[b, t, hd] = _rotate(k[b, t, hd], cos[t], sin[t])
        ctx = np.zeros((B, S, heads, D))
        for b in range(B):
            for hd in range(heads):
                kv = hd // group
                for t in range(S):
                    s = k[b, :t + 1, kv] @ q[b, t, hd] / math.sqrt(D)
                    e = np.exp(s - s.max())
                    ctx[b, t, hd] = (e / e.sum()) @ v[b, :t + 1, kv]
        x = x + ctx.reshape(B, S, E) @ w("attn.out.weight")
        h = _rms_norm(x, w("ln2.gamma"), eps)
        gate = h @ w("ffn.gate.weight")
        silu = gate / (1.0 + np.exp(-gate))
        x = x + (silu * (h @ w("ffn.up.weight"))) @ w("ffn.down.weight")
    return _rms_norm(x, p["final_norm.gamma"], eps)


def _compare(g, feeds, params, ref):
    (out,) = bz.interpret(g, feeds, params)
    assert out.dtype == np.float32 and out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    (out64,) = bz.interpret(g, feeds, params, float64=True)
    np.testing.assert_allclose(out64, ref, rtol=1e-6, atol=1e-6)  # rope tables are float32


def _hidden(B, S, E, seed=1):
    return np.random.default_rng(seed).standard_normal((B, S, E)).astype(np.float32)


def test_llama_gqa_decoder_matches_numpy_llama():
    g = llama_decoder(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=96, batch=2, seq=6)
    assert g.node_by_name("layer0.attn.k.weight").op.shape.dims == (64, 32)
    params = bz.init_params(g, seed=0)
    x = _hidden(2, 6, 64)
    ref = reference_llama(params, x, layers=2, heads=4, kv_heads=2, eps=1e-6)
    _compare(g, {"hidden": x}, params, ref)


def test_llama_multi_head_and_multi_query_variants():
    for kv_heads in (4, 1):
        g = llama_decoder(layers=1, hidden=32, heads=4, kv_heads=kv_heads, intermediate=48,
                          batch=1, seq=5, rope_base=500.0, eps=1e-5)
        params = bz.init_params(g, seed=kv_heads)
        x = _hidden(1, 5, 32, seed=kv_heads)
        ref = reference_llama(params, x, layers=1, heads=4, kv_heads=kv_heads, eps=1e-5,
                              base=500.0)
        _compare(g, {"hidden": x}, params, ref)


def test_llama_static_seq_bakes_rope_tables_as_constants():
    g = llama_decoder(layers=1, hidden=32, heads=4, kv_heads=2, batch=1, seq=5)
    assert [n.op.name for n in g.inputs] == ["hidden"]


def test_llama_symbolic_batch_and_seq_take_rope_tables_as_inputs():
    g = llama_decoder(layers=2, hidden=32, heads=4, kv_heads=2, intermediate=64,
                      batch="batch", seq="seq")
    shapes = {n.op.name: n.op.shape.dims for n in g.inputs}
    assert shapes == {"hidden": ("batch", "seq", 32), "rope_cos": ("seq", 4),
                      "rope_sin": ("seq", 4)}
    params = bz.init_params(g, seed=0)
    for B, S in [(2, 5), (1, 8)]:
        x = _hidden(B, S, 32, seed=S)
        cos, sin = _rope_tables(S, 8, 10000.0)
        ref = reference_llama(params, x, layers=2, heads=4, kv_heads=2, eps=1e-6)
        _compare(g, {"hidden": x, "rope_cos": cos, "rope_sin": sin}, params, ref)


def test_llama_op_counts_primitives_per_layer():
    counts = llama_decoder(layers=3, hidden=32, heads=4, kv_heads=2, batch=1, seq=4).op_counts()
    assert counts == {
        "rms_norm": 2 * 3 + 1, "matmul": 7 * 3, "add": 2 * 3, "rope": 2 * 3,
        "reshape": 4 * 3, "transpose": 4 * 3, "attention": 3, "silu": 3, "mul": 3,
    }


def test_llama_param_names_and_default_intermediate():
    g = llama_decoder(layers=1, hidden=64, heads=4, kv_heads=2, batch=1, seq=4)
    shapes = {n.op.name: n.op.shape.dims for n in g.params}
    inter = shapes["layer0.ffn.gate.weight"][1]
    assert inter % 32 == 0 and inter >= 8 * 64 // 3
    assert shapes == {
        "layer0.ln1.gamma": (64,), "layer0.attn.q.weight": (64, 64),
        "layer0.attn.k.weight": (64, 32), "layer0.attn.v.weight": (64, 32),
        "layer0.attn.out.weight": (64, 64), "layer0.ln2.gamma": (64,),
        "layer0.ffn.gate.weight": (64, inter), "layer0.ffn.up.weight": (64, inter),
        "layer0.ffn.down.weight": (inter, 64), "final_norm.gamma": (64,),
    }


def test_llama_presets_and_seeded_weights():
    tiny = llama_tiny()
    assert tiny.inputs[0].op.shape.dims == (2, 8, 64)
    assert tiny.node_by_name("layer1.attn.v.weight").op.shape.dims == (64, 32)
    small = llama_small()
    assert small.inputs[0].op.shape.dims[1:] == (32, 256)
    assert small.op_counts()["attention"] == 4
    assert small.node_by_name("layer3.attn.k.weight").op.shape.dims == (256, 64)
    seeded = llama_decoder(layers=1, hidden=32, heads=4, kv_heads=2, batch=1, seq=4, seed=2)
    plain = llama_decoder(layers=1, hidden=32, heads=4, kv_heads=2, batch=1, seq=4)
    assert plain.weights == {}
    expected = bz.init_params(plain, seed=2)
    for name, arr in expected.items():
        np.testing.assert_array_equal(seeded.weights[name], arr)
    assert set(seeded.weights) == set(expected)
