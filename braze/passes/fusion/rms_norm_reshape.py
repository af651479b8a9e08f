"""FuseRmsNormReshape: rms_norm(reshape(x, [..., H, D])) over the new last axis (per-head
QK-norm right after splitting heads) into one FusedRmsNormReshape. A norm over more than the
last axis is a reported AXIS_MISMATCH; a reshape read elsewhere stays (driver: MULTI_CONSUMER)."""
from __future__ import annotations

from ...ir.ops.fused import FusedRmsNormReshape
from ...ir.ops.norm import RmsNorm
from ...ir.ops.shape import Reshape
from ...rewrite import Miss, MissReason, P, Rule, V, fail
from .checks import target_claims

_AFFINE = ("affine0", "affine1")  # the norm's gamma / beta inputs, whichever are present
_split = P.of(Reshape, V("x"), name="reshape")                 # reshape(x, [..., H, D])
_pattern = (P.of(RmsNorm, _split, V("affine0"), V("affine1"), name="norm")
            | P.of(RmsNorm, _split, V("affine0"), name="norm")
            | P.of(RmsNorm, _split, name="norm"))              # rms_norm(reshape(x) [, g][, b])


def norm_over_last_axis(m, ctx) -> Miss | None:
    """The norm reduces the reshaped value's last axis only (the fused kind's semantics)."""
    rank = m.shape("reshape").rank
    axis = m.op("norm").axis
    if axis % rank != rank - 1:
        return fail(MissReason.AXIS_MISMATCH,
                    hint="FusedRmsNormReshape normalizes each head's last axis alone; a norm "
                         "over several trailing axes stays unfused.",
                    detail=f"norm axis {axis} of rank-{rank} reshape output, not the last axis")
    return None


def _build(b, m):
    norm = m.op("norm")
    op = FusedRmsNormReshape(eps=norm.eps, has_gamma=norm.has_gamma, has_beta=norm.has_beta,
                             dims=m.op("reshape").dims)
    return b.add_node(op, [m.v("x")] + [m.v(a) for a in _AFFINE if a in m.values])[0]


FUSE_RMS_NORM_RESHAPE = Rule(
    "FuseRmsNormReshape",
    _build,
    pattern=_pattern,
    checks=(target_claims("fused_rms_norm_reshape"), norm_over_last_axis),
    produces="fused_rms_norm_reshape",
)
RULES = (FUSE_RMS_NORM_RESHAPE,)
