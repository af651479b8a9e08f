"""Whole models with ONNX Runtime contrib ops import and match ONNX Runtime: braze's own
onnxruntime-target exports of its fused builtin models (Attention, MultiHeadAttention,
SkipLayerNormalization, RotaryEmbedding, FusedConv, ...), which fuse back into the same fused
kinds, and the outputs of ORT's transformer
optimizer and of ORT's extended graph optimizations on Hugging Face exports (EmbedLayerNorm,
Attention, BiasGelu, FastGelu, QuickGelu, FusedMatMul, SimplifiedLayerNormalization, ...).
Symbolic batch / sequence models run at two sizes, with padded attention masks."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import braze as bz  # noqa: E402
import braze.models as models  # noqa: E402
from braze.export.onnx import to_onnx_model  # noqa: E402

MS = "com.microsoft"


def ort_session(model):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def compare(model, graph, feeds, rtol=1e-4, atol=1e-4):
    sess = ort_session(model)
    names = {i.name for i in sess.get_inputs()}
    feeds = {k: v for k, v in feeds.items() if k in names}
    ref = sess.run(None, feeds)
    ours = bz.interpret(graph, feeds)
    assert len(ours) == len(ref)
    for a, r in zip(ours, ref, strict=True):
        np.testing.assert_allclose(a, r, rtol=rtol, atol=atol)


def contrib_ops(model) -> set[str]:
    if isinstance(model, str):
        model = onnx.load(model)
    return {n.op_type for n in model.graph.node if n.domain == MS} | \
        {n.op_type for n in model.graph.node if n.op_type == "SimplifiedLayerNormalization"}


BUILTIN = {
    "bert": (lambda: models.bert_encoder(2, 32, 2, batch="batch", seq="seq", with_mask=True),
             {"Attention", "SkipLayerNormalization", "BiasGelu"}),
    "gpt2": (lambda: models.gpt2_blocks(2, 32, 2, batch="batch", seq="seq"),
             {"Attention", "SkipLayerNormalization"}),
    "llama": (lambda: models.llama_decoder(2, 64, 4, 2, 96, batch="batch", seq="seq"),
              {"SkipSimplifiedLayerNormalization", "MultiHeadAttention", "RotaryEmbedding"}),
    "resnet": (lambda: models.resnet_basic_block(), {"FusedConv"}),
}


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_braze_onnxruntime_exports_reimport(name):
    build, contrib = BUILTIN[name]
    g = build()
    params = bz.init_params(g, 0)
    fused, _ = bz.fuse(g, "onnxruntime")
    model = to_onnx_model(fused, "onnxruntime", params=params)
    assert contrib <= contrib_ops(model)
    back = bz.import_onnx(model)
    assert back.op_counts().get("attention", 0) == fused.op_counts().get(
        "fused_attention_block", 0) + fused.op_counts().get("attention", 0)
    for kind in ("fused_residual_ln", "fused_residual_rms_norm"):
        assert back.op_counts().get(kind, 0) == fused.op_counts().get(kind, 0)
    for i, sym in enumerate(({"batch": 2, "seq": 5}, {"batch": 1, "seq": 3})):
        compare(model, back, bz.random_feeds(g, i, sym))
    refused, _ = bz.fuse(back, "onnxruntime")
    compare(model, refused, bz.random_feeds(g, 7, {"batch": 2, "seq": 4}))
    if name != "bert":  # BERT's masked attention carries the fully-masked guard (ops_contrib)
        assert {k: v for k, v in refused.op_counts().items() if k.startswith("fused")} == \
            {k: v for k, v in fused.op_counts().items() if k.startswith("fused")}


# -- ONNX Runtime's own optimizers on Hugging Face exports ---------------------------------------
OPTIMIZED = [
    ("bert", "eager", "transformers", {"EmbedLayerNormalization", "Attention",
                                       "SkipLayerNormalization", "BiasGelu"}),
    ("bert", "sdpa", "transformers", {"SkipLayerNormalization", "BiasGelu"}),
    ("bert", "dynamo", "extended", {"FusedMatMul", "SkipLayerNormalization", "BiasGelu"}),
    ("gpt2", "sdpa", "transformers", {"SkipLayerNormalization", "FastGelu"}),
    ("gpt2", "eager", "extended", {"FusedMatMul", "FastGelu"}),
    ("llama", "sdpa", "transformers", {"SimplifiedLayerNormalization",
                                       "SkipSimplifiedLayerNormalization"}),
    ("llama", "eager", "extended", {"SimplifiedLayerNormalization", "FusedMatMul",
                                    "QuickGelu"}),
]


def ort_optimized(src: str, dst: str, family: str, how: str, config) -> str:
    if how == "extended":
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = dst
        ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
        return dst
    from onnxruntime.transformers.optimizer import optimize_model

    kind = "bert" if family == "bert" else "gpt2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = optimize_model(src, model_type=kind, num_heads=config.num_attention_heads,
                             hidden_size=config.hidden_size)
    opt.save_model_to_file(dst)
    return dst


@pytest.mark.parametrize("family, variant, how, contrib", OPTIMIZED,
                         ids=[f"{f}-{v}-{h}" for f, v, h, _ in OPTIMIZED])
def test_ort_optimized_models_import_and_match(hf_zoo, tmp_path, family, variant, how, contrib):
    from braze.models.hf import hf_inputs

    module = hf_zoo.module(family, "eager" if variant == "eager" else "sdpa")
    path = ort_optimized(hf_zoo.onnx(family, variant), str(tmp_path / "opt.onnx"), family, how,
                         module.model.config)
    assert contrib <= contrib_ops(path)
    g = bz.import_onnx(path)
    vocab = module.vocab_size
    for batch, seq, padding in ((2, 8, "right"), (3, 5, "left")):
        compare(path, g, hf_inputs(batch, seq, vocab=vocab, padding=padding, seed=seq))
    fused, _ = bz.fuse(g, "cpu")                   # fuses like the unoptimized export
    want, _ = bz.fuse(hf_zoo.graph(family, variant), "cpu")
    assert fused_summary(fused) == fused_summary(want)
    compare(path, fused, hf_inputs(2, 6, vocab=vocab, seed=1))


def fused_summary(g) -> dict:
    """Fused kinds per layer, a norm fused with a residual counted with plain norms (ORT's
    EmbedLayerNormalization turns BERT's embedding norm into one)."""
    c = g.op_counts()
    return {"attention_blocks": c.get("fused_attention_block", 0),
            "mlp": c.get("fused_swiglu", 0) + c.get("fused_matmul_bias_act", 0),
            "norms": sum(c.get(k, 0) for k in ("layer_norm", "rms_norm", "fused_residual_ln",
                                                 "fused_residual_rms_norm"))}
