"""Attention written in primitives becomes the attention op, whatever the scale placement, mask
form, softcap, casts or export guard; GQA's repeat_kv folds into kv heads; causal masks built
from dims become the causal kind; near matches that cannot be expressed report why."""
import numpy as np
import pytest
from helpers import canonicalize, check_same, run_rules

import braze as bz
from braze.ir.ops.attention import MaskKind
from braze.ir.ops.elementwise import BinaryFn
from braze.passes.canonicalize.attention import CANONICALIZE_ATTENTION, FOLD_REPEAT_KV
from braze.passes.canonicalize.layout import LAYOUT_RULES

B, H, S, D = 2, 2, 5, 4
NEG = float(np.finfo(np.float32).min)


def _qkv(g, heads=H, kv_heads=None):
    kv = kv_heads or heads
    q = g.input("q", bz.Shape(("b", heads, "s", D)))
    k = g.input("k", bz.Shape(("b", kv, "s", D)))
    v = g.input("v", bz.Shape(("b", kv, "s", D)))
    return q, k, v


def _attn_ops(out):
    return [n.op for n in out.nodes if n.op.kind == "attention"]


SYM = {"b": B, "s": S}


@pytest.mark.parametrize("form", ["scores_mul", "scores_div", "q_and_k", "q_only", "k_only"])
def test_every_scale_placement_becomes_one_scale(form):
    g = bz.Graph("a")
    q, k, v = _qkv(g)
    kt = g.transpose(k, (0, 1, 3, 2))
    c = 1 / np.sqrt(D)
    if form == "scores_mul":
        s = g.mul(g.matmul(q, kt), c)
    elif form == "scores_div":
        s = g.div(g.matmul(q, kt), float(np.sqrt(D)))
    elif form == "q_and_k":
        s = g.matmul(g.mul(q, float(np.sqrt(c))), g.mul(kt, float(np.sqrt(c))))
    elif form == "q_only":
        s = g.matmul(g.mul(q, 0.3), kt)
    else:
        s = g.matmul(q, g.mul(kt, 0.3))
    g.set_outputs([g.matmul(g.softmax(s, -1), v)])
    out, _ = canonicalize(g)
    (op,) = _attn_ops(out)
    assert op.mask is MaskKind.NONE
    assert op.scale == (None if form not in ("q_only", "k_only") else pytest.approx(0.3))
    assert out.count("matmul") == 0 and out.count("softmax") == 0
    check_same(g, out, symbols=SYM)


@pytest.mark.parametrize("export", [False, True])
def test_keys_a_transpose_made_for_the_scores_compose_with_the_transpose_back(export):
    """kt = transpose(k): the attention reads k itself, or (the export's [B, S, H, D] keys
    transposed to [B, H, D, S]) one transpose of them - never a transpose of a transpose left
    for ComposeTransposes."""
    g = bz.Graph("kt")
    q, k, v = _qkv(g)
    if export:
        k = g.input("k_rows", bz.Shape(("b", "s", H, D)))
    kt = g.transpose(k, (0, 2, 3, 1) if export else (0, 1, 3, 2))
    g.set_outputs([g.matmul(g.softmax(g.mul(g.matmul(q, kt), 0.5), -1), v)])
    out, _ = run_rules(g, CANONICALIZE_ATTENTION)
    (att,) = [n for n in out.nodes if n.op.kind == "attention"]
    k_in = out.nodes[att.inputs[1].node]
    if export:
        assert k_in.op.perm == (0, 2, 1, 3) and out.nodes[k_in.inputs[0].node].name == "k_rows"
    else:
        assert k_in.name == "k"
    assert out.count("transpose") == int(export)
    check_same(g, out, symbols=SYM)


def test_sdpa_export_form_with_additive_bool_mask_and_nan_guard():
    """TorchScript sdpa: k transposed straight from [B, S, H, D], sqrt scale on each side,
    where(mask, 0, -inf) added, softmax, where(isnan(p), 0, p)."""
    g = bz.Graph("sdpa")
    x = g.input("x", bz.Shape(("b", "s", H * D)))
    m = g.input("m", bz.Shape(("b", 1, "s", "s"), bz.bool_))
    heads = lambda t: g.reshape(t, ("b", "s", H, D))  # noqa: E731
    q = g.transpose(heads(x), (0, 2, 1, 3))
    kt = g.transpose(heads(g.exp(x)), (0, 2, 3, 1))
    v = g.transpose(heads(g.tanh(x)), (0, 2, 1, 3))
    c = float(D ** -0.25)
    s = g.matmul(g.mul(q, c), g.mul(kt, c))
    s = g.add(s, g.where(m, 0.0, -np.inf))
    p = g.softmax(s, -1)
    p = g.where(g.isnan(p), 0.0, p)
    g.set_outputs([g.matmul(p, v)])
    out, _ = canonicalize(g)
    (op,) = _attn_ops(out)
    assert op.mask is MaskKind.CUSTOM and op.scale is None
    assert out.count("isnan") == 0
    heads_t = [n.op.perm for n in out.nodes if n.op.kind == "transpose"]
    assert heads_t == [(0, 2, 1, 3)] * 3              # the key transpose folded into its split
    check_same(g, out, symbols=SYM)


@pytest.mark.parametrize("fill", [-np.inf, NEG])
def test_masked_fill_becomes_an_additive_mask(fill):
    g = bz.Graph("fill")
    q, k, v = _qkv(g)
    keep = g.input("keep", bz.Shape((1, 1, "s", "s"), bz.bool_))
    s = g.mul(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), 0.5)
    s = g.where(keep, s, fill)
    g.set_outputs([g.matmul(g.softmax(s, -1), v)])
    out, _ = canonicalize(g)
    (op,) = _attn_ops(out)
    assert op.mask is MaskKind.CUSTOM
    check_same(g, out, symbols=SYM)


def test_masked_fill_with_a_small_value_is_a_reported_miss():
    g = bz.Graph("fill")
    q, k, v = _qkv(g)
    keep = g.input("keep", bz.Shape((1, 1, "s", "s"), bz.bool_))
    s = g.where(keep, g.matmul(q, g.transpose(k, (0, 1, 3, 2))), -10000.0)
    g.set_outputs([g.matmul(g.softmax(s, -1), v)])
    out, misses = canonicalize(g)
    assert not _attn_ops(out)
    (miss,) = [m for m in misses if m.pattern == "CanonicalizeAttention"]
    assert "not far enough below" in miss.detail


def test_softmax_over_another_axis_is_a_reported_miss():
    g = bz.Graph("axis")
    q, k, v = _qkv(g)
    s = g.matmul(q, g.transpose(k, (0, 1, 3, 2)))
    g.set_outputs([g.matmul(g.softmax(s, 2), v)])
    out, misses = canonicalize(g)
    assert not _attn_ops(out)
    assert any(m.reason is bz.MissReason.AXIS_MISMATCH for m in misses)


def test_a_scale_that_is_not_a_constant_is_a_reported_miss():
    g = bz.Graph("scale")
    q, k, v = _qkv(g)
    t = g.input("t", bz.Shape((1,)))
    s = g.mul(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), t)
    g.set_outputs([g.matmul(g.softmax(s, -1), v)])
    out, misses = canonicalize(g)
    assert not _attn_ops(out)
    assert any("not a constant" in (m.detail or "") for m in misses)


def test_scores_that_are_also_an_output_stay_unfused():
    g = bz.Graph("out")
    q, k, v = _qkv(g)
    s = g.matmul(q, g.transpose(k, (0, 1, 3, 2)))
    g.set_outputs([g.matmul(g.softmax(s, -1), v), s])
    out, misses = canonicalize(g)
    assert not _attn_ops(out)
    assert any(m.reason is bz.MissReason.GRAPH_OUTPUT for m in misses)
    check_same(g, out, symbols=SYM)


def test_softcap_and_f32_casts():
    g = bz.Graph("cap")
    q, k, v = _qkv(g)
    s = g.mul(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), 0.3)
    s = g.mul(g.tanh(g.div(s, 30.0)), 30.0)
    s = g.cast(s, bz.f32)
    g.set_outputs([g.matmul(g.cast(g.softmax(s, -1), bz.f32), v)])
    out, _ = canonicalize(g)
    (op,) = _attn_ops(out)
    assert op.softcap == pytest.approx(30.0) and op.scale == pytest.approx(0.3)
    check_same(g, out, symbols=SYM)


def test_repeat_kv_folds_into_gqa_heads():
    g = bz.Graph("gqa")
    q, k, v = _qkv(g, heads=4, kv_heads=2)

    def repeat(t):
        t5 = g.reshape(t, ("b", 2, 1, "s", D))
        return g.reshape(g.expand(t5, ("b", 2, 2, "s", D)), ("b", 4, "s", D))

    s = g.mul(g.matmul(q, g.transpose(repeat(k), (0, 1, 3, 2))), 0.5)
    g.set_outputs([g.matmul(g.softmax(s, -1), repeat(v))])
    out, _ = run_rules(g, CANONICALIZE_ATTENTION)
    out, _ = run_rules(out, *LAYOUT_RULES, FOLD_REPEAT_KV)
    (att,) = [n for n in out.nodes if n.op.kind == "attention"]
    assert out.shape_of(att.inputs[1]).dims[1] == 2 and out.count("expand") == 0
    check_same(g, out, symbols=SYM)


def test_repeat_kv_fold_composes_with_the_reshape_that_added_the_axis():
    """k and v read what repeat_kv unsqueezed (no reshape of a reshape for ComposeReshapes to
    undo a sweep later); a [B, H, 1, S, D] not made by a reshape is reshaped once."""
    g = bz.Graph("gqa")
    q, k, _ = _qkv(g, heads=4, kv_heads=2)
    v5 = g.input("v5", bz.Shape(("b", 2, 1, "s", D)))

    def repeat(t5):
        return g.reshape(g.expand(t5, ("b", 2, 2, "s", D)), ("b", 4, "s", D))

    s = g.mul(g.matmul(q, g.transpose(repeat(g.reshape(k, ("b", 2, 1, "s", D))),
                                      (0, 1, 3, 2))), 0.5)
    g.set_outputs([g.matmul(g.softmax(s, -1), repeat(v5))])
    out, _ = run_rules(g, CANONICALIZE_ATTENTION, *LAYOUT_RULES)
    folded, _ = run_rules(out, FOLD_REPEAT_KV)  # no layout rules after it
    (att,) = [n for n in folded.nodes if n.op.kind == "attention"]
    k_in, v_in = (folded.nodes[x.node] for x in att.inputs[1:3])
    assert k_in.name == "k" and folded.count("expand") == 0
    assert v_in.op.kind == "reshape" and folded.nodes[v_in.inputs[0].node].name == "v5"
    assert folded.count("reshape") == 1
    check_same(g, folded, symbols=SYM)


@pytest.mark.parametrize("v_repeated", [True, False])
def test_grouped_keys_transposed_for_the_scores_become_one_reshape(v_repeated):
    """sdpa's GQA export: kt = reshape(transpose(expand(k5), swap the last two), [B, H, D, S]).
    The attention reads k as one reshape of the expand (no transpose left for the layout
    rules), or, when v is the same repeat_kv, both with the repeat folded (FoldRepeatKV's
    result, without a sweep for it)."""
    g = bz.Graph("gqa_kt")
    q, k, v = _qkv(g, heads=4, kv_heads=2)
    e = g.expand(g.reshape(k, ("b", 2, 1, "s", D)), ("b", 2, 2, "s", D))
    kt = g.reshape(g.transpose(e, (0, 1, 2, 4, 3)), ("b", 4, D, "s"))
    if v_repeated:
        v = g.reshape(g.expand(g.reshape(v, ("b", 2, 1, "s", D)), ("b", 2, 2, "s", D)),
                      ("b", 4, "s", D))
    else:
        v = g.input("v_heads", bz.Shape(("b", 4, "s", D)))
    g.set_outputs([g.matmul(g.softmax(g.mul(g.matmul(q, kt), 0.5), -1), v)])
    out, _ = run_rules(g, CANONICALIZE_ATTENTION)
    (att,) = [n for n in out.nodes if n.op.kind == "attention"]
    k_in, v_in = (out.nodes[x.node] for x in att.inputs[1:3])
    assert out.count("transpose") == 0
    if v_repeated:
        assert (k_in.name, v_in.name) == ("k", "v") and out.count("expand") == 0
    else:
        assert k_in.op.kind == "reshape" and out.nodes[k_in.inputs[0].node].op.kind == "expand"
        assert v_in.name == "v_heads"
    check_same(g, out, symbols=SYM)


def test_an_expand_that_also_broadcasts_the_keys_is_not_a_repeat_kv():
    """k5 [B, 2, 1, 1, D] expanded to [B, 2, 2, S, D] copies one key along the sequence too:
    not a per-head repeat, so the kv heads stay expanded."""
    g = bz.Graph("not_gqa")
    q, _, v = _qkv(g, heads=4, kv_heads=2)
    k1 = g.input("k1", bz.Shape(("b", 2, 1, 1, D)))
    k = g.reshape(g.expand(k1, ("b", 2, 2, "s", D)), ("b", 4, "s", D))
    v4 = g.reshape(g.expand(g.reshape(v, ("b", 2, 1, "s", D)), ("b", 2, 2, "s", D)),
                   ("b", 4, "s", D))
    s = g.mul(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), 0.5)
    g.set_outputs([g.matmul(g.softmax(s, -1), v4)])
    out, _ = run_rules(g, CANONICALIZE_ATTENTION)
    out, _ = run_rules(out, *LAYOUT_RULES, FOLD_REPEAT_KV)
    (att,) = [n for n in out.nodes if n.op.kind == "attention"]
    assert out.shape_of(att.inputs[1]).dims[1] == 4 and out.count("expand") == 2
    check_same(g, out, symbols=SYM)


def _causal_table(g, kind):
    """A dims-only causal mask, additive: built from ranges + compare, or from trilu."""
    if kind == "range":
        i = g.reshape(g.arange("s"), ("s", 1))
        j = g.reshape(g.arange("s"), (1, "s"))
        ok = g.le(j, i)
    else:
        ones = g.expand(g.constant(np.float32(1.0)), ("s", "s"))
        ok = g.gt(g.trilu(ones, upper=False), 0.0)
    return g.reshape(g.where(ok, 0.0, NEG), (1, 1, "s", "s"))


@pytest.mark.parametrize("kind", ["range", "trilu"])
def test_causal_masks_built_from_dims_become_the_causal_kind(kind):
    g = bz.Graph("causal")
    q, k, v = _qkv(g)
    s = g.add(g.mul(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), 0.5), _causal_table(g, kind))
    g.set_outputs([g.matmul(g.softmax(s, -1), v)])
    out, _ = canonicalize(g)
    (op,) = _attn_ops(out)
    assert op.mask is MaskKind.CAUSAL
    assert out.count("where") == 0 and out.count("range") == 0
    check_same(g, out, symbols=SYM)


def test_sliding_window_mask_is_recognized_with_its_window():
    g = bz.Graph("window")
    q, k, v = _qkv(g)
    i = g.reshape(g.arange("s"), ("s", 1))
    j = g.reshape(g.arange("s"), (1, "s"))
    ok = g.logical_and(g.le(j, i), g.gt(j, g.sub(i, g.constant(np.int64(2)))))
    mask = g.reshape(g.where(ok, 0.0, NEG), (1, 1, "s", "s"))
    s = g.add(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), mask)
    g.set_outputs([g.matmul(g.softmax(s, -1), v)])
    out, _ = canonicalize(g)
    (op,) = _attn_ops(out)
    assert op.mask is MaskKind.SLIDING_WINDOW and op.window == 2
    check_same(g, out, symbols={"b": B, "s": 7})


@pytest.mark.parametrize("window, kind", [(5, MaskKind.SLIDING_WINDOW),
                                          (20, MaskKind.SLIDING_WINDOW),
                                          (300, MaskKind.CUSTOM)])
def test_a_window_wider_than_the_probed_lengths_is_not_taken_for_causal(window, kind):
    """A 20-key window looks causal at lengths up to 20: it was taken for causal (wrong past 20
    keys); probes now start past the mask's integer constants, and a window too wide to
    probe stays a CUSTOM mask."""
    g = bz.Graph("wide_window")
    q, k, v = _qkv(g)
    i = g.reshape(g.arange("s"), ("s", 1))
    j = g.reshape(g.arange("s"), (1, "s"))
    ok = g.logical_and(g.le(j, i), g.gt(j, g.sub(i, g.constant(np.int64(window)))))
    mask = g.reshape(g.where(ok, 0.0, NEG), (1, 1, "s", "s"))
    g.set_outputs([g.matmul(g.softmax(g.add(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), mask),
                                      -1), v)])
    out, _ = canonicalize(g)
    (op,) = _attn_ops(out)
    assert op.mask is kind and op.window == (window if kind is MaskKind.SLIDING_WINDOW else 0)
    check_same(g, out, symbols={"b": B, "s": 40})


def test_a_mask_that_reads_data_stays_custom():
    g = bz.Graph("pad")
    q, k, v = _qkv(g)
    pad = g.input("pad", bz.Shape(("b", 1, 1, "s"), bz.bool_))
    i = g.reshape(g.arange("s"), ("s", 1))
    j = g.reshape(g.arange("s"), (1, "s"))
    ok = g.logical_and(g.le(j, i), pad)               # causal and padding: depends on data
    s = g.add(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), g.where(ok, 0.0, NEG))
    g.set_outputs([g.matmul(g.softmax(s, -1), v)])
    out, _ = canonicalize(g)
    (op,) = _attn_ops(out)
    assert op.mask is MaskKind.CUSTOM
    check_same(g, out, symbols=SYM)


def test_a_learned_bias_becomes_the_bias_kind():
    g = bz.Graph("bias")
    q, k, v = (g.input(n, bz.Shape((B, H, S, D))) for n in "qkv")
    table = g.param("rel_bias", bz.Shape((H, S, S)))
    s = g.add(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), g.reshape(table, (1, H, S, S)))
    g.set_outputs([g.matmul(g.softmax(s, -1), v)])
    out, _ = canonicalize(g)
    (op,) = _attn_ops(out)
    assert op.mask is MaskKind.BIAS and op.scale == 1.0
    check_same(g, out, symbols={"b": B, "s": S})


def _rope_tables(g):
    cos = g.input("cos", bz.Shape(("s", D // 2)))
    sin = g.input("sin", bz.Shape(("s", D // 2)))
    return cos, sin


@pytest.mark.parametrize("reads_elsewhere", [False, True])
def test_a_scale_under_a_rope_folds_into_the_attention_scale(reads_elsewhere):
    """ESM scales q before rotating it: rope(q * c) = rope(q) * c, so c moves into the score
    scale and the attention reads rope(q) (the head split it came from, for the block fusion).
    A scaled q that something else reads keeps its scale."""
    g = bz.Graph("esm")
    q, k, v = _qkv(g)
    cos, sin = _rope_tables(g)
    scaled = g.mul(q, 0.3)
    qr, kr = g.rope(scaled, cos, sin), g.rope(k, cos, sin)
    s = g.matmul(qr, g.transpose(kr, (0, 1, 3, 2)))
    outs = [g.matmul(g.softmax(s, -1), v)] + ([g.add(scaled, 1.0)] if reads_elsewhere else [])
    g.set_outputs(outs)
    out, _ = canonicalize(g)
    (node,) = [n for n in out.nodes if n.op.kind == "attention"]
    q_rope = out.nodes[node.inputs[0].node]
    assert q_rope.op.kind == "rope"
    if reads_elsewhere:
        assert node.op.scale == 1.0 and out.nodes[q_rope.inputs[0].node].op.fn is BinaryFn.MUL
    else:
        assert node.op.scale == pytest.approx(0.3) and q_rope.inputs[0] == out.inputs[0].value
    check_same(g, out, symbols=SYM)


def test_a_bf16_score_scale_is_a_constant():
    """A bf16 model (`model.to(torch.bfloat16)`) scales its scores by a bfloat16 constant
    (NumPy kind "V", not "f"): it is read as the scale, not reported as a computed value."""
    g = bz.Graph("a_bf16")
    q, k, v = (g.input(n, bz.Shape(("b", H, "s", D), bz.bf16)) for n in "qkv")
    s = g.mul(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), 0.25)
    g.set_outputs([g.matmul(g.softmax(s, -1), v)])
    out, misses = canonicalize(g)
    (op,) = _attn_ops(out)
    assert op.scale == 0.25 and not misses
