"""Passes: the pass protocol and runner, targets as data, fusion rules, cleanup, unfuse, and the
pipeline builder that reads a target."""

from .lower import LowerDotGeneral, LowerNonLastAxisReduce, LowerSoftmaxCrossEntropy  # noqa: F401
