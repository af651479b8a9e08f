"""FuseConvResidual: act(fused_conv_bias_act(x, w, b) + r) (or the add alone), where the conv
has no activation of its own (or is a bias-less conv2d, given a zero bias) and r has the
conv's output type, into one FusedConvBiasAct with `residual`: a ResNet block's shortcut add
and ReLU join its last conv's epilogue, so the conv's output tile takes the shortcut and the
activation while it is in cache (ONNX Runtime's FusedConv with its Z input). Runs after
FuseConvBiasAct, whose result it extends.

Refused, with the reason in the report: a residual that broadcasts, an activation the target
does not apply in an epilogue, and the conv's output read elsewhere or returned (the rewrite
engine's multi-consumer / graph-output rules: fusing would drop that value). A vector or a
single value added to the conv (at most one dim above 1: a bias, or hard-swish's `+ 3`) is
FuseConvBiasAct's and no near miss here."""
from __future__ import annotations

import numpy as np

from ...ir.ops.elementwise import Unary
from ...ir.ops.fused import FusedConvBiasAct
from ...rewrite import Miss, MissReason, P, Rule, V, fail
from .checks import epilogue_activation_allowed, same_dtype, target_claims

_conv = (P.of(FusedConvBiasAct, V("x"), V("w"), V("b"), name="conv", act=None, residual=False)
         | P.conv2d(V("x"), V("w"), name="conv"))  # no bias: FuseConvBiasAct left it alone


def _not_a_vector(g, v) -> bool:
    """Varies along two or more axes: a vector or a single value is no residual candidate."""
    return sum(1 for d in g.shape_of(v).dims if d != 1) > 1


_sum = P.add(_conv, V("r", where=_not_a_vector), name="add")
_act_sum = P.of(Unary, _sum, name="act")


def residual_has_output_shape(m, ctx) -> Miss | None:
    """The residual has the conv output's dims: anything broadcast onto it is no shortcut."""
    want, have = m.shape("conv").dims, m.shape("r").dims
    if tuple(have) == tuple(want):
        return None
    return fail(MissReason.SHAPE_MISMATCH,
                hint="a residual fuses when it has the conv output's shape; a per-channel "
                     "vector is a bias (FuseConvBiasAct takes it), anything else broadcast "
                     "stays a separate add.",
                detail=f"added operand has dims {tuple(have)}, the conv output {tuple(want)}")


def _build(b, m):
    conv = m.op("conv")
    act = m.op("act").fn if "act" in m.nodes else None
    op = FusedConvBiasAct(conv.stride, conv.padding, conv.dilation, conv.groups, act, True)
    bias = m.v("b") if "b" in m.values else \
        b.constant(np.zeros(m.shape("conv").dims[1], m.shape("conv").dtype.np))
    return b.add_node(op, (m.v("x"), m.v("w"), bias, m.v("r")))[0]


FUSE_CONV_RESIDUAL = Rule(
    "FuseConvResidual",
    _build,
    pattern=_act_sum | _sum,
    checks=(target_claims("fused_conv_bias_act"), residual_has_output_shape,
            same_dtype("conv", "r"), epilogue_activation_allowed("act")),
    produces="fused_conv_bias_act",
)
RULES = (FUSE_CONV_RESIDUAL,)
