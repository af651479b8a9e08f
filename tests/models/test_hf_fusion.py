"""Real exports fuse: every Hugging Face family in the zoo, exported three ways (TorchScript with
sdpa / eager attention, dynamo), fuses every layer's attention block, residual norms and MLP,
with no attention miss in the report, and the fused graph reproduces PyTorch (right padding)
and ONNX Runtime on the original file (any padding)."""
import numpy as np
import onnxruntime as ort
import pytest
import torch

import braze as bz
from braze.models.hf import HF_FAMILIES, family_variants, hf_inputs, variant_attn
from braze.rewrite import MissReason

# family -> residual norms fused over its two layers (pre-norm stacks fuse each sublayer's
# residual add into the next norm; parallel-residual stacks have one residual per layer;
# RoBERTa's and OPT's embedding sums are batch-shaped, and BERT's, GPT-2's, DistilBERT's and
# CLIP's add [1, S, D] / [S, D] position embeddings (a residual repeated over the batch), so
# their embedding norm fuses too)
RESIDUAL_NORMS = {"bert": 5, "gpt2": 5, "llama": 4, "gemma": 4, "qwen2": 4, "gpt_neox": 2,
                  "phi": 2, "t5": 4, "bloom": 4, "falcon": 2, "mistral": 4, "gptj": 2,
                  "distilbert": 5, "roberta": 5, "clip_text": 5, "stablelm": 4, "opt": 5,
                  "qwen3": 4, "gemma3_text": 4, "olmo2": 1, "persimmon": 4, "phi3": 4,
                  "granite": 4, "mixtral": 4,
                  "esm": 4, "modernbert": 4, "deberta_v2": 4, "xlm": 5}
# family -> why its layers' attention ops (each recognized) do not fuse into attention blocks,
# as the report gives it: DeBERTa's disentangled position bias reads the projected q and k,
# which a fused block computes inside itself
BLOCK_NOT_FUSED = {"deberta_v2": MissReason.MULTI_CONSUMER}
# family -> softmaxes left after fusion: a mixture of experts' router (one per layer) picks
# experts, it is not attention
ROUTER_SOFTMAXES = {"mixtral": 2}
CASES = [(f, v) for f in sorted(HF_FAMILIES) for v in family_variants(f)]


def _fused(hf_zoo, family, variant):
    g = hf_zoo.graph(family, variant)
    fused, report = bz.fuse(g, "cpu")
    return g, fused, report


@pytest.mark.parametrize("family,variant", CASES)
def test_every_layer_fuses(hf_zoo, family, variant):
    g, fused, report = _fused(hf_zoo, family, variant)
    fam = HF_FAMILIES[family]
    layers = hf_zoo.module(family).num_layers
    attention_misses = [m for m in report.misses if "ttention" in m.pattern]
    if family in BLOCK_NOT_FUSED:
        assert fused.count("attention") == layers and fused.count("softmax") == 0, report
        assert len(attention_misses) == layers, attention_misses
        assert {m.reason for m in attention_misses} == {BLOCK_NOT_FUSED[family]}
    else:
        assert fused.count("fused_attention_block") == layers, report
        assert fused.count("attention") == 0
        assert fused.count("softmax") == ROUTER_SOFTMAXES.get(family, 0), report
        assert not attention_misses, attention_misses
    norms = fused.count("fused_residual_ln") + fused.count("fused_residual_rms_norm")
    assert norms == RESIDUAL_NORMS[family], report
    if fam.gated_mlp:
        assert fused.count("fused_swiglu") == layers
    else:
        acts = [n for n in fused.nodes if n.op.kind == "fused_matmul_bias_act" and n.op.act]
        assert len(acts) == layers
    # nothing of a layer is left as primitives: no stray matmul with a bias add or gelu math
    assert fused.count("erf") == 0 and fused.count("tanh") == 0 and fused.count("rope") == 0


@pytest.mark.parametrize("family,variant", CASES)
def test_fused_graph_matches_pytorch_and_onnxruntime(hf_zoo, family, variant):
    _, fused, _ = _fused(hf_zoo, family, variant)
    m = hf_zoo.module(family, variant_attn(family, variant))
    right = hf_inputs(3, 6, vocab=m.vocab_size, seed=3)
    with torch.no_grad():
        want = m(*(torch.from_numpy(right[k]) for k in ("input_ids", "attention_mask"))).numpy()
    (got,) = bz.interpret(fused, right)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    sess = ort.InferenceSession(hf_zoo.onnx(family, variant), providers=["CPUExecutionProvider"])
    for padding in ("left", "none"):
        feeds = hf_inputs(2, 9, vocab=m.vocab_size, seed=4, padding=padding)
        (ref,) = sess.run(None, feeds)
        (got,) = bz.interpret(fused, feeds)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_misses_name_the_onnx_node(hf_zoo, family):
    """Whole-layer fusion on a model the whole-layer kind cannot express reports misses that
    name the ONNX nodes (provenance), never silence."""
    g = hf_zoo.graph(family, "sdpa")
    fused, report = bz.fuse(g, "cpu", transformer_layer=True)
    for miss in report.misses:
        assert "/" in miss.context  # ONNX node names look like /model/layers.0/...


@pytest.mark.parametrize("family,variant", CASES)
def test_fused_export_runs_in_onnxruntime_and_matches(hf_zoo, family, variant, tmp_path):
    g = hf_zoo.graph(family, variant)
    fused, _ = bz.fuse(g, "onnxruntime")
    path = bz.export_onnx(fused, tmp_path / "fused.onnx", target="onnxruntime")
    fused_sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert any(n.domain == "com.microsoft" for n in __import__("onnx").load(path).graph.node)
    original = ort.InferenceSession(hf_zoo.onnx(family, variant),
                                    providers=["CPUExecutionProvider"])
    feeds = hf_inputs(2, 7, vocab=128, seed=6)
    (want,) = original.run(None, feeds)
    (got,) = fused_sess.run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
