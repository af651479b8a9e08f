"""Passes: the pass protocol and runner, targets as data, fusion rules, cleanup, unfuse, and the
pipeline builder that reads a target."""

from .lower import (  # noqa: F401
    LowerBatchNormInference,
    LowerDotGeneral,
    LowerGroupNorm,
    LowerNonLastAxisReduce,
    LowerResizeNearest2x,
    LowerSoftmaxCrossEntropy,
    lower_logical_kernels,
)
