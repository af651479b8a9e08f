"""An AxonML-compatible fusion API on braze: pattern detection over op-type sequences, a
FusionOptimizer with a bytes-moved cost model (and a braze-graph mode running braze's passes),
FusedLinear on a braze FusedMatMulBiasAct node and FusedElementwise on a braze region."""
from .cost import DEFAULT_SHAPE, OpShapes
from .elementwise import (
    ElementwiseOp,
    FusedElementwise,
    FusedElementwiseBuilder,
    fuse_elementwise,
    fused_add_relu,
    fused_mul_add,
    fused_scale_bias_relu,
)
from .linear import (
    Activation,
    FusedLinear,
    fuse_matmul_bias,
    fuse_matmul_bias_gelu,
    fuse_matmul_bias_relu,
)
from .optimizer import (
    FusionConfig,
    FusionOptimizer,
    OptimizationStats,
    estimate_speedup,
    optimize_graph,
)
from .patterns import Detected, FusionPattern, OpType, detect_patterns

__all__ = [
    "OpType", "FusionPattern", "Detected", "detect_patterns", "FusionConfig", "FusionOptimizer",
    "OptimizationStats", "optimize_graph", "estimate_speedup", "OpShapes", "DEFAULT_SHAPE",
    "Activation", "FusedLinear", "fuse_matmul_bias", "fuse_matmul_bias_relu",
    "fuse_matmul_bias_gelu", "ElementwiseOp", "FusedElementwise", "FusedElementwiseBuilder",
    "fused_add_relu", "fused_mul_add", "fused_scale_bias_relu", "fuse_elementwise",
]
