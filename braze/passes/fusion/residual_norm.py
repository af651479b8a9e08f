"""FuseResidualLN / FuseResidualRmsNorm: norm(add(x, residual)) into one FusedResidualLN or
FusedResidualRmsNorm. When the sum is read again (pre-norm layers feed it to the next residual
add) or returned, the fused op exposes it as its second output, so those layers fuse too."""
from __future__ import annotations

import os
import sys

from ...ir.ops.fused import FusedResidualLN, FusedResidualRmsNorm
from ...ir.ops.norm import LayerNorm, RmsNorm
from ...rewrite import Miss, MissReason, P, Rule, V, fail
from .checks import same_dtype, target_claims

_AFFINE = ("affine0", "affine1")  # the norm's gamma / beta inputs, whichever are present


def _norm_pattern(norm_cls):
    """norm(x + residual [, gamma][, beta]) with the add in either operand order."""
    s = P.add(V("x"), V("residual"), name="sum")
    return (P.of(norm_cls, s, V("affine0"), V("affine1"), name="norm")
            | P.of(norm_cls, s, V("affine0"), name="norm")
            | P.of(norm_cls, s, name="norm"))


def operands_match_norm_input(m, ctx) -> Miss | None:
    """Both addends have the normalized sum's exact dims (the fused kernel adds elementwise)."""
    want = m.shape("sum").dims
    for name in ("x", "residual"):
        have = m.shape(name).dims
        if have != want:
            return fail(MissReason.SHAPE_MISMATCH,
                        hint="the fused kernel adds elementwise; materialize the broadcast "
                             "(expand) or keep the add separate.",
                        detail=f"{name} has dims {have} but the norm input has {want}")
    return None


def _residual_norm_rule(name: str, norm_cls, fused_cls) -> Rule:
    """One rule fusing `norm_cls(add(x, residual))` into `fused_cls`, exposing the sum when it
    escapes the match. Its source is the line that calls this factory."""
    caller = sys._getframe(1)

    def build(b, m):
        norm = m.op("norm")
        expose = m.escapes("sum")
        op = fused_cls(eps=norm.eps, axis=norm.axis, has_gamma=norm.has_gamma,
                       has_beta=norm.has_beta, expose_sum=expose)
        ins = [m.v("x"), m.v("residual")] + [m.v(a) for a in _AFFINE if a in m.values]
        outs = b.add_node(op, ins)
        return {"root": outs[0], "sum": outs[1]} if expose else outs[0]

    return Rule(
        name,
        build,
        pattern=_norm_pattern(norm_cls),
        checks=(target_claims(fused_cls.kind), operands_match_norm_input,
                same_dtype("x", "residual")),
        may_expose=frozenset({"sum"}),
        produces=fused_cls.kind,
        source=f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno}",
    )


FUSE_RESIDUAL_LN = _residual_norm_rule("FuseResidualLN", LayerNorm, FusedResidualLN)
FUSE_RESIDUAL_RMS_NORM = _residual_norm_rule("FuseResidualRmsNorm", RmsNorm,
                                             FusedResidualRmsNorm)
RULES = (FUSE_RESIDUAL_LN, FUSE_RESIDUAL_RMS_NORM)
