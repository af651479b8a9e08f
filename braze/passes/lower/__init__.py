"""Lowering passes: rewrite ops a backend cannot run into ops it can (see registry.py). Each
family lives in its own module and registers its Lowering on import; importing this package
registers them all, which is what `bz.rewrite_for_backend` relies on."""
from __future__ import annotations

from .. import legalize_broadcast  # noqa: F401  (registers LegalizeBroadcast)
from .backward import LowerBackwardOps  # noqa: F401  (registers the lowering)
from .batch_norm import LowerBatchNormInference
from .control_flow import (
    LowerControlFlow,
    inline_if,
    inline_subgraph_into,
    inline_subgraph_into_outputs,
    unroll_while,
)
from .dot_general import LowerDotGeneral
from .generate import MaterializeStaticGenerators
from .group_norm import LowerGroupNorm
from .logical import LowerLogicalActivations, lower_logical_kernels
from .reduce_axes import LowerNonLastAxisReduce
from .registry import LOWERINGS, Lowering, LoweringPass, lowerings_for, register_lowering
from .resize import LowerResizeNearest2x
from .softmax_cross_entropy import LowerSoftmaxCrossEntropy

__all__ = ["LOWERINGS", "Lowering", "LoweringPass", "lowerings_for", "register_lowering",
           "LowerDotGeneral", "LowerNonLastAxisReduce", "LowerSoftmaxCrossEntropy",
           "LowerBatchNormInference", "LowerGroupNorm", "LowerResizeNearest2x",
           "LowerLogicalActivations", "lower_logical_kernels", "MaterializeStaticGenerators",
           "LowerControlFlow", "inline_if", "unroll_while", "inline_subgraph_into",
           "inline_subgraph_into_outputs"]
