"""FuseAttentionBlock: fires on BERT (separate or fused QKV, mask input, symbolic batch/seq),
GPT-2 (causal) and LLaMA (GQA + rope) attention, refuses with a reason where the subgraph is
not one self-attention block, and keeps the numbers through fuse -> unfuse."""
import numpy as np
import pytest

import braze as bz
from braze.ir.ops.attention import MaskKind
from braze.ir.ops.fused import RopeMode
from braze.models import bert_encoder, gpt2_blocks, llama_decoder
from braze.passes.base import RulePass, run_passes
from braze.passes.cleanup import dead_code_elimination
from braze.passes.fusion import matmul_bias_act, shared_matmul
from braze.passes.fusion.attention_block import RULES
from braze.passes.targets import TARGETS
from braze.passes.unfuse import unfuse_fused_for_autodiff
from braze.rewrite import MissReason, RewriteContext
from braze.testing import assert_equivalent

CPU = RewriteContext(target=TARGETS["cpu"])


def fuse(g, ctx=CPU):
    return RulePass("FuseAttentionBlock", RULES).run(g, ctx)


def blocks(g):
    return [n for n in g.nodes if n.op.kind == "fused_attention_block"]


def reasons(res):
    return {m.reason for m in res.misses if m.pattern == "FuseAttentionBlock"}


def attn_graph(*, fused_qkv=False, bias=(True, True, True), out_bias=True, heads=4, kv_heads=4,
               dim=8, seq=6, rope=None, mask=None, attn_kw=None, x_for=None, split_perm=None,
               starts=None, outputs=(), v_op=None, past=0, kv_order="past_first"):
    """One hand-built attention block on x [2, seq, 32]; keyword knobs bend one part of it."""
    g = bz.Graph("attn")
    e = 32
    x = g.input("x", bz.Shape((2, seq, e)))
    xs = {r: x for r in "qkv"}
    if x_for:
        xs[x_for] = g.input("x2", bz.Shape((2, seq, e)))
    widths = {"q": heads * dim, "k": kv_heads * dim, "v": kv_heads * dim}
    if fused_qkv:
        total = sum(widths.values())
        qkv = g.mm(x, g.param("w_qkv", bz.Shape((e, total))))
        if bias[0]:
            qkv = g.add(qkv, g.param("b_qkv", bz.Shape((total,))))
        st = starts or {"q": 0, "k": widths["q"], "v": widths["q"] + widths["k"]}
        proj = {r: g.narrow(qkv, -1, st[r], widths[r]) for r in "qkv"}
    else:
        proj = {}
        for r, has_b in zip("qkv", bias):
            p = g.mm(xs[r], g.param(f"w_{r}", bz.Shape((e, widths[r]))))
            proj[r] = g.add(p, g.param(f"b_{r}", bz.Shape((widths[r],)))) if has_b else p
    hs = {"q": heads, "k": kv_heads, "v": kv_heads}
    t = {r: g.transpose(g.reshape(proj[r], (2, seq, hs[r], dim)),
                        (split_perm or {}).get(r, (0, 2, 1, 3))) for r in "qkv"}
    if v_op is not None:
        t["v"] = v_op(g, t["v"])
    if rope is not None:
        n_rot, interleaved, rotate, tables = rope
        made = {}
        for r in rotate:
            tag = tables[r]
            if tag not in made:
                made[tag] = [g.input(f"{f}{tag}", bz.Shape((seq, n_rot // 2)))
                             for f in ("cos", "sin")]
            t[r] = g.rope(t[r], *made[tag], interleaved=interleaved, n_rot=n_rot)
    for r in "kv" if past else "":  # a KV cache: past keys / values before the new ones
        parts = [g.input(f"past_{r}", bz.Shape((2, kv_heads, past, dim))), t[r]]
        t[r] = g.concat(parts if kv_order == "past_first" else parts[::-1], 2)
    takes = mask in ("custom", "bias")
    m = g.input("mask", bz.Shape((2, 1, 1, seq))) if takes else None
    ctx = g.attention(t["q"], t["k"], t["v"], m, kind=mask, **(attn_kw or {}))
    y = g.mm(g.reshape(g.transpose(ctx, (0, 2, 1, 3)), (2, seq, heads * dim)),
             g.param("w_o", bz.Shape((heads * dim, e))))
    if out_bias:
        y = g.add(y, g.param("b_o", bz.Shape((e,))))
    extra = {"q": lambda: t["q"], "ctx": lambda: ctx, "q_reused": lambda: g.mul(t["q"], 2.0)}
    g.set_outputs([y] + [extra[o]() for o in outputs])
    return g


MODELS = {
    "bert_separate_qkv": (lambda: bert_encoder(2, 32, 2, seq=5), 2),
    "bert_fused_qkv": (lambda: bert_encoder(2, 32, 2, seq=5, qkv="fused"), 2),
    "bert_mask_symbolic": (lambda: bert_encoder(1, 32, 2, batch="batch", seq="seq",
                                                with_mask=True), 1),
    "gpt2_causal": (lambda: gpt2_blocks(2, 32, 2, seq=6), 2),
    "llama_gqa_rope": (lambda: llama_decoder(2, 32, 4, 2, seq=6), 2),
    "llama_symbolic_seq": (lambda: llama_decoder(1, 32, 4, 1, seq="seq"), 1),
}


@pytest.mark.parametrize("name", MODELS)
def test_fires_on_reference_models(name):
    build, layers = MODELS[name]
    g = build()
    res = fuse(g)
    c = res.graph.op_counts()
    assert c["fused_attention_block"] == res.stats["FuseAttentionBlock"].matches == layers
    assert not any(c.get(k) for k in ("attention", "rope", "transpose", "reshape", "narrow"))
    assert not res.misses
    assert_equivalent(g, res.graph, symbols={"batch": 2, "seq": 5})


def test_attributes_follow_the_model():
    bert = blocks(fuse(bert_encoder(1, 32, 2, seq=5, with_mask=True)).graph)[0].op
    assert (bert.num_heads, bert.num_kv_heads, bert.head_dim) == (2, 2, 16)
    assert bert.mask is MaskKind.CUSTOM and bert.has_qkv_bias and bert.has_out_bias
    llama = blocks(fuse(llama_decoder(1, 32, 4, 2, seq=6)).graph)[0].op
    assert (llama.num_heads, llama.num_kv_heads, llama.rope) == (4, 2, RopeMode.ROTATE_HALF)
    assert llama.mask is MaskKind.CAUSAL and not llama.has_qkv_bias
    assert not llama.has_out_bias and llama.input_roles()[-2:] == ("cos", "sin")


def test_mask_graph_input_feeds_the_block():
    g = bert_encoder(1, 32, 2, seq=5, with_mask=True)
    res = fuse(g)
    (node,) = blocks(res.graph)
    roles = dict(zip(node.op.input_roles(), node.inputs))
    assert res.graph.nodes[roles["mask"].node].name == "mask"
    assert_equivalent(g, res.graph)


def test_rope_window_softcap_scale_and_partial_interleaved_rope():
    g = attn_graph(heads=4, kv_heads=2, rope=(4, True, "qk", {"q": "", "k": ""}),
                   mask="sliding_window", attn_kw={"window": 3, "softcap": 5.0, "scale": 0.3})
    res = fuse(g)
    (node,) = blocks(res.graph)
    op = node.op
    assert (op.rope, op.n_rot, op.window, op.softcap, op.scale) == (
        RopeMode.INTERLEAVED, 4, 3, 5.0, 0.3)
    assert op.mask is MaskKind.SLIDING_WINDOW and op.num_kv_heads == 2
    assert_equivalent(g, res.graph)


def test_additive_bias_mask_with_multi_query_heads():
    g = attn_graph(fused_qkv=True, kv_heads=1, mask="bias")
    res = fuse(g)
    (node,) = blocks(res.graph)
    assert node.op.mask is MaskKind.BIAS and node.op.num_kv_heads == 1
    assert node.op.input_roles()[-1] == "mask"
    assert_equivalent(g, res.graph)


@pytest.mark.parametrize("bias", [(True, False, True), (False, False, False)])
def test_separate_projections_with_some_or_no_biases(bias):
    g = attn_graph(bias=bias, out_bias=False)
    res = fuse(g)
    (node,) = blocks(res.graph)
    assert node.op.has_qkv_bias == any(bias) and not node.op.has_out_bias
    assert_equivalent(g, res.graph)


def test_stored_weights_are_joined_once_into_a_param():
    g = bert_encoder(1, 32, 2, seq=5, seed=3)
    res = fuse(g)
    assert "concat" not in res.graph.op_counts()
    joined = [n.op.name for n in res.graph.params if "|" in n.op.name]
    assert len(joined) == 2 and all(n in res.graph.weights for n in joined)
    live, _ = dead_code_elimination(res.graph)
    assert {n.op.name for n in live.params} & {"layer0.attn.q.weight", "layer0.attn.v.bias"} \
        == set()
    assert_equivalent(g, res.graph)


def test_fires_after_shared_input_and_matmul_bias_act_fusion():
    g = bert_encoder(2, 32, 2, seq=5)
    for first in (shared_matmul.RULES, matmul_bias_act.RULES):
        pre, _ = run_passes(g, [RulePass("first", first)], CPU)
        res = fuse(pre)
        assert res.graph.count("fused_attention_block") == 2, first
        assert not any(res.graph.count(k) for k in ("attention", "narrow", "transpose"))
        assert_equivalent(g, res.graph)


def test_input_graph_is_not_mutated():
    g = attn_graph()
    before = str(g)
    fuse(g)
    assert str(g) == before


# -- must not fire ------------------------------------------------------------------------------
def test_projections_of_different_inputs():
    res = fuse(attn_graph(x_for="k"))
    assert not blocks(res.graph) and reasons(res) == {MissReason.NOT_SHARED_INPUT}


def test_head_transpose_that_is_not_the_split():
    g = attn_graph(seq=8, split_perm={"k": (0, 2, 3, 1)})  # [B, H, D, S]: k pre-transposed
    res = fuse(g)
    assert not blocks(res.graph) and reasons(res) == {MissReason.PATTERN_MISMATCH}
    assert any("split_k" in m.detail for m in res.misses)


@pytest.mark.parametrize("bias", [(True, True, True), (False, False, False)])
def test_explanation_names_the_role_that_breaks_the_block(bias):
    """A biased q projection is a projection: the miss names v's extra op, not q's bias add."""
    res = fuse(attn_graph(bias=bias, v_op=lambda g, v: g.relu(v)))
    (miss,) = [m for m in res.misses if m.pattern == "FuseAttentionBlock"]
    assert miss.reason is MissReason.PATTERN_MISMATCH and miss.detail.startswith("v is ")
    assert "relu" in miss.detail


def test_narrows_out_of_order():
    g = attn_graph(fused_qkv=True, starts={"q": 32, "k": 0, "v": 64})
    res = fuse(g)
    assert not blocks(res.graph) and reasons(res) == {MissReason.SHAPE_MISMATCH}
    assert_equivalent(g, res.graph)


@pytest.mark.parametrize("rope,detail", [
    ((8, False, "q", {"q": ""}), "only q"),
    ((8, False, "qk", {"q": "", "k": "_k"}), "different cos"),
])
def test_rope_not_shared_by_q_and_k(rope, detail):
    res = fuse(attn_graph(rope=rope))
    assert not blocks(res.graph) and reasons(res) == {MissReason.PATTERN_MISMATCH}
    assert any(detail in m.detail for m in res.misses)


@pytest.mark.parametrize("out", ["q", "ctx"])
def test_interior_graph_output_is_never_fused_away(out):
    g = attn_graph(outputs=(out,))
    res = fuse(g)
    assert not blocks(res.graph) and MissReason.GRAPH_OUTPUT in reasons(res)
    assert_equivalent(g, res.graph)


def test_interior_value_read_elsewhere():
    res = fuse(attn_graph(outputs=("q_reused",)))
    assert not blocks(res.graph) and MissReason.MULTI_CONSUMER in reasons(res)
    assert any("mul" in m.detail for m in res.misses)


def test_kv_cache_after_the_new_keys_is_explained_past_the_concat():
    """A cache appended after the new keys (concat(new, past)) is no decode step: the miss looks
    through the concat and names its first input, not q's biased projection (q @ w + b is what
    the block reads; the explanation had taken only `add` kinds for a bias)."""
    g = attn_graph(fused_qkv=True, past=3, kv_order="new_first")
    res = fuse(g)
    assert not blocks(res.graph) and reasons(res) == {MissReason.PATTERN_MISMATCH}
    (miss,) = res.misses
    assert miss.detail.startswith("k is") and "past_k" in miss.detail, miss.detail
    assert_equivalent(g, res.graph)


def test_target_without_the_claim():
    res = fuse(attn_graph(), RewriteContext(target=TARGETS["cpu"].with_options(
        claims=frozenset({"fused_matmul_bias_act"}))))
    assert not res.changed and reasons(res) == {MissReason.UNSUPPORTED_BY_TARGET}


def test_bare_attention_is_explained():
    g = bz.Graph("bare")
    q = g.input("q", bz.Shape((1, 2, 4, 8)))
    g.set_outputs([g.attention(q, q, q)])
    res = fuse(g)
    (miss,) = res.misses
    assert miss.reason is MissReason.PATTERN_MISMATCH and "merged" in miss.detail


# -- round trip ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["bert_separate_qkv", "llama_gqa_rope", "bert_mask_symbolic"])
def test_fuse_unfuse_round_trip(name):
    g = MODELS[name][0]()
    fused, results = run_passes(g, [RulePass("FuseAttentionBlock", RULES)], CPU, verify=True)
    assert results[0].changed
    plain = unfuse_fused_for_autodiff(fused)
    assert plain.count("fused_attention_block") == 0 and plain.count("attention") >= 1
    assert_equivalent(g, plain, symbols={"batch": 2, "seq": 5})
    np.testing.assert_equal(plain.count("matmul"), g.count("matmul") - 2 * g.count("attention"))
