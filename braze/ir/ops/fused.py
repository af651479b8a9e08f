"""Fused op kinds made by fusion passes, each a named composite with a `decompose`. The kinds
live in fused_simple (matmul/SwiGLU/norm/conv epilogues) and fused_attention (attention block,
transformer layer) and fused_quant (int8 linear layers); this module re-exports them all."""
from .fused_attention import (
    FusedAttentionBlock,
    FusedTransformerLayer,
    LayerStyle,
    MlpKind,
    NormKind,
    QkvInputs,
    RopeMode,
)
from .fused_quant import DynamicQuantMatMul
from .fused_simple import (
    FusedConvBiasAct,
    FusedMatMulBiasAct,
    FusedOp,
    FusedResidualLN,
    FusedResidualRmsNorm,
    FusedRmsNormReshape,
    FusedSwiGLU,
)

__all__ = [
    "FusedOp", "FusedMatMulBiasAct", "FusedSwiGLU", "FusedResidualLN", "FusedResidualRmsNorm",
    "FusedRmsNormReshape", "FusedConvBiasAct", "RopeMode", "QkvInputs", "FusedAttentionBlock",
    "LayerStyle", "NormKind", "MlpKind", "FusedTransformerLayer", "DynamicQuantMatMul",
]
