"""Targets as data: which fused/logical kinds a backend runs natively (its claims), which
activations its matmul epilogues apply, its region limits, and which fusions its pipeline wants.
One pipeline builder reads these; passes never special-case a backend."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..ir.ops.elementwise import UnaryFn
from .limits import FusionLimits

ALL_FUSED = frozenset({
    "fused_matmul_bias_act", "shared_matmul", "fused_swiglu", "fused_residual_ln",
    "fused_residual_rms_norm", "fused_rms_norm_reshape", "fused_attention_block",
    "fused_transformer_layer", "fused_conv_bias_act", "conv_bn_fold", "elementwise_region",
})


@dataclass(frozen=True)
class Target:
    """A backend described as data. `claims` lists fused kinds (and fusions) it wants; a fusion
    whose kind is not claimed is reported as UNSUPPORTED_BY_TARGET instead of applied."""

    name: str
    claims: frozenset[str]
    epilogue_activations: frozenset[UnaryFn]
    limits: FusionLimits = field(default_factory=FusionLimits)
    keep_regions: bool = True
    whole_layer: bool = False

    def claims_kind(self, kind: str) -> bool:
        return kind in self.claims

    def with_options(self, **changes) -> Target:
        return replace(self, **changes)


_ALL_UNARY = frozenset(UnaryFn)

TARGETS: dict[str, Target] = {
    "reference": Target("reference", frozenset(), frozenset(), FusionLimits(), keep_regions=False),
    "cpu": Target("cpu", ALL_FUSED, _ALL_UNARY, FusionLimits()),
    "gpu": Target("gpu", ALL_FUSED, _ALL_UNARY, FusionLimits(max_steps=32, max_inputs=16)),
    "onnxruntime": Target(
        "onnxruntime",
        frozenset({"fused_matmul_bias_act", "shared_matmul", "fused_residual_ln",
                   "fused_residual_rms_norm", "fused_attention_block", "conv_bn_fold",
                   "fused_conv_bias_act"}),
        frozenset({UnaryFn.GELU, UnaryFn.GELU_APPROX, UnaryFn.RELU, UnaryFn.SIGMOID,
                   UnaryFn.TANH, UnaryFn.SILU}),
        FusionLimits(),
        keep_regions=False,
    ),
}


def get_target(target: str | Target) -> Target:
    """The Target named `target` (or `target` itself)."""
    if isinstance(target, Target):
        return target
    try:
        return TARGETS[target]
    except KeyError:
        from ..errors import BrazeError

        raise BrazeError(f"unknown target {target!r}; known: {', '.join(TARGETS)}") from None
