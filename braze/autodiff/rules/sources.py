"""Sources and generators: graph inputs, params, constants, `range` and `sym_const` have no
inputs, so nothing flows through them (gradients with respect to inputs and params are what
`grad_with_loss` returns, read off the cotangent that reaches them)."""
from __future__ import annotations

from ...ir.ops.generate import Range, SymConst
from ...ir.ops.io import Constant, Input, Param
from ..registry import non_differentiable

non_differentiable(Input, "a graph input: a source, no op inputs to differentiate")
non_differentiable(Param, "a param: a source, no op inputs to differentiate")
non_differentiable(Constant, "a constant: no inputs, zero tangent")
non_differentiable(Range, "range is generated from attributes: no inputs")
non_differentiable(SymConst, "sym_const holds dims bound at run time: no inputs")
