"""Passes: the pass protocol and runner, targets as data, fusion rules, cleanup, unfuse, and the
pipeline builder that reads a target."""

from .const_fold import ConstantFolding  # noqa: F401
from .legalize_broadcast import LegalizeBroadcast  # noqa: F401
from .lower import (  # noqa: F401
    LowerBatchNormInference,
    LowerControlFlow,
    LowerDotGeneral,
    LowerGroupNorm,
    LowerNonLastAxisReduce,
    LowerResizeNearest2x,
    LowerSoftmaxCrossEntropy,
    inline_if,
    inline_subgraph_into,
    inline_subgraph_into_outputs,
    lower_logical_kernels,
    unroll_while,
)
from .params import promote_params_to_inputs, specialize_params  # noqa: F401
