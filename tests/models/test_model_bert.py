"""BERT encoder builder (braze.models.bert) against an independent NumPy encoder written here:
per-head column slices instead of reshape/transpose, explicit softmax, erf GELU, post-norm."""
import math

import numpy as np
import pytest

import braze as bz
from braze.models import bert_base, bert_encoder, bert_tiny

_erf = np.vectorize(math.erf)


def _layer_norm(x, gamma, beta, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def reference_bert(p, x, *, layers, heads, eps, mask=None, qkv="separate"):
    """Float64 post-norm BERT encoder; `mask` is the additive [B, 1, 1, S] mask."""
    p = {k: np.asarray(v, np.float64) for k, v in p.items()}
    x = np.asarray(x, np.float64)
    B, S, E = x.shape
    D = E // heads
    for i in range(layers):
        w = lambda name: p[f"layer{i}.{name}"]  # noqa: B023
        if qkv == "fused":
            both = x @ w("attn.qkv.weight") + w("attn.qkv.bias")
            q, k, v = both[..., :E], both[..., E:2 * E], both[..., 2 * E:]
        else:
            q = x @ w("attn.q.weight") + w("attn.q.bias")
            k = x @ w("attn.k.weight") + w("attn.k.bias")
            v = x @ w("attn.v.weight") + w("attn.v.bias")
        ctx = np.zeros_like(x)
        for b in range(B):
            for h in range(heads):
                cols = slice(h * D, (h + 1) * D)
                s = q[b, :, cols] @ k[b, :, cols].T / math.sqrt(D)
                if mask is not None:
                    s = s + mask[b, 0, 0][None, :]
                s = np.exp(s - s.max(-1, keepdims=True))
                s = s / s.sum(-1, keepdims=True)
                ctx[b, :, cols] = s @ v[b, :, cols]
        attn = ctx @ w("attn.out.weight") + w("attn.out.bias")
        x = _layer_norm(x + attn, w("ln1.gamma"), w("ln1.beta"), eps)
        up = _gelu(x @ w("ffn.up.weight") + w("ffn.up.bias"))
        ffn = up @ w("ffn.down.weight") + w("ffn.down.bias")
        x = _layer_norm(x + ffn, w("ln2.gamma"), w("ln2.beta"), eps)
    return x


def _check(g, feeds, params, ref):
    (out,) = bz.interpret(g, feeds, params)
    assert out.dtype == np.float32 and out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    (out64,) = bz.interpret(g, feeds, params, float64=True)
    np.testing.assert_allclose(out64, ref, rtol=1e-9, atol=1e-9)


def _hidden(B, S, E, seed=1):
    return np.random.default_rng(seed).standard_normal((B, S, E)).astype(np.float32)


def test_bert_encoder_matches_numpy_post_norm_encoder():
    g = bert_encoder(layers=2, hidden=32, heads=4, batch=2, seq=6, eps=1e-5)
    params = bz.init_params(g, seed=0)
    x = _hidden(2, 6, 32)
    _check(g, {"hidden": x}, params, reference_bert(params, x, layers=2, heads=4, eps=1e-5))


def test_bert_default_eps_is_bert_1e_12():
    g = bert_encoder(layers=1, hidden=16, heads=2, batch=1, seq=4)
    params = bz.init_params(g, seed=3)
    x = _hidden(1, 4, 16)
    _check(g, {"hidden": x}, params, reference_bert(params, x, layers=1, heads=2, eps=1e-12))


def test_bert_symbolic_batch_and_seq_run_on_concrete_feeds():
    g = bert_encoder(layers=2, hidden=32, heads=4, batch="batch", seq="seq", eps=1e-5)
    assert g.inputs[0].op.shape.dims == ("batch", "seq", 32)
    params = bz.init_params(g, seed=0)
    for B, S in [(2, 5), (1, 7)]:
        x = _hidden(B, S, 32, seed=B * 10 + S)
        ref = reference_bert(params, x, layers=2, heads=4, eps=1e-5)
        _check(g, {"hidden": x}, params, ref)


def test_bert_additive_mask_hides_padded_keys():
    g = bert_encoder(layers=2, hidden=32, heads=4, batch=2, seq=6, eps=1e-5, with_mask=True)
    assert [n.op.name for n in g.inputs] == ["hidden", "mask"]
    params = bz.init_params(g, seed=0)
    x = _hidden(2, 6, 32)
    mask = np.zeros((2, 1, 1, 6), np.float32)
    mask[0, ..., 4:] = -1e4  # first sequence has 4 real tokens
    mask[1, ..., 5:] = -1e4
    ref = reference_bert(params, x, layers=2, heads=4, eps=1e-5, mask=mask)
    _check(g, {"hidden": x, "mask": mask}, params, ref)
    unmasked = reference_bert(params, x, layers=2, heads=4, eps=1e-5)
    assert not np.allclose(ref, unmasked, atol=1e-3)  # the mask really changes the result


def test_bert_symbolic_mask_shape_follows_batch_and_seq():
    g = bert_encoder(layers=1, hidden=16, heads=2, batch="batch", seq="seq", with_mask=True)
    assert g.inputs[1].op.shape.dims == ("batch", 1, 1, "seq")
    params = bz.init_params(g, seed=0)
    x = _hidden(3, 5, 16)
    mask = np.where(np.arange(5) < 3, 0.0, -1e4).astype(np.float32).reshape(1, 1, 1, 5)
    mask = np.repeat(mask, 3, axis=0)
    ref = reference_bert(params, x, layers=1, heads=2, eps=1e-12, mask=mask)
    _check(g, {"hidden": x, "mask": mask}, params, ref)


def test_bert_fused_qkv_uses_one_weight_and_narrows():
    g = bert_encoder(layers=2, hidden=32, heads=4, batch=2, seq=5, eps=1e-5, qkv="fused")
    names = {n.op.name for n in g.params}
    assert "layer0.attn.qkv.weight" in names and "layer0.attn.q.weight" not in names
    assert g.node_by_name("layer1.attn.qkv.weight").op.shape.dims == (32, 96)
    params = bz.init_params(g, seed=0)
    x = _hidden(2, 5, 32)
    ref = reference_bert(params, x, layers=2, heads=4, eps=1e-5, qkv="fused")
    _check(g, {"hidden": x}, params, ref)


def test_bert_op_counts_are_primitives_per_layer():
    counts = bert_encoder(layers=3, hidden=32, heads=4, batch=2, seq=5).op_counts()
    assert counts == {
        "matmul": 6 * 3, "add": 8 * 3, "reshape": 4 * 3, "transpose": 4 * 3,
        "attention": 3, "layer_norm": 2 * 3, "gelu": 3,
    }
    fused = bert_encoder(layers=3, hidden=32, heads=4, batch=2, seq=5, qkv="fused").op_counts()
    assert fused["matmul"] == 4 * 3 and fused["add"] == 6 * 3 and fused["narrow"] == 3 * 3


def test_bert_param_names_follow_the_documented_scheme():
    g = bert_encoder(layers=1, hidden=16, heads=2, intermediate=24, batch=1, seq=4)
    shapes = {n.op.name: n.op.shape.dims for n in g.params}
    assert shapes == {
        "layer0.attn.q.weight": (16, 16), "layer0.attn.q.bias": (16,),
        "layer0.attn.k.weight": (16, 16), "layer0.attn.k.bias": (16,),
        "layer0.attn.v.weight": (16, 16), "layer0.attn.v.bias": (16,),
        "layer0.attn.out.weight": (16, 16), "layer0.attn.out.bias": (16,),
        "layer0.ln1.gamma": (16,), "layer0.ln1.beta": (16,),
        "layer0.ffn.up.weight": (16, 24), "layer0.ffn.up.bias": (24,),
        "layer0.ffn.down.weight": (24, 16), "layer0.ffn.down.bias": (16,),
        "layer0.ln2.gamma": (16,), "layer0.ln2.beta": (16,),
    }


def test_bert_seed_stores_init_params_weights_and_no_seed_stores_none():
    plain = bert_encoder(layers=1, hidden=16, heads=2, batch=1, seq=4)
    assert plain.weights == {}
    seeded = bert_encoder(layers=1, hidden=16, heads=2, batch=1, seq=4, seed=7)
    expected = bz.init_params(plain, seed=7)
    assert set(seeded.weights) == set(expected)
    for name, arr in expected.items():
        np.testing.assert_array_equal(seeded.weights[name], arr)
    x = _hidden(1, 4, 16)
    (out,) = bz.interpret(seeded, {"hidden": x})  # runs from the stored weights alone
    np.testing.assert_allclose(out, reference_bert(expected, x, layers=1, heads=2, eps=1e-12),
                               rtol=1e-5, atol=1e-5)


def test_bert_presets_have_the_documented_sizes():
    tiny = bert_tiny()
    assert tiny.inputs[0].op.shape.dims == (2, 8, 64)
    assert tiny.op_counts()["attention"] == 2
    assert tiny.node_by_name("layer1.ffn.up.weight").op.shape.dims == (64, 256)
    base = bert_base()
    assert base.inputs[0].op.shape.dims == (1, 128, 768)
    assert base.op_counts()["attention"] == 12
    assert base.node_by_name("layer11.ffn.up.weight").op.shape.dims == (768, 3072)
    assert base.shape_of(base.outputs[0]).dims == (1, 128, 768)


def test_bert_rejects_bad_configuration():
    with pytest.raises(bz.GraphError, match="heads"):
        bert_encoder(layers=1, hidden=30, heads=4)
    with pytest.raises(bz.GraphError, match="qkv"):
        bert_encoder(layers=1, hidden=16, heads=2, qkv="packed")
