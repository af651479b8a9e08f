"""The default pipeline on the builtin models: the fused counts the issue promises, and outputs
equal to the unfused graph (rtol 1e-5 in float32), plus fuse -> unfuse for every model builder."""
import pytest

import braze as bz
import braze.rewrite
from braze.models import (
    bert_base,
    bert_encoder,
    gpt2_blocks,
    llama_decoder,
    llama_tiny,
    resnet_basic_block,
)
from braze.testing import assert_equivalent


def fused_counts(report):
    return report.fused_counts


def test_bert_base_layer_by_layer():
    g = bert_base()
    fused, report = bz.fuse(g, "cpu")
    c = fused.op_counts()
    assert c["fused_attention_block"] == 12
    assert c["fused_residual_ln"] == 24
    gelu = [n for n in fused.nodes if n.op.kind == "fused_matmul_bias_act"
            and n.op.act is bz.UnaryFn.GELU]
    assert len(gelu) == 12
    assert c.get("matmul", 0) == 0          # every QKV / projection matmul is inside a fused op
    assert c.get("attention", 0) == 0 and c.get("layer_norm", 0) == 0
    assert_equivalent(g, fused, seeds=(0,), atol=1e-5)


def weight_prep_only(g, node):
    """A concat whose inputs are all params: weight preparation, hoisted out of the run."""
    return node.op.kind == "concat" and all(g.nodes[v.node].op.kind == "param"
                                            for v in node.inputs)


def test_bert_base_whole_layer():
    g = bert_base()
    fused, report = bz.fuse(g, "cpu", transformer_layer=True)
    compute = [n for n in fused.nodes if not n.op.source and not weight_prep_only(fused, n)]
    assert {n.op.kind for n in compute} == {"fused_transformer_layer"} and len(compute) == 12
    assert_equivalent(g, fused, seeds=(0,), atol=1e-5)


def test_bert_base_with_stored_weights_folds_the_concatenation():
    g = bert_encoder(layers=2, hidden=64, heads=4, seq=8, seed=0)
    fused, _ = bz.fuse(g, "cpu", transformer_layer=True)
    assert fused.op_counts() == {"fused_transformer_layer": 2}
    assert_equivalent(g, fused)


def test_bert_symbolic_batch_and_seq_fuse_the_same():
    g = bert_encoder(layers=2, hidden=64, heads=4, batch="batch", seq="seq")
    fused, _ = bz.fuse(g, "cpu")
    c = fused.op_counts()
    assert c["fused_attention_block"] == 2 and c["fused_residual_ln"] == 4
    assert_equivalent(g, fused, symbols={"batch": 2, "seq": 5})


def test_llama_style_decoder():
    L = 3
    g = llama_decoder(layers=L, hidden=64, heads=4, kv_heads=2, seq=8)
    fused, report = bz.fuse(g, "cpu")
    c = fused.op_counts()
    assert c["fused_attention_block"] == L
    assert c["fused_residual_rms_norm"] == 2 * L
    assert c["fused_swiglu"] == L
    assert c.get("rope", 0) == 0 and c.get("silu", 0) == 0
    assert_equivalent(g, fused)


def test_gpt2_pre_norm_blocks():
    g = gpt2_blocks(layers=2, hidden=64, heads=4, seq=8)
    fused, _ = bz.fuse(g, "cpu")
    c = fused.op_counts()
    assert c["fused_attention_block"] == 2
    assert c["fused_residual_ln"] == 4          # ln2 of each layer, ln1 of layer 1, final ln
    assert_equivalent(g, fused)


def test_resnet_block_folds_bn_and_fuses_conv_bias_relu():
    g = resnet_basic_block(channels=8, hw=10, seed=0)
    fused, _ = bz.fuse(g, "cpu")
    c = fused.op_counts()
    assert c.get("batch_norm", 0) == 0 and c.get("conv2d", 0) == 0
    relu_convs = [n for n in fused.nodes if n.op.kind == "fused_conv_bias_act"
                  and n.op.act is bz.UnaryFn.RELU]
    assert len(relu_convs) >= 1 and c["fused_conv_bias_act"] == 2
    assert_equivalent(g, fused)


@pytest.mark.parametrize("build", [
    lambda: bert_encoder(layers=2, hidden=32, heads=2, seq=5),
    lambda: bert_encoder(layers=1, hidden=32, heads=2, seq=5, with_mask=True, qkv="fused"),
    lambda: gpt2_blocks(layers=2, hidden=32, heads=2, seq=5),
    llama_tiny,
    lambda: resnet_basic_block(channels=4, hw=6, downsample=True),
])
@pytest.mark.parametrize("whole_layer", [False, True])
def test_fuse_then_unfuse_equals_the_original(build, whole_layer):
    g = build()
    fused, _ = bz.fuse(g, "cpu", transformer_layer=whole_layer, verify=True)
    plain = bz.unfuse_fused_for_autodiff(fused)
    assert not any(n.op.fused for n in plain.nodes)
    assert_equivalent(g, plain)
    assert_equivalent(g, fused)


@pytest.mark.parametrize("target", ["reference", "cpu", "gpu", "onnxruntime"])
def test_every_target_keeps_the_numbers(target):
    g = llama_tiny()
    fused, report = bz.fuse(g, target)
    assert_equivalent(g, fused)
    if target == "reference":
        assert fused.op_counts() == g.op_counts()
    assert report.target == target


def test_onnxruntime_target_reports_what_it_cannot_run():
    fused, report = bz.fuse(llama_tiny(), "onnxruntime")
    assert fused.count("fused_swiglu") == 0
    assert any(m.reason is bz.MissReason.UNSUPPORTED_BY_TARGET for m in report.misses)


def test_pipeline_options_turn_passes_off():
    g = bert_encoder(layers=1, hidden=32, heads=2, seq=5)
    fused, _ = bz.fuse(g, "cpu", attention_block=False)
    assert fused.count("fused_attention_block") == 0 and fused.count("attention") == 1
    with pytest.raises(bz.BrazeError, match="unknown pipeline options"):
        bz.fuse(g, "cpu", attention_blocks=False)
    with pytest.raises(bz.BrazeError, match="unknown target"):
        bz.fuse(g, "tpu")


def test_fusion_passes_for_supported_claims_only_fuses_those_kinds():
    g = llama_tiny()
    passes = bz.fusion_passes_for_supported(["fused_attention_block"])
    fused, results = bz.run_passes(g, passes, bz.rewrite.RewriteContext(
        target=bz.get_target("cpu").with_options(claims=frozenset({"fused_attention_block"}))))
    kinds = {n.op.kind for n in fused.nodes if n.op.fused}
    assert kinds == {"fused_attention_block"}
    misses = [m for r in results for m in r.misses]
    assert any(m.reason is bz.MissReason.UNSUPPORTED_BY_TARGET for m in misses)
    assert_equivalent(g, fused)
    with pytest.raises(bz.BrazeError, match="unknown fused kinds"):
        bz.fusion_passes_for_supported(["fused_everything"])
