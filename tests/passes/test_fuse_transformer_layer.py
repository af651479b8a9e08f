"""FuseTransformerLayer: after the attention block, SwiGLU, residual norm and matmul-bias-act
fusions, whole post-norm (BERT) and pre-norm (GPT-2, LLaMA) layers fuse into one node each,
refusals carry reasons, and the numbers hold through fuse -> unfuse."""
import pytest

import braze as bz
from braze.ir.ops.fused import LayerStyle, MlpKind, NormKind
from braze.models import bert_encoder, gpt2_blocks, llama_decoder
from braze.passes.base import RulePass, run_passes
from braze.passes.cleanup import dead_code_elimination
from braze.passes.fusion import attention_block, matmul_bias_act, residual_norm, swiglu
from braze.passes.fusion.transformer_layer import RULES
from braze.passes.targets import TARGETS
from braze.passes.unfuse import unfuse_fused_for_autodiff
from braze.rewrite import MissReason, RewriteContext
from braze.testing import assert_equivalent

CPU = RewriteContext(target=TARGETS["cpu"])
BEFORE = [RulePass("FuseAttentionBlock", attention_block.RULES),
          RulePass("FuseSwiGLU", swiglu.RULES),
          RulePass("FuseResidualNorm", residual_norm.RULES),
          RulePass("FuseMatMulBiasAct", matmul_bias_act.RULES)]
SYMBOLS = {"batch": 2, "seq": 5}


def prefuse(g, ctx=CPU):
    out, _ = run_passes(g, BEFORE, ctx)
    return out


def fuse(g, ctx=CPU):
    """The other fusions, then the layer pass; returns the layer pass's result, DCE'd graph."""
    res = RulePass("FuseTransformerLayer", RULES).run(prefuse(g, ctx), ctx)
    res.graph, _ = dead_code_elimination(res.graph)
    return res


def layers(g):
    return [n.op for n in g.nodes if n.op.kind == "fused_transformer_layer"]


def reasons(res):
    return {m.reason for m in res.misses if m.pattern == "FuseTransformerLayer"}


def pre_norm_graph(n_layers=2, mlp="gelu", rms=False, eps=(1e-5, 1e-5), final_norm=True):
    """Hand-built pre-norm layers (GPT-2 / LLaMA shape) on x [2, 5, 16], 2 heads, causal."""
    g = bz.Graph("pre_norm")
    e, f = 16, 24
    x = g.input("x", bz.Shape((2, 5, e)))
    norm = g.rms_norm if rms else g.layer_norm

    def p(name, *dims):
        return g.param(name, bz.Shape(dims))

    for i in range(n_layers):
        h = norm(x, p(f"l{i}.n1", e), eps=eps[0])
        qkv = g.add(g.mm(h, p(f"l{i}.wqkv", e, 3 * e)), p(f"l{i}.bqkv", 3 * e))
        q, k, v = (g.transpose(g.reshape(g.narrow(qkv, -1, j * e, e), (2, 5, 2, 8)),
                               (0, 2, 1, 3)) for j in range(3))
        ctx = g.reshape(g.transpose(g.attention(q, k, v, kind="causal"), (0, 2, 1, 3)),
                        (2, 5, e))
        x = g.add(x, g.mm(ctx, p(f"l{i}.wo", e, e)))
        h = norm(x, p(f"l{i}.n2", e), eps=eps[1])
        if mlp == "swiglu":
            y = g.fused_swiglu_ffn(h, p(f"l{i}.wgu", e, 2 * f), p(f"l{i}.wd", f, e))
        elif mlp == "swiglu_up_first":
            up_gate = g.mm(h, p(f"l{i}.wgu", e, 2 * f))
            y = g.mm(g.fused_swiglu(up_gate, gate_first=False), p(f"l{i}.wd", f, e))
        else:
            up = g.activation(g.add(g.mm(h, p(f"l{i}.w1", e, f)), p(f"l{i}.b1", f)), mlp)
            y = g.add(g.mm(up, p(f"l{i}.w2", f, e)), p(f"l{i}.b2", e))
        x = g.add(x, y)
    g.set_outputs([norm(x, p("final", e)) if final_norm else x])
    return g


MODELS = {
    "bert_separate_qkv": (lambda: bert_encoder(2, 32, 2, seq=5), 2),
    "bert_fused_qkv": (lambda: bert_encoder(2, 32, 2, seq=5, qkv="fused"), 2),
    "bert_mask_symbolic": (lambda: bert_encoder(2, 32, 2, batch="batch", seq="seq",
                                                with_mask=True), 2),
    "gpt2": (lambda: gpt2_blocks(3, 32, 2, seq=6), 3),
    "llama": (lambda: llama_decoder(3, 32, 4, 2, seq=6), 3),
}


@pytest.mark.parametrize("name", MODELS)
def test_whole_layers_fuse_on_reference_models(name):
    build, n = MODELS[name]
    g = build()
    res = fuse(g)
    c = res.graph.op_counts()
    assert c["fused_transformer_layer"] == res.stats["FuseTransformerLayer"].matches == n
    assert set(c) <= {"fused_transformer_layer", "concat", "layer_norm", "rms_norm"}
    assert c.get("layer_norm", 0) + c.get("rms_norm", 0) == (0 if name.startswith("bert") else 1)
    assert not res.misses
    assert_equivalent(g, res.graph, symbols=SYMBOLS)


def test_layer_attributes_follow_the_model():
    (bert, *_) = layers(fuse(bert_encoder(2, 32, 2, seq=5)).graph)
    assert (bert.style, bert.norm, bert.mlp, bert.eps) == (
        LayerStyle.POST_NORM, NormKind.LAYER, MlpKind.GELU, 1e-12)
    assert bert.has_mlp_bias and bert.has_norm_beta
    (gpt2, *_) = layers(fuse(gpt2_blocks(2, 32, 2, seq=6)).graph)
    assert (gpt2.style, gpt2.mlp) == (LayerStyle.PRE_NORM, MlpKind.GELU_APPROX)
    (llama, *_) = layers(fuse(llama_decoder(2, 32, 4, 2, seq=6)).graph)
    assert (llama.style, llama.norm, llama.mlp) == (LayerStyle.PRE_NORM, NormKind.RMS,
                                                    MlpKind.SWIGLU)
    assert not llama.has_mlp_bias and not llama.has_norm_beta and llama.attn.num_kv_heads == 2


@pytest.mark.parametrize("mlp,rms,final_norm", [
    ("relu", False, True), ("gelu", True, False), ("swiglu", True, True),
    ("swiglu_up_first", True, True),
])
def test_pre_norm_variants(mlp, rms, final_norm):
    g = pre_norm_graph(3, mlp, rms, final_norm=final_norm)
    res = fuse(g)
    assert len(layers(res.graph)) == 3 and not res.misses
    assert res.graph.count("attention") == res.graph.count("matmul") == 0
    assert_equivalent(g, res.graph)


def test_input_graph_is_not_mutated():
    g = prefuse(bert_encoder(1, 32, 2, seq=5))
    before = str(g)
    RulePass("FuseTransformerLayer", RULES).run(g, CPU)
    assert str(g) == before


# -- must not fire ------------------------------------------------------------------------------
def test_norms_with_different_eps():
    res = fuse(pre_norm_graph(1, eps=(1e-5, 1e-6)))
    assert not layers(res.graph) and reasons(res) == {MissReason.PATTERN_MISMATCH}
    assert any("eps" in m.detail for m in res.misses)


def test_mlp_activation_the_layer_cannot_express():
    g = pre_norm_graph(1, mlp="silu")
    res = fuse(g)
    assert not layers(res.graph) and reasons(res) == {MissReason.PATTERN_MISMATCH}
    assert any("silu" in m.detail for m in res.misses)
    assert_equivalent(g, res.graph)


def test_interior_graph_output_is_never_fused_away():
    g = prefuse(bert_encoder(1, 32, 2, seq=5))
    h = next(n for n in g.nodes if n.op.kind == "fused_residual_ln").value
    g.set_outputs(list(g.outputs) + [h])
    res = RulePass("FuseTransformerLayer", RULES).run(g, CPU)
    assert not layers(res.graph) and MissReason.GRAPH_OUTPUT in reasons(res)


def test_primitive_mlp_fuses_and_unfused_residual_norm_is_explained():
    g = bert_encoder(1, 32, 2, seq=5)
    pre, _ = run_passes(g, BEFORE[:3], CPU)  # no matmul-bias-act: the MLP stays primitive
    res = RulePass("FuseTransformerLayer", RULES).run(pre, CPU)
    assert len(layers(res.graph)) == 1  # primitive MLPs fuse too
    bare = run_passes(g, BEFORE[:1], CPU)[0]  # no residual norm fusion
    res = RulePass("FuseTransformerLayer", RULES).run(bare, CPU)
    (miss,) = res.misses
    assert miss.reason is MissReason.PATTERN_MISMATCH and "residual norm" in miss.hint


def test_target_without_the_claim():
    target = TARGETS["cpu"].with_options(claims=TARGETS["cpu"].claims - {
        "fused_transformer_layer"})
    res = fuse(bert_encoder(1, 32, 2, seq=5), RewriteContext(target=target))
    assert not layers(res.graph) and reasons(res) == {MissReason.UNSUPPORTED_BY_TARGET}


# -- round trip ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["bert_mask_symbolic", "gpt2", "llama"])
def test_fuse_unfuse_round_trip(name):
    g = MODELS[name][0]()
    fused, results = run_passes(prefuse(g), [RulePass("FuseTransformerLayer", RULES)], CPU,
                                verify=True)
    assert results[0].changed
    plain = unfuse_fused_for_autodiff(fused)
    assert not any(n.op.fused for n in plain.nodes)
    assert plain.count("attention") == g.count("attention")
    assert_equivalent(g, plain, symbols=SYMBOLS)
