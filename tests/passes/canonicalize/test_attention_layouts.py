"""Attention as held-out architectures write it: bmm on [B*H, S, D] views (BLOOM's baddbmm with
ALiBi, older encoder exports), plain 3-D attention, q scaled before its head split (OPT, BART),
fused QKV projections laid out per head ([B, S, H, 3, D] gathers, multi-query [B, S, H+2, D],
grouped [B, S, Hkv, r+2, D]), rope applied before the head transpose (GPT-J), and the forms
torch.export writes around its sdpa op (split pieces, q scaled before an attention op, heads
gathered by lifted index tables). Each becomes the attention op and then one fused attention
block, with the numbers unchanged; what cannot be read is reported with the reason."""
import numpy as np
import pytest
from helpers import canonicalize, check_same

import braze as bz
from braze.ir.ops.attention import MaskKind
from braze.rewrite import MissReason

B, S, H, D = 2, 5, 2, 4
E = H * D
SYM = {"b": B, "s": S}
NEG = float(np.finfo(np.float32).min)


def _attn_ops(g):
    return [n.op for n in g.nodes if n.op.kind == "attention"]


def _params(g, seed=0):
    return bz.init_params(g, seed)


def _stored(g, name, shape, rng):
    return g.param(name, bz.Shape(shape), value=rng.standard_normal(shape).astype("f4"))


def _project(g, x, name, width, rng, bias=True):
    y = g.matmul(x, _stored(g, f"w_{name}", (E, width), rng))
    return g.add(y, _stored(g, f"b_{name}", (width,), rng)) if bias else y


def _merge_and_project(g, o, rng):
    merged = g.reshape(g.transpose(o, (0, 2, 1, 3)), ("b", "s", o_width(g, o)))
    return g.matmul(merged, _stored(g, "w_o", (o_width(g, o), E), rng))


def o_width(g, o):
    _, h, _, d = g.shape_of(o).dims
    return h * d


def _fuses_to_one_block(g, **kw):
    fused, report = bz.fuse(g, "cpu")
    assert fused.count("fused_attention_block") == 1, report
    assert not [m for m in report.misses if "ttention" in m.pattern], report.misses
    check_same(g, fused, symbols=SYM, **kw)
    return fused


# -- bmm on [B*H, S, D] views ---------------------------------------------------------------------
def test_baddbmm_attention_with_alibi_on_merged_heads_becomes_one_attention():
    """BLOOM: scores = alibi * 1 + (q3 @ k3^T) * inv_norm on [B*H, S, S]; viewed as
    [B, H, S, S] for the padding mask and the softmax; probs back to [B*H, S, S] @ v3."""
    rng = np.random.default_rng(0)
    g = bz.Graph("bloom")
    x = g.input("x", bz.Shape(("b", "s", E)))
    keep = g.input("keep", bz.Shape(("b", 1, "s", "s"), bz.bool_))
    alibi = g.input("alibi", bz.Shape(("2*b", 1, "s")))
    heads = [g.transpose(g.reshape(_project(g, x, r, E, rng), ("b", "s", H, D)), (0, 2, 1, 3))
             for r in "qkv"]
    q3, k3, v3 = (g.reshape(t, ("2*b", "s", D)) for t in heads)
    s3 = g.add(g.mul(alibi, 1.0), g.mul(g.matmul(q3, g.transpose(k3, (0, 2, 1))), D ** -0.5))
    s4 = g.where(keep, g.reshape(s3, ("b", H, "s", "s")), NEG)
    p3 = g.reshape(g.softmax(s4, -1), ("2*b", "s", "s"))
    o = g.reshape(g.matmul(p3, v3), ("b", H, "s", D))
    g.set_outputs([_merge_and_project(g, o, rng)])
    out, _ = canonicalize(g)
    (op,) = _attn_ops(out)
    assert op.mask is MaskKind.CUSTOM and op.scale is None
    assert out.count("softmax") == 0
    check_same(g, out, symbols=SYM)
    _fuses_to_one_block(g)


def test_plain_3d_attention_is_one_head():
    g = bz.Graph("single")
    q, k, v = (g.input(n, bz.Shape(("b", "s", D))) for n in "qkv")
    s = g.div(g.matmul(q, g.transpose(k, (0, 2, 1))), 3.0)
    g.set_outputs([g.matmul(g.softmax(s, -1), v)])
    out, _ = canonicalize(g)
    (op,) = _attn_ops(out)
    assert op.scale == pytest.approx(1 / 3)
    att = next(n for n in out.nodes if n.op.kind == "attention")
    assert out.shape_of(att.inputs[0]).dims == ("b", 1, "s", D)
    check_same(g, out, symbols=SYM)


def test_views_that_split_the_merged_axis_two_ways_are_a_reported_miss():
    """v is viewed from [B, H, S, D] but the scores are viewed as [H, B, S, S]: the two views
    disagree on which axis is the batch, so no one [B, H] frame holds."""
    g = bz.Graph("frames")
    q, k = (g.input(n, bz.Shape(("2*b", "s", D))) for n in "qk")
    v3 = g.reshape(g.input("v4", bz.Shape(("b", H, "s", D))), ("2*b", "s", D))
    s4 = g.reshape(g.matmul(q, g.transpose(k, (0, 2, 1))), (H, "b", "s", "s"))
    p3 = g.reshape(g.softmax(s4, -1), ("2*b", "s", "s"))
    g.set_outputs([g.matmul(p3, v3)])
    out, misses = canonicalize(g)
    assert not _attn_ops(out)
    (miss,) = [x for x in misses if x.pattern == "CanonicalizeAttention"]
    assert miss.reason is bz.MissReason.SHAPE_MISMATCH and "merged as" in miss.detail
    check_same(g, out, symbols=SYM)


# -- scales under the head split ------------------------------------------------------------------
def test_q_scaled_before_its_head_split_becomes_the_scale():
    """OPT / BART: q = (x @ w + b) * D**-0.5, then reshape and transpose."""
    rng = np.random.default_rng(1)
    g = bz.Graph("opt")
    x = g.input("x", bz.Shape(("b", "s", E)))
    split = lambda t: g.transpose(g.reshape(t, ("b", "s", H, D)), (0, 2, 1, 3))  # noqa: E731
    q = split(g.mul(_project(g, x, "q", E, rng), 0.7))
    k, v = (split(_project(g, x, r, E, rng)) for r in "kv")
    o = g.matmul(g.softmax(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), -1), v)
    g.set_outputs([_merge_and_project(g, o, rng)])
    out, _ = canonicalize(g)
    (op,) = _attn_ops(out)
    assert op.scale == pytest.approx(0.7) and out.count("mul") == 0
    _fuses_to_one_block(g)


def test_a_scaled_q_read_elsewhere_keeps_its_scale():
    g = bz.Graph("shared")
    x = g.input("x", bz.Shape(("b", "s", E)))
    scaled = g.mul(x, 0.7)
    q = g.transpose(g.reshape(scaled, ("b", "s", H, D)), (0, 2, 1, 3))
    k = g.transpose(g.reshape(g.exp(x), ("b", "s", H, D)), (0, 2, 1, 3))
    o = g.matmul(g.softmax(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), -1), k)
    g.set_outputs([o, scaled])
    out, _ = canonicalize(g)
    (op,) = _attn_ops(out)
    assert op.scale == pytest.approx(1.0) and out.count("mul") == 1
    check_same(g, out, symbols=SYM)


def test_softmax_weighted_matmul_of_something_else_names_where_it_stopped():
    g = bz.Graph("pool")
    q, v = (g.input(n, bz.Shape(("b", H, "s", D))) for n in "qv")
    s = g.exp(g.matmul(q, g.transpose(v, (0, 1, 3, 2))))     # exp of the scores: not attention
    g.set_outputs([g.matmul(g.softmax(s, -1), v)])
    out, misses = canonicalize(g)
    assert not _attn_ops(out)
    (miss,) = [m for m in misses if m.pattern == "CanonicalizeAttention"]
    assert miss.reason is bz.MissReason.PATTERN_MISMATCH and "stopped at" in miss.detail
    assert "exp" in miss.detail


# -- fused QKV in per-head layouts ----------------------------------------------------------------
def _attend(g, q, k, v, rng):
    s = g.mul(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), D ** -0.5)
    return _merge_and_project(g, g.matmul(g.softmax(s, -1), v), rng)


@pytest.mark.parametrize("stored", [True, False])
def test_bloom_layout_gathers_of_b_s_h_3_d(stored):
    rng = np.random.default_rng(2)
    g = bz.Graph("bloom_qkv")
    x = g.input("x", bz.Shape(("b", "s", E)))
    w = _stored(g, "w", (E, 3 * E), rng) if stored else g.param("w", bz.Shape((E, 3 * E)))
    qkv = g.reshape(g.add(g.matmul(x, w), _stored(g, "bias", (3 * E,), rng)),
                    ("b", "s", H, 3, D))
    q, k, v = (g.transpose(g.gather(qkv, g.constant(np.int64(j)), 3), (0, 2, 1, 3))
               for j in range(3))
    g.set_outputs([_attend(g, q, k, v, rng)])
    fused = _fuses_to_one_block(g, params=_params(g))
    if stored:  # the per-block columns are read off the stored weight once
        assert all(n.op.kind != "gather" for n in fused.nodes)


def test_multi_query_layout_narrow_and_normalized_negative_gathers():
    """Falcon: [B, S, H + 2, D]; q = heads [0, H), k = head -2, v = head -1, the negative
    indices normalized with a dim-derived where(i < 0, i + n, i) as the dynamo export does."""
    rng = np.random.default_rng(3)
    g = bz.Graph("mqa")
    x = g.input("x", bz.Shape(("b", "s", E)))
    fused = g.reshape(g.matmul(x, _stored(g, "w", (E, (H + 2) * D), rng)),
                      ("b", "s", H + 2, D))
    q = g.transpose(g.narrow(fused, 2, 0, H), (0, 2, 1, 3))

    def head(i):
        idx = g.constant(np.asarray([i], np.int64))
        norm = g.where(g.lt(idx, 0), g.add(idx, g.sym_const([H + 2])), idx)
        return g.transpose(g.gather(fused, norm, 2), (0, 2, 1, 3))

    g.set_outputs([_attend(g, q, head(-2), head(-1), rng)])
    fused_g = _fuses_to_one_block(g)
    (blk,) = [n.op for n in fused_g.nodes if n.op.kind == "fused_attention_block"]
    assert (blk.num_heads, blk.num_kv_heads) == (H, 1)
    assert fused_g.count("narrow") == 0


def test_grouped_layout_b_s_hkv_r_plus_2_d():
    """New Falcon / grouped layouts: per kv group, r query heads then k then v; repeat_kv's
    [B, Hkv, 1, S, D] view of k and v is a transpose of the layout's unit axis."""
    rng = np.random.default_rng(4)
    hkv, r = 2, 2
    g = bz.Graph("grouped")
    x = g.input("x", bz.Shape(("b", "s", E)))
    qkv = g.reshape(g.matmul(x, _stored(g, "w", (E, hkv * (r + 2) * D), rng)),
                    ("b", "s", hkv, r + 2, D))
    q = g.transpose(g.reshape(g.narrow(qkv, 3, 0, r), ("b", "s", hkv * r, D)), (0, 2, 1, 3))
    k, v = (g.transpose(g.reshape(g.narrow(qkv, 3, r + j, 1), ("b", "s", hkv, D)),
                        (0, 2, 1, 3)) for j in range(2))
    repeat_kv = lambda t: g.reshape(  # noqa: E731  [b, hkv, s, D] -> [b, hkv * r, s, D]
        g.expand(g.reshape(t, ("b", hkv, 1, "s", D)), ("b", hkv, r, "s", D)),
        ("b", hkv * r, "s", D))
    k, v = repeat_kv(k), repeat_kv(v)
    g.set_outputs([_attend(g, q, k, v, rng)])
    fused = _fuses_to_one_block(g)
    (blk,) = [n.op for n in fused.nodes if n.op.kind == "fused_attention_block"]
    assert (blk.num_heads, blk.num_kv_heads) == (hkv * r, hkv)


def test_a_layout_chain_that_mixes_tokens_is_not_read_as_columns():
    """Narrowing the sequence axis is not a column selection: q stays as written, and the
    block fusion says why it does not fuse."""
    rng = np.random.default_rng(5)
    g = bz.Graph("mix")
    x = g.input("x", bz.Shape(("b", 6, E)))
    p = g.reshape(g.matmul(x, _stored(g, "w", (E, 2 * E), rng)), ("b", 6, 2 * H, D))
    q = g.transpose(g.narrow(g.narrow(p, 2, 0, H), 1, 0, 3), (0, 2, 1, 3))
    k = g.transpose(g.narrow(g.narrow(p, 2, H, H), 1, 3, 3), (0, 2, 1, 3))
    s = g.matmul(q, g.transpose(k, (0, 1, 3, 2)))
    o = g.matmul(g.softmax(s, -1), k)
    merged = g.reshape(g.transpose(o, (0, 2, 1, 3)), ("b", 3, E))
    g.set_outputs([g.matmul(merged, _stored(g, "w_o", (E, E), rng))])
    fused, report = bz.fuse(g, "cpu")
    assert fused.count("attention") == 1 and fused.count("fused_attention_block") == 0
    (miss,) = [m for m in report.misses if m.pattern == "FuseAttentionBlock"]
    assert miss.detail.startswith("q ") and "narrow" in miss.detail
    check_same(g, fused, symbols={"b": 2})


# -- rope before the head transpose ---------------------------------------------------------------
def test_rope_on_b_s_h_d_moves_after_the_head_transpose():
    """GPT-J: rope (interleaved, partial) on [B, S, H, D] with tables [1, S, 1, n/2]."""
    rng = np.random.default_rng(6)
    g = bz.Graph("gptj")
    x = g.input("x", bz.Shape(("b", "s", E)))
    cos, sin = (g.input(n, bz.Shape((1, "s", 1, 1))) for n in ("cos", "sin"))
    split = lambda t: g.reshape(t, ("b", "s", H, D))  # noqa: E731
    q, k = (g.transpose(g.rope(split(_project(g, x, r, E, rng, bias=False)), cos, sin,
                               interleaved=True, n_rot=2), (0, 2, 1, 3)) for r in "qk")
    v = g.transpose(split(_project(g, x, "v", E, rng, bias=False)), (0, 2, 1, 3))
    g.set_outputs([_attend(g, q, k, v, rng)])
    fused = _fuses_to_one_block(g)
    (blk,) = [n.op for n in fused.nodes if n.op.kind == "fused_attention_block"]
    assert blk.rope.value == "interleaved" and blk.n_rot == 2


# -- torch.export forms ---------------------------------------------------------------------------
def _heads(g, t, h=H):
    return g.transpose(g.reshape(t, ("b", "s", h, D)), (0, 2, 1, 3))


def test_split_of_a_fused_qkv_projection_fuses():
    """GPT-2 through torch.export: c_attn's output cut with aten.split (a braze split op)."""
    rng = np.random.default_rng(7)
    g = bz.Graph("gpt2_split")
    x = g.input("x", bz.Shape(("b", "s", E)))
    q, k, v = (_heads(g, t) for t in g.split(_project(g, x, "qkv", 3 * E, rng), -1, [E] * 3))
    g.set_outputs([_attend(g, q, k, v, rng)])
    fused = _fuses_to_one_block(g)
    assert fused.count("split") == 0 and fused.count("narrow") == 0


def test_split_of_per_head_fused_qkv_fuses():
    """GPT-NeoX through torch.export: [B, H, S, 3D] heads cut with aten.split on the last axis."""
    rng = np.random.default_rng(8)
    g = bz.Graph("neox_split")
    x = g.input("x", bz.Shape(("b", "s", E)))
    per_head = g.transpose(g.reshape(_project(g, x, "qkv", 3 * E, rng), ("b", "s", H, 3 * D)),
                           (0, 2, 1, 3))
    q, k, v = g.split(per_head, -1, [D] * 3)
    g.set_outputs([_attend(g, q, k, v, rng)])
    _fuses_to_one_block(g)


def _sdpa_block(g, rng, q_scale=None, k_scale=None, scale=1.0):
    """torch's sdpa op with (x @ w_q + b) * q_scale (OPT, BART) and k / k_scale."""
    x = g.input("x", bz.Shape(("b", "s", E)))
    q_in, k_in, v_in = (_project(g, x, r, E, rng) for r in "qkv")
    scaled_q = q_in if q_scale is None else g.mul(q_in, q_scale)
    k_in = k_in if k_scale is None else g.div(k_in, k_scale)
    mask = g.input("mask", bz.Shape(("b", 1, "s", "s")))
    o = g.attention(_heads(g, scaled_q), _heads(g, k_in), _heads(g, v_in), mask, scale=scale)
    return scaled_q, _merge_and_project(g, o, rng)


@pytest.mark.parametrize("q_scale,k_scale,scale,want", [
    (0.7, None, 1.0, 0.7),                      # OPT: scaling on q, sdpa with scale 1
    (0.5, 2.0, None, 0.25 / D ** 0.5),          # default 1/sqrt(D) times both factors
    (D ** -0.5, None, 1.0, None),               # the product is the default scale again
])
def test_constant_scales_of_q_and_k_fold_into_the_attention_op(q_scale, k_scale, scale, want):
    rng = np.random.default_rng(9)
    g = bz.Graph("opt_sdpa")
    _, y = _sdpa_block(g, rng, q_scale, k_scale, scale)
    g.set_outputs([y])
    out, _ = canonicalize(g)
    (op,) = _attn_ops(out)
    assert op.scale == (None if want is None else pytest.approx(want))
    assert out.count("mul") == 0 and out.count("div") == 0
    check_same(g, out, symbols=SYM)
    fused = _fuses_to_one_block(g)
    (blk,) = [n.op for n in fused.nodes if n.op.kind == "fused_attention_block"]
    assert blk.scale == op.scale


def test_a_scaled_q_the_graph_also_returns_keeps_its_scale_and_the_block_says_why():
    rng = np.random.default_rng(10)
    g = bz.Graph("opt_shared")
    scaled_q, y = _sdpa_block(g, rng, q_scale=0.7)
    g.set_outputs([y, scaled_q])
    fused, report = bz.fuse(g, "cpu")
    (op,) = _attn_ops(fused)
    assert op.scale == 1.0 and fused.count("fused_attention_block") == 0
    (miss,) = [m for m in report.misses if m.pattern == "FuseAttentionBlock"]
    # the scale folds into the q projection (FoldMatMulScale), whose output is returned
    assert miss.reason is MissReason.GRAPH_OUTPUT and "is a graph output" in miss.detail
    check_same(g, fused, symbols=SYM)


def _mqa_gathers(g, rng, index):
    """Falcon through torch.export: [B, S, H + 2, D] with k and v gathered by index tables."""
    x = g.input("x", bz.Shape(("b", "s", E)))
    qkv = g.reshape(g.matmul(x, _stored(g, "w", (E, (H + 2) * D), rng)), ("b", "s", H + 2, D))
    q = g.transpose(g.narrow(qkv, 2, 0, H), (0, 2, 1, 3))
    k, v = (g.transpose(g.gather(qkv, index(f"idx_{i}", i), 2), (0, 2, 1, 3)) for i in (-2, -1))
    g.set_outputs([_attend(g, q, k, v, rng)])


def test_heads_gathered_by_stored_index_tables_fuse():
    """torch.export lifts `torch.tensor([-2])` into a stored integer param."""
    rng = np.random.default_rng(11)
    g = bz.Graph("falcon_lifted")
    _mqa_gathers(g, rng, lambda name, i: g.param(name, bz.Shape((1,), bz.i64),
                                                 value=np.asarray([i], np.int64)))
    fused = _fuses_to_one_block(g)
    (blk,) = [n.op for n in fused.nodes if n.op.kind == "fused_attention_block"]
    assert (blk.num_heads, blk.num_kv_heads) == (H, 1)
    assert fused.count("gather") == 0


def test_heads_gathered_by_an_index_without_a_stored_value_stay_and_say_so():
    """An index param with no stored value could hold anything: k is not read as columns."""
    rng = np.random.default_rng(12)
    g = bz.Graph("falcon_unknown")
    _mqa_gathers(g, rng, lambda name, i: g.param(name, bz.Shape((1,), bz.i64)))
    fused, report = bz.fuse(g, "cpu")
    assert fused.count("fused_attention_block") == 0 and fused.count("attention") == 1
    (miss,) = [m for m in report.misses if m.pattern == "FuseAttentionBlock"]
    assert miss.detail.startswith("k heads are transposed from") and "gather" in miss.detail
    params = {"idx_-2": np.asarray([-2], np.int64), "idx_-1": np.asarray([-1], np.int64)}
    check_same(g, fused, symbols=SYM, params=params)
