"""Attention and RoPE specification: shape inference (GQA, symbolic dims, errors), the direct
references against explicit per-head / per-pair NumPy loops written here, and agreement of the
direct references with their decompositions into primitives."""
import math

import numpy as np
import pytest

import braze as bz
from braze.interpret import decomposition_graph
from braze.ir.ops.attention import Attention, MaskKind, Rope, rope_tables

RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# -- independent implementations ----------------------------------------------------------------
def loop_attention(q, k, v, *, scale=None, visible=None, add=None, softcap=None):
    """Per batch, head and query: softmax over the visible keys only, kv head h // (Hq/Hkv)."""
    b_, hq, sq, d = q.shape
    hkv, sk, dv = k.shape[1], k.shape[2], v.shape[3]
    scale = 1 / math.sqrt(d) if scale is None else scale
    add = None if add is None else np.broadcast_to(add, (b_, hq, sq, sk))
    out = np.zeros((b_, hq, sq, dv))
    for b in range(b_):
        for h in range(hq):
            kv = h // (hq // hkv)
            for i in range(sq):
                keys = [j for j in range(sk) if visible is None or visible(i, j)]
                s = []
                for j in keys:
                    score = float(np.dot(q[b, h, i].astype(np.float64), k[b, kv, j])) * scale
                    if softcap is not None:
                        score = softcap * math.tanh(score / softcap)
                    if add is not None:
                        score += add[b, h, i, j]
                    s.append(score)
                p = np.exp(np.array(s) - max(s))
                p /= p.sum()
                out[b, h, i] = sum(pj * v[b, kv, j] for pj, j in zip(p, keys))
    return out


def loop_rope(x, theta, n_rot, interleaved):
    """Rotate each pair of x[..., s, :n_rot] by angle theta[s, pair]; pass the rest through."""
    out = x.astype(np.float64).copy()
    half = n_rot // 2
    for s in range(x.shape[-2]):
        for i in range(half):
            a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
            c, sn = math.cos(theta[s, i]), math.sin(theta[s, i])
            xa, xb = x[..., s, a].astype(np.float64), x[..., s, b].astype(np.float64)
            out[..., s, a] = xa * c - xb * sn
            out[..., s, b] = xb * c + xa * sn
    return out


def decomposed(op, *arrays):
    shapes = [bz.Shape(a.shape, bz.ir.dtypes.dtype_from_numpy(a.dtype)) for a in arrays]
    g = decomposition_graph(op, shapes)
    return bz.interpret(g, {f"x{i}": a for i, a in enumerate(arrays)})[0]


# -- attention inference ------------------------------------------------------------------------
def test_attention_infers_gqa_and_value_head_dim():
    g = bz.Graph()
    q = g.input("q", bz.Shape(("batch", 8, "sq", 16)))
    k = g.input("k", bz.Shape(("batch", 2, "sk", 16)))
    v = g.input("v", bz.Shape(("batch", 2, "sk", 24)))
    y = g.attention_causal(q, k, v)
    assert g.shape_of(y) == bz.Shape(("batch", 8, "sq", 24))
    assert g.node(y).op == Attention(MaskKind.CAUSAL)


def test_attention_builder_picks_mask_kind():
    g = bz.Graph()
    q = g.input("q", bz.Shape((1, 2, 3, 4)))
    m = g.input("m", bz.Shape((3, 3)))
    assert g.node(g.attention(q, q, q)).op.mask is MaskKind.NONE
    assert g.node(g.attention(q, q, q, m)).op.mask is MaskKind.CUSTOM
    assert g.node(g.attention_bias(q, q, q, m)).op.mask is MaskKind.BIAS
    assert g.node(g.attention_(q, q, q, causal=True)).op.mask is MaskKind.CAUSAL
    op = g.node(g.attention(q, q, q, kind="sliding_window", window=2, softcap=5)).op
    assert op == Attention(MaskKind.SLIDING_WINDOW, 2, None, 5.0)
    with pytest.raises(bz.GraphError, match="needs a mask"):
        g.attention(q, q, q, kind="bias")
    with pytest.raises(bz.GraphError, match="takes no mask"):
        g.attention(q, q, q, m, kind="causal")
    with pytest.raises(bz.GraphError, match="unknown attention mask kind"):
        g.attention(q, q, q, kind="diagonal")


@pytest.mark.parametrize("k_shape, kw, msg", [
    ((1, 3, 5, 4), {}, "kv heads 3 must divide query heads 4"),
    ((1, 2, 5, 8), {}, "head dim differs"),
    ((2, 2, 5, 4), {}, "batch differs"),
    ((1, 2, 5, 4), {"kind": "sliding_window"}, "window > 0"),
    ((1, 2, 5, 4), {"window": 3}, "only meaningful"),
    ((1, 2, 5, 4), {"softcap": -1.0}, "softcap must be > 0"),
])
def test_attention_rejects_mismatches_naming_the_op(k_shape, kw, msg):
    g = bz.Graph()
    q = g.input("q", bz.Shape((1, 4, 3, 4)))
    k = g.input("k", bz.Shape(k_shape))
    with pytest.raises(bz.ShapeError, match=f"attention.*{msg}"):
        g.attention(q, k, k, **kw)


def test_attention_mask_must_broadcast_to_scores():
    g = bz.Graph()
    q = g.input("q", bz.Shape((2, 4, 3, 8)))
    k = g.input("k", bz.Shape((2, 4, 5, 8)))
    g.attention(q, k, k, g.input("ok", bz.Shape((1, 4, 1, 5))))
    with pytest.raises(bz.ShapeError, match=r"attention.*does not broadcast to \[B, Hq, Sq, Sk\]"):
        g.attention(q, k, k, g.input("bad", bz.Shape((3, 3))))


# -- attention reference ------------------------------------------------------------------------
def causal(sq, sk, window=None):
    off = sk - sq
    if window is None:
        return lambda i, j: j <= i + off
    return lambda i, j: i + off - window < j <= i + off


CASES = {
    "mha": (Attention(), (2, 2, 4, 8), (2, 2, 4, 8), 8, None, {}),
    "gqa": (Attention(), (1, 6, 3, 8), (1, 2, 5, 8), 4, None, {}),
    "mqa_causal_sq_lt_sk": (Attention(MaskKind.CAUSAL), (1, 4, 3, 8), (1, 1, 6, 8), 8, None,
                            {"visible": causal(3, 6)}),
    "causal_square_scaled": (Attention(MaskKind.CAUSAL, scale=0.3), (2, 2, 5, 4), (2, 2, 5, 4),
                             4, None, {"visible": causal(5, 5), "scale": 0.3}),
    "sliding_window": (Attention(MaskKind.SLIDING_WINDOW, window=2), (1, 4, 6, 8), (1, 2, 6, 8),
                       8, None, {"visible": causal(6, 6, 2)}),
    "softcap_causal": (Attention(MaskKind.CAUSAL, softcap=0.5), (1, 2, 4, 8), (1, 2, 4, 8), 8,
                       None, {"visible": causal(4, 4), "softcap": 0.5}),
    "bias_alibi": (Attention(MaskKind.BIAS), (2, 4, 3, 8), (2, 2, 5, 8), 8, (1, 4, 1, 5), {}),
    "custom_mask": (Attention(MaskKind.CUSTOM), (1, 2, 4, 8), (1, 2, 4, 8), 8, (4, 4), {}),
}


def case_arrays(name):
    op, qs, ks, dv, mask_shape, kw = CASES[name]
    q, k, v = rand(*qs), rand(*ks), rand(*ks[:3], dv)
    arrays = [q, k, v]
    if mask_shape is not None:
        if name == "custom_mask":  # padding-style mask: last key hidden from every query
            m = np.zeros(mask_shape, np.float32)
            m[:, -1] = -1e9
            kw = {**kw, "visible": lambda i, j: j < mask_shape[1] - 1}
        else:
            m = rand(*mask_shape)
            kw = {**kw, "add": m}
        arrays.append(m)
    return op, arrays, kw


@pytest.mark.parametrize("name", list(CASES))
def test_attention_reference_matches_per_head_loops(name):
    op, arrays, kw = case_arrays(name)
    got = op.reference(*arrays)
    want = loop_attention(*arrays[:3], **kw)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_attention_decomposition_agrees_with_reference(name):
    op, arrays, _ = case_arrays(name)
    np.testing.assert_allclose(decomposed(op, *arrays), op.reference(*arrays), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("mask, window", [(MaskKind.CAUSAL, 0), (MaskKind.SLIDING_WINDOW, 2)])
def test_causal_decomposition_with_a_symbolic_sequence_builds_the_mask_from_ranges(mask, window):
    shapes = [bz.Shape((1, 2, "s", 4))] * 3
    g = decomposition_graph(Attention(mask, window), shapes)
    assert g.count("range") == 2 and g.count("softmax") == 1
    op = Attention(mask, window)
    for n in (3, 6):
        q, k, v = (rand(1, 2, n, 4) for _ in range(3))
        (got,) = bz.interpret(g, {"x0": q, "x1": k, "x2": v})
        np.testing.assert_allclose(got, op.reference(q, k, v), rtol=1e-5, atol=1e-6)


def test_attention_f16_keeps_dtype():
    q, k, v = (rand(1, 2, 3, 4, dtype=np.float16) for _ in range(3))
    got = Attention(MaskKind.CAUSAL).reference(q, k, v)
    assert got.dtype == np.float16
    want = loop_attention(q, k, v, visible=causal(3, 3))
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


def test_causal_gqa_graph_float64_interpret_matches_loops():
    g = bz.Graph("attn")
    q = g.input("q", bz.Shape(("b", 4, 3, 8)))
    k = g.input("k", bz.Shape(("b", 2, 5, 8)))
    v = g.input("v", bz.Shape(("b", 2, 5, 8)))
    g.set_outputs([g.attention_causal(q, k, v)])
    feeds = bz.random_feeds(g, seed=3, symbols={"b": 2})
    (got,) = bz.interpret(g, feeds, float64=True)
    assert got.dtype == np.float64
    want = loop_attention(feeds["q"], feeds["k"], feeds["v"], visible=causal(3, 5))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


# -- rope ---------------------------------------------------------------------------------------
def test_rope_tables_follow_the_frequency_formula():
    cos, sin = rope_tables(5, 6, base=100.0)
    assert cos.shape == sin.shape == (5, 3) and cos.dtype == np.float32
    for s in range(5):
        for i in range(3):
            angle = s * 100.0 ** (-2 * i / 6)
            assert math.isclose(cos[s, i], math.cos(angle), rel_tol=1e-6, abs_tol=1e-7)
            assert math.isclose(sin[s, i], math.sin(angle), rel_tol=1e-6, abs_tol=1e-7)
    with pytest.raises(ValueError, match="even"):
        rope_tables(4, 5)


def test_rope_infers_and_rejects():
    g = bz.Graph()
    x = g.input("x", bz.Shape(("b", 2, "s", 8)))
    cs = g.input("cos", bz.Shape(("s", 3)))
    assert g.shape_of(g.rope_n(x, cs, cs, 6)) == bz.Shape(("b", 2, "s", 8))
    assert g.node(g.rope_n(x, cs, cs, 6)).op == Rope(False, 6)
    with pytest.raises(bz.ShapeError, match=r"rope cos/sin must be \[S, 4\]"):
        g.rope(x, cs, cs)
    with pytest.raises(bz.ShapeError, match="rope n_rot must be even"):
        g.rope_n(x, cs, cs, 7)
    with pytest.raises(bz.ShapeError, match="rope n_rot must be even"):
        g.rope_n(x, cs, cs, 10)
    other = g.input("cos2", bz.Shape(("t", 3)))
    with pytest.raises(bz.ShapeError, match="do not broadcast"):
        g.rope_n(x, other, other, 6)


ROPE_CASES = [(False, None), (True, None), (False, 4), (True, 4)]


@pytest.mark.parametrize("interleaved, n_rot", ROPE_CASES)
def test_rope_reference_rotates_pairs(interleaved, n_rot):
    x = rand(2, 3, 5, 8)
    n = 8 if n_rot is None else n_rot
    theta = RNG.uniform(-3, 3, size=(5, n // 2))
    cos, sin = np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)
    got = Rope(interleaved, n_rot).reference(x, cos, sin)
    np.testing.assert_allclose(got, loop_rope(x, theta, n, interleaved), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[..., n:], x[..., n:])


@pytest.mark.parametrize("interleaved, n_rot", ROPE_CASES)
def test_rope_decomposition_agrees_with_reference(interleaved, n_rot):
    x = rand(2, 3, 5, 8)
    cos, sin = rope_tables(5, 8 if n_rot is None else n_rot)
    op = Rope(interleaved, n_rot)
    np.testing.assert_allclose(decomposed(op, x, cos, sin), op.reference(x, cos, sin),
                               rtol=1e-6, atol=1e-6)


def test_rope_per_batch_tables_broadcast():
    x = rand(2, 3, 4, 6)
    theta = RNG.uniform(-3, 3, size=(2, 1, 4, 3))  # per-batch positions, shared over heads
    cos, sin = np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)
    op = Rope(True)
    got = op.reference(x, cos, sin)
    for b in range(2):
        np.testing.assert_allclose(got[b], loop_rope(x[b], theta[b, 0], 6, True), rtol=1e-5,
                                   atol=1e-5)
    np.testing.assert_allclose(decomposed(op, x, cos, sin), got, rtol=1e-6, atol=1e-6)


def test_rope_then_attention_graph_float64():
    g = bz.Graph("rope_attn")
    q = g.input("q", bz.Shape((1, 2, 4, 8)))
    k = g.input("k", bz.Shape((1, 2, 4, 8)))
    cos_np, sin_np = rope_tables(4, 8)
    cos, sin = g.constant(cos_np), g.constant(sin_np)
    g.set_outputs([g.attention_(g.rope(q, cos, sin), g.rope(k, cos, sin), k, causal=True)])
    feeds = bz.random_feeds(g, seed=5)
    (got,) = bz.interpret(g, feeds, float64=True)
    theta = np.outer(np.arange(4), 10000.0 ** (-np.arange(0, 8, 2) / 8))
    qr, kr = (loop_rope(feeds[n], theta, 8, False) for n in ("q", "k"))
    want = loop_attention(qr, kr, feeds["k"], visible=causal(4, 4))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_fully_masked_query_rows_output_zeros_like_pytorch_sdpa():
    g = bz.Graph("masked")
    q = g.input("q", bz.Shape((1, 1, 2, 4)))
    v = g.input("v", bz.Shape((1, 1, 2, 4)))
    m = g.input("m", bz.Shape((1, 1, 2, 2)))
    g.set_outputs([g.attention(q, q, v, m)])
    rng = np.random.default_rng(0)
    feeds = {"q": rng.standard_normal((1, 1, 2, 4)).astype(np.float32),
             "v": rng.standard_normal((1, 1, 2, 4)).astype(np.float32),
             "m": np.array([[[[-np.inf, -np.inf], [0.0, -np.inf]]]], np.float32)}
    (out,) = bz.interpret(g, feeds)
    np.testing.assert_array_equal(out[0, 0, 0], np.zeros(4, np.float32))  # every key masked
    np.testing.assert_allclose(out[0, 0, 1], feeds["v"][0, 0, 0], rtol=1e-6)
    from braze.passes.expand import expand_nodes

    dec, _ = expand_nodes(g, lambda op: op.composite)
    assert "attention" not in dec.op_counts() and "softmax" not in dec.op_counts()
    (via_dec,) = bz.interpret(dec, feeds)
    np.testing.assert_allclose(via_dec, out, rtol=1e-6, atol=1e-7)
