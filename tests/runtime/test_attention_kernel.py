"""The flash-style C attention kernel (attention_native) at model-like sizes against the
reference interpreter on random inputs: head dims 32-128 (the 8 x 8 key transposes, values read
in place or padded), sequence lengths that are no multiple of the query / key blocks, several
online-softmax key chunks (running max and sum rescaled, a chunk whose keys are all -inf),
causal tile skipping, GQA, softcap, sliding windows, padding masks, one and two threads, and the
fused attention block reading its heads in place from the packed projection."""
import numpy as np
import pytest

import braze as bz
from braze.ir.ops.attention import rope_tables
from braze.runtime.kernels import attention_native

pytestmark = pytest.mark.skipif(attention_native.lib() is None,
                                reason="no C compiler on this machine")


def _matches(g, feeds_list, threads=None, rtol=2e-5, atol=2e-5):
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params, fuse=False, threads=threads)
    for feeds in feeds_list:
        want = bz.interpret(g, feeds, params)
        for got, w in zip(exe(feeds), want, strict=True):
            np.testing.assert_allclose(got, w, rtol=rtol, atol=atol)
    impls = {impl for _, kind, _, impl in exe.dispatch_report().rows
             if kind in ("attention", "fused_attention_block")}
    assert impls and all("kv head" in i or "C heads" in i for i in impls)
    return exe


def _attention_graph(b, hq, hkv, sq, sk, d, dv, kind, window=0, softcap=None):
    g = bz.Graph("attn")
    q = g.input("q", bz.Shape((b, hq, sq, d)))
    k = g.input("k", bz.Shape((b, hkv, sk, d)))
    v = g.input("v", bz.Shape((b, hkv, sk, dv)))
    mask = g.input("m", bz.Shape((b, 1, 1, sk))) if kind == "custom" else None
    g.set_outputs([g.attention(q, k, v, mask, kind=kind, window=window, softcap=softcap)])
    return g


def _feeds(g, seed, masked_prefix=0):
    """Random feeds; a mask is padding-like (0 or a large negative) with its first
    `masked_prefix` keys -inf in batch row 0."""
    feeds = bz.random_feeds(g, seed)
    if "m" in feeds:
        rng = np.random.default_rng(seed)
        m = np.where(rng.random(feeds["m"].shape) < 0.2, -1e9, 0.0).astype(np.float32)
        m[0, ..., :masked_prefix] = -np.inf
        feeds["m"] = m
    return feeds


@pytest.mark.parametrize("d, dv", [(32, 32), (64, 64), (80, 80), (96, 96), (128, 128),
                                   (64, 40)])
@pytest.mark.parametrize("kind", ["causal", "custom"])
def test_head_dims_and_odd_lengths(d, dv, kind):
    g = _attention_graph(2, 4, 2, 37, 37, d, dv, kind)
    _matches(g, [_feeds(g, 0, masked_prefix=5), _feeds(g, 1)])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind, window, softcap", [("causal", 0, None), ("none", 0, 30.0),
                                                   ("sliding_window", 21, None),
                                                   ("custom", 0, None)])
def test_several_key_chunks(kind, window, softcap, threads, monkeypatch):
    monkeypatch.setattr(attention_native, "KEY_BLOCK", 32)   # 5 chunks of keys
    monkeypatch.setattr(attention_native, "QUERY_BLOCK", 36)
    g = _attention_graph(2, 6, 2, 130, 130, 64, 64, kind, window, softcap)
    # row 0 of a custom mask: its first chunk only -inf keys, its second partly
    _matches(g, [_feeds(g, 0, masked_prefix=40), _feeds(g, 1)], threads=threads)


def test_keys_beyond_the_queries_and_fewer_keys_than_queries():
    for sq, sk in ((20, 75), (75, 20)):
        g = _attention_graph(1, 3, 3, sq, sk, 48, 48, "causal")
        _matches(g, [_feeds(g, 0)])


def test_all_keys_masked_in_every_chunk_gives_zeros(monkeypatch):
    monkeypatch.setattr(attention_native, "KEY_BLOCK", 16)
    g = _attention_graph(2, 2, 1, 40, 40, 32, 32, "custom")
    feeds = _feeds(g, 0, masked_prefix=40)
    exe = _matches(g, [feeds])
    assert not exe(feeds)[0][0].any() and exe(feeds)[0][1].any()


@pytest.mark.parametrize("rope", ["none", "rotate_half"])
@pytest.mark.parametrize("heads, mask_kind", [((4, 4), "causal"), ((6, 2), "causal"),
                                              ((4, 4), "custom")])
def test_fused_block_at_model_head_size(heads, mask_kind, rope):
    hq, hkv = heads
    d, s, e = 64, 45, 96
    g = bz.Graph("block")
    x = g.input("x", bz.Shape((2, s, e)))
    w_qkv = g.param("wqkv", bz.Shape((e, (hq + 2 * hkv) * d)))
    w_o = g.param("wo", bz.Shape((hq * d, e)))
    extra = {}
    if rope != "none":
        cos, sin = rope_tables(s, d)
        extra = {"cos": g.constant(cos), "sin": g.constant(sin)}
    if mask_kind == "custom":
        extra["mask"] = g.input("m", bz.Shape((2, 1, 1, s)))
    y = g.fused_attention_block(x, w_qkv, w_o, num_heads=hq, num_kv_heads=hkv,
                                mask_kind=mask_kind, rope=rope, **extra)
    g.set_outputs([y])
    _matches(g, [_feeds(g, 0, masked_prefix=3), _feeds(g, 1)], threads=2, rtol=1e-4,
             atol=1e-4)


@pytest.mark.parametrize("precision", [None, "bf16"])
def test_a_nan_query_gives_nan_not_zeros(precision, monkeypatch):
    """A query row with a NaN has every score NaN: the reference (and PyTorch) give NaN. The
    row max skips NaN, so the row took the fully-masked path and came out zeros, hiding the
    NaN; in one key chunk and in several, f32 and the bf16 core."""
    monkeypatch.setattr(attention_native, "KEY_BLOCK", 16)
    for sk in (12, 40):
        g = _attention_graph(1, 2, 1, 5, sk, 32, 32, "custom")
        feeds = _feeds(g, 0)
        feeds["m"][...] = 0.0
        feeds["q"][0, 1, 2, 3] = np.nan
        exe = bz.compile(g, fuse=False, precision=precision)
        got = exe(feeds)[0]
        assert np.isnan(got[0, 1, 2]).all() and not np.isnan(np.delete(got, 2, 2)).any()
        assert "C attention" in dict((r[1], r[3]) for r in exe.dispatch_report().rows)[
            "attention"]


@pytest.mark.parametrize("kind, window", [("causal", 0), ("sliding_window", 3)])
@pytest.mark.parametrize("precision", [None, "bf16"])
def test_queries_before_the_first_key_give_the_mean_of_v(kind, window, precision):
    """With more queries than keys, causal masks align the last query with the last key, so
    the first Sq - Sk queries see no key: their masked scores are all the dtype's lowest
    finite value, the softmax is uniform and they give the mean of v (Hugging Face's eager
    attention with its finfo.min mask gives the same), in the reference and the kernels."""
    g = _attention_graph(1, 2, 2, 9, 4, 32, 32, kind, window)
    feeds = _feeds(g, 0)
    exe = bz.compile(g, fuse=False, precision=precision)
    got, (want,) = exe(feeds)[0], bz.interpret(g, feeds)
    mean_v = feeds["v"].mean(axis=2)
    np.testing.assert_allclose(want[:, :, :5], np.repeat(mean_v[:, :, None], 5, 2), rtol=1e-5,
                               atol=1e-6)
    tol = 2e-5 if precision is None else 3e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
