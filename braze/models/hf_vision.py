"""Hugging Face vision models built from their config classes with random weights (nothing is
downloaded), small enough for tests (32x32 images, one or two blocks per stage), and their ONNX
exports: the TorchScript exporter ("torchscript") and the dynamo exporter ("dynamo").

    m = hf_vision_module("convnext")            # eval-mode module: pixel_values -> last hidden
    export_vision_onnx(m, "convnext.onnx", "dynamo")
    feeds = vision_inputs(batch=2, size=m.image_size)

Every 1-D parameter (norm weights, biases) is moved off its default, and BatchNorm running
statistics are moved off 0 / 1, so a dropped gamma, beta, mean or variance cannot go unnoticed
in a numeric check. Needs torch and transformers (the `torch` extra)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

__all__ = ["VISION_FAMILIES", "VisionFamily", "hf_vision_module", "vision_inputs",
           "export_vision_onnx", "VISION_EXPORTS"]

VISION_EXPORTS = ("torchscript", "dynamo")
IMAGE = 32


@dataclass(frozen=True)
class VisionFamily:
    """One architecture: its model and config classes, the small config, and what fusion must
    find in it (attention blocks, residual LayerNorms) where the architecture has them."""

    name: str
    model_class: str
    config_class: str
    config: dict = field(default_factory=dict)
    image_size: int = IMAGE
    attention_blocks: int = 0   # attention blocks the fused graph must hold
    sdpa: bool = False          # whether the model has an sdpa attention implementation


_VIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            image_size=IMAGE, patch_size=8)
_STAGES = dict(hidden_sizes=[16, 32], depths=[1, 1])

VISION_FAMILIES: dict[str, VisionFamily] = {f.name: f for f in (
    VisionFamily("vit", "ViTModel", "ViTConfig", _VIT, attention_blocks=2, sdpa=True),
    VisionFamily("deit", "DeiTModel", "DeiTConfig", _VIT, attention_blocks=2, sdpa=True),
    VisionFamily("dinov2", "Dinov2Model", "Dinov2Config", dict(_VIT, mlp_ratio=2),
                 attention_blocks=2, sdpa=True),
    VisionFamily("beit", "BeitModel", "BeitConfig",
                 dict(_VIT, use_relative_position_bias=True, use_mean_pooling=False),
                 attention_blocks=2, sdpa=False),
    VisionFamily("clip_vision", "CLIPVisionModel", "CLIPVisionConfig", _VIT,
                 attention_blocks=2, sdpa=True),
    VisionFamily("swin", "SwinModel", "SwinConfig",
                 dict(image_size=IMAGE, patch_size=4, embed_dim=16, depths=[2, 1],
                      num_heads=[2, 4], window_size=4), attention_blocks=3, sdpa=False),
    VisionFamily("convnext", "ConvNextModel", "ConvNextConfig", dict(_STAGES, num_stages=2)),
    VisionFamily("resnet", "ResNetModel", "ResNetConfig",
                 dict(_STAGES, embedding_size=16, layer_type="bottleneck")),
    VisionFamily("regnet", "RegNetModel", "RegNetConfig",
                 dict(_STAGES, embedding_size=16, groups_width=8)),
    VisionFamily("mobilenet_v2", "MobileNetV2Model", "MobileNetV2Config",
                 dict(depth_multiplier=0.35, image_size=IMAGE)),
    VisionFamily("mobilenet_v1", "MobileNetV1Model", "MobileNetV1Config",
                 dict(depth_multiplier=0.25, image_size=IMAGE)),
    VisionFamily("efficientnet", "EfficientNetModel", "EfficientNetConfig",
                 dict(image_size=IMAGE, width_coefficient=0.25, depth_coefficient=0.2,
                      hidden_dim=320)),
    VisionFamily("segformer", "SegformerModel", "SegformerConfig",
                 dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                      hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
                      num_attention_heads=[1, 2], mlp_ratios=[2, 2]), attention_blocks=2),
    VisionFamily("poolformer", "PoolFormerModel", "PoolFormerConfig",
                 dict(num_encoder_blocks=2, depths=[1, 1], hidden_sizes=[16, 32],
                      patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1], mlp_ratio=2.0)),
    VisionFamily("mobilevit", "MobileViTModel", "MobileViTConfig",
                 dict(image_size=IMAGE, hidden_sizes=[16, 24, 32],
                      neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_attention_heads=2),
                 attention_blocks=9),
    VisionFamily("levit", "LevitModel", "LevitConfig",
                 dict(image_size=64, hidden_sizes=[32, 48, 64], num_attention_heads=[2, 2, 2],
                      depths=[1, 1, 1], key_dim=[8, 8, 8]), image_size=64),
)}


def _family(name: str) -> VisionFamily:
    try:
        return VISION_FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown vision family {name!r}; known: "
                         f"{', '.join(VISION_FAMILIES)}") from None


def hf_vision_module(family: str, *, attn: str = "eager", seed: int = 0):
    """An eval-mode torch module `pixel_values -> last_hidden_state` of `family` with random,
    perturbed weights and BatchNorm statistics (deterministic for a seed)."""
    import torch
    import transformers

    fam = _family(family)
    torch.manual_seed(seed)
    cfg = getattr(transformers, fam.config_class)(**fam.config)
    if fam.sdpa:
        cfg._attn_implementation = attn
    model = getattr(transformers, fam.model_class)(cfg).eval()
    _perturb(model, seed)
    wrapped = _last_hidden_class()(model).eval()
    wrapped.image_size = fam.image_size
    wrapped.family = fam
    return wrapped


def _perturb(model, seed: int) -> None:
    """1-D parameters get N(0, 0.1) noise; BatchNorm running means N(0, 0.1) noise and running
    variances a factor in [0.5, 1.5]."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
        for mod in model.modules():
            if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
                mod.running_mean.add_(torch.randn(mod.running_mean.shape, generator=gen) * 0.1)
                mod.running_var.mul_(torch.rand(mod.running_var.shape, generator=gen) + 0.5)


def _last_hidden_class():
    import torch

    class LastHidden(torch.nn.Module):
        """pixel_values -> last_hidden_state."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, pixel_values):
            return self.model(pixel_values=pixel_values).last_hidden_state

    return LastHidden


def vision_inputs(batch: int = 2, size: int = IMAGE, *, seed: int = 0
                  ) -> dict[str, np.ndarray]:
    """Random `pixel_values` of shape [batch, 3, size, size] (float32, roughly normalized)."""
    rng = np.random.default_rng(seed)
    return {"pixel_values": rng.standard_normal((batch, 3, size, size)).astype(np.float32)}


def export_vision_onnx(module, path: str | os.PathLike, variant: str, *, opset: int = 17) -> str:
    """Export `module` (from hf_vision_module) to `path` with the TorchScript exporter
    ("torchscript", at `opset`) or the dynamo exporter ("dynamo"); the batch axis is dynamic
    ("batch"), the image size static."""
    import warnings

    import torch

    x = torch.from_numpy(vision_inputs(2, module.image_size)["pixel_values"])
    names, out = ["pixel_values"], ["last_hidden_state"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if variant == "torchscript":
            torch.onnx.export(module, (x,), str(path), input_names=names, output_names=out,
                              dynamic_axes={"pixel_values": {0: "batch"}},
                              opset_version=opset, dynamo=False)
        elif variant == "dynamo":
            shapes = {"pixel_values": {0: torch.export.Dim("batch")}}
            torch.onnx.export(module, (x,), str(path), input_names=names, output_names=out,
                              dynamic_shapes=shapes, dynamo=True, external_data=False,
                              verbose=False)
        else:
            raise ValueError(f"unknown export variant {variant!r}; known: {VISION_EXPORTS}")
    return str(path)
