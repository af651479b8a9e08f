"""FuseAttentionBlock's pattern skips work by guards (the root projects merged heads, the
one-projection form has a Narrow up q's chain, a q/k norm is a norm op): each guard is a
necessary condition, so at every node of every test graph a guarded sub-pattern matches
exactly what the sub-pattern alone matches."""
import pytest
from test_fuse_attention_qk_norm import qk_norm_graph

import braze as bz
from braze.models import bert_encoder, gpt2_blocks, llama_decoder
from braze.passes.fusion import attention_block
from braze.passes.pipeline import compile_pipeline
from braze.rewrite import Alt, Guarded, Pat, RewriteContext


def fused_qkv_rope_norm_graph():
    """One projection narrowed to q, k, v, with q and k normalized per head and rotated: the
    longest chain from q up to its Narrow (rope, transpose, norm, reshape, narrow)."""
    g = bz.Graph("fused_rope_norm")
    s, e, h, d = 6, 32, 4, 8
    x = g.input("x", bz.Shape((2, s, e)))
    cos, sin = (g.input(n, bz.Shape((s, d // 2))) for n in ("cos", "sin"))
    qkv = g.mm(x, g.param("w_qkv", bz.Shape((e, 3 * h * d))))
    t = {}
    for i, r in enumerate("qkv"):
        p = g.reshape(g.narrow(qkv, 2, i * h * d, h * d), (2, s, h, d))
        if r != "v":
            p = g.rms_norm(p, g.param(f"{r}_gamma", bz.Shape((d,))))
        t[r] = g.transpose(p, (0, 2, 1, 3))
        if r != "v":
            t[r] = g.rope(t[r], cos, sin)
    o = g.attention(t["q"], t["k"], t["v"], kind="causal")
    g.set_outputs([g.mm(g.reshape(g.transpose(o, (0, 2, 1, 3)), (2, s, h * d)),
                        g.param("w_o", bz.Shape((h * d, e))))])
    return g


GRAPHS = {
    "fused_qkv_rope_norm": fused_qkv_rope_norm_graph,
    "bert_separate_qkv": lambda: bert_encoder(2, 32, 2, seq=5),
    "bert_fused_qkv": lambda: bert_encoder(2, 32, 2, seq=5, qkv="fused"),
    "bert_mask": lambda: bert_encoder(1, 32, 2, batch="batch", seq="seq", with_mask=True),
    "gpt2_causal": lambda: gpt2_blocks(2, 32, 2, seq=6),
    "llama_gqa_rope": lambda: llama_decoder(2, 32, 4, 2, seq=6),
    "qk_norm_per_head": lambda: qk_norm_graph(),
    "qk_norm_after_transpose": lambda: qk_norm_graph(after_transpose=True),
    "qk_norm_whole_projection": lambda: qk_norm_graph(per_head=False, kind="layer", beta=True),
    "qk_norm_of_q_only": lambda: qk_norm_graph(roles="q"),
}


def _guards(pattern, found):
    """Every guarded sub-pattern under `pattern` (each once)."""
    if isinstance(pattern, Guarded):
        if all(pattern is not f for f in found):
            found.append(pattern)
        _guards(pattern.inner, found)
    elif isinstance(pattern, Alt):
        for p in pattern.options:
            _guards(p, found)
    elif isinstance(pattern, Pat):
        for p in pattern.inputs or ():
            _guards(p, found)
    return found


def _stage_graphs(build):
    """The graph as the pipeline hands it to FuseAttentionBlock, and as built."""
    g = build()
    cur, pipeline = g, compile_pipeline("cpu")
    ctx = RewriteContext(target=pipeline.target, options=pipeline.options)
    for p in pipeline.passes:
        if p.name == "FuseAttentionBlock":
            return [g, cur]
        cur = p.run(cur, ctx).graph
    raise AssertionError("the cpu pipeline has no FuseAttentionBlock")


def _matches(it):
    return [(consumed, sorted((k, getattr(x, "id", x)) for k, x in b.items()))
            for b, consumed in it]


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_guards_only_skip_nodes_without_a_match(name):
    guards = _guards(attention_block.FUSE_ATTENTION_BLOCK.pattern, [])
    assert len(guards) >= 3  # the root, the one-projection form, the q/k norms
    matched = 0
    for g in _stage_graphs(GRAPHS[name]):
        for node in g.nodes:
            for guard in guards:
                want = _matches(guard.inner.match_node(g, node, {}, ()))
                assert _matches(guard.match_node(g, node, {}, ())) == want, node.label
                matched += bool(want)
    assert matched  # the guarded parts do match somewhere in these graphs
