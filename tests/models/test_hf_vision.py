"""Hugging Face vision families (braze.models.hf_vision: random weights, perturbed norm weights
and BatchNorm statistics, 32x32 images, one or two blocks per stage) through the whole pipeline:
imported from the TorchScript and dynamo ONNX exports and through `bz.import_torch`, they
reproduce PyTorch before and after `bz.fuse`; BatchNorms fold (after convs and after linear
layers), convs fuse with their bias and activation, every transformer layer's attention block
and residual LayerNorms fuse, and what does not fuse is a reported miss with its reason; the
fused ONNX export runs in ONNX Runtime and matches; the compiled CPU executor matches the
interpreter, in fp32 and under the bf16 policy (on the policy's graph)."""
import numpy as np
import pytest
import torch

import braze as bz
from braze.models.hf_vision import VISION_FAMILIES, vision_inputs
from braze.rewrite import MissReason

FAMILIES = sorted(VISION_FAMILIES)
# The dynamo and torch.export paths re-trace the model (seconds each): the families that differ
# most in what they trace to. The dynamo exporter itself fails on BEiT and Swin (its
# decompositions view the transposed attention output); bz.import_torch takes them.
DYNAMO = ("convnext", "vit")
TORCH = ("beit", "efficientnet", "swin")
CASES = ([(f, "torchscript") for f in FAMILIES] + [(f, "dynamo") for f in DYNAMO]
         + [(f, "torch") for f in TORCH])

# family -> (attention blocks fused, residual LayerNorms fused); the other families have none.
# ViT / DeiT / DINOv2 / CLIP's first norm reads patches + [1, S, D] position embeddings: a
# residual repeated over the batch, which fuses like any other
FUSED = {"vit": (2, 5), "deit": (2, 5), "dinov2": (2, 5), "beit": (2, 4), "clip_vision": (2, 4),
         "swin": (3, 5), "mobilevit": (9, 18), "segformer": (2, 4)}
# LayerNorms left plain in the ViT-like families, none of them after an add (no residual to
# fuse): BEiT's first layer norm reads the concatenated tokens (relative position bias, no
# absolute position embeddings), CLIP's first layer norm reads pre_layrnorm's output
PLAIN_NORMS = {"vit": 0, "deit": 0, "dinov2": 0, "beit": 1, "clip_vision": 1}
# attention kept unfused, with the reason the report gives: LeViT applies Hardswish to the
# merged heads before the projection (SegFormer's reduced keys / values, sr_ratio > 1, fuse as
# cross-attention over the reduced input)
ATTENTION_KEPT = {"levit": (5, MissReason.PATTERN_MISMATCH)}
# convs left as conv2d: bias-free 1x1 / patch convs with no activation (nothing to fuse)
PLAIN_CONVS = {"clip_vision": 1, "mobilevit": 3}

_CACHE: dict = {}


def _graphs(zoo, family: str, variant: str):
    """(module, imported graph, cpu-fused graph, report), once per session."""
    key = (family, variant)
    if key not in _CACHE:
        m = zoo.module(family)
        if variant == "torch":
            x = torch.from_numpy(vision_inputs(2, m.image_size)["pixel_values"])
            g = bz.import_torch(m, (x,), dynamic_shapes={"pixel_values": {0: "batch"}})
        else:
            g = bz.import_onnx(zoo.onnx(family, variant))
        fused, report = bz.fuse(g, "cpu")
        _CACHE[key] = (m, g, fused, report)
    return _CACHE[key]


def _want(m, feeds):
    with torch.no_grad():
        return m(torch.from_numpy(feeds["pixel_values"])).numpy()


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("family,variant", CASES)
def test_imported_and_fused_graphs_match_pytorch(hf_vision_zoo, family, variant):
    m, g, fused, _ = _graphs(hf_vision_zoo, family, variant)
    assert g.inputs[0].outputs[0].dims[0] == "batch"
    feeds = vision_inputs(3, m.image_size, seed=7)             # not the export's batch of 2
    want = _want(m, feeds)
    for graph in (g, fused):
        (got,) = bz.interpret(graph, feeds)
        _close(got, want)


@pytest.mark.parametrize("family,variant", CASES)
def test_what_should_fuse_fuses_and_misses_say_why(hf_vision_zoo, family, variant):
    _, g, fused, report = _graphs(hf_vision_zoo, family, variant)
    assert fused.count("batch_norm") == 0                      # folded into convs / linears
    assert fused.count("conv2d") == PLAIN_CONVS.get(family, 0), report   # the rest fused
    blocks, norms = FUSED.get(family, (0, 0))
    assert fused.count("fused_attention_block") == blocks, report
    assert fused.count("fused_residual_ln") == norms, report
    if family in PLAIN_NORMS:
        assert fused.count("layer_norm") == PLAIN_NORMS[family], report
        assert not [x for x in report.misses if x.pattern == "FuseResidualLN"], report
    kept, reason = ATTENTION_KEPT.get(family, (0, None))
    assert fused.count("attention") == kept
    attention_misses = [x for x in report.misses if x.pattern == "FuseAttentionBlock"]
    assert [x.reason for x in attention_misses] == [reason] * kept
    for miss in report.misses:                                 # each names its source node
        assert miss.context and miss.reason is not None


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_onnx_export_runs_in_onnxruntime_and_matches(hf_vision_zoo, family, tmp_path):
    import onnxruntime as ort

    m, g, _, _ = _graphs(hf_vision_zoo, family, "torchscript")
    fused, _ = bz.fuse(g, "onnxruntime")
    path = bz.export_onnx(fused, tmp_path / "fused.onnx", target="onnxruntime")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = vision_inputs(2, m.image_size, seed=8)
    (got,) = sess.run(None, feeds)
    _close(got, _want(m, feeds))


@pytest.mark.parametrize("family", FAMILIES)
def test_compiled_executor_matches_the_interpreter(hf_vision_zoo, family):
    m, _, fused, _ = _graphs(hf_vision_zoo, family, "torchscript")
    feeds = vision_inputs(3, m.image_size, seed=9)
    (want,) = bz.interpret(fused, feeds)
    (got,) = bz.compile(fused, "cpu")(feeds)
    _close(got, want)


@pytest.mark.parametrize("family", FAMILIES)
def test_compiled_bf16_policy_matches_the_interpreter_on_its_graph(hf_vision_zoo, family):
    """Under the bf16 policy (convs on AMX tiles where AMX runs, the bf16 GEMM, small and
    depthwise convs in f32) the compiled executable computes the policy's graph: against
    the reference interpreter on `exe.graph`, up to the order of f32 sums."""
    m, g, _, _ = _graphs(hf_vision_zoo, family, "torchscript")
    feeds = vision_inputs(2, m.image_size, seed=10)
    exe = bz.compile(g, "cpu", precision="bf16")
    (got,) = exe(feeds)
    (want,) = bz.interpret(exe.graph, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * float(np.abs(want).max()))


def test_batch_norm_statistics_are_perturbed(hf_vision_zoo):
    bn = hf_vision_zoo.module("resnet").model.embedder.embedder.normalization
    assert not torch.allclose(bn.running_mean, torch.zeros_like(bn.running_mean))
    assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
    assert not torch.allclose(bn.weight, torch.ones_like(bn.weight))
