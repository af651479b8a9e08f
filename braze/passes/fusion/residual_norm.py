"""FuseResidualLN / FuseResidualRmsNorm: norm(add(x, residual)) into one FusedResidualLN or
FusedResidualRmsNorm. When the sum is read again (pre-norm layers feed it to the next residual
add) or returned, the fused op exposes it as its second output, so those layers fuse too.
A residual that repeats over leading axes (ViT's [1, S, D] position embeddings added to the
[B, S, D] patch embeddings) fuses as well; the fused op's sum keeps the full shape."""
from __future__ import annotations

import os
import sys

from ...ir.ops.fused import FusedResidualLN, FusedResidualRmsNorm
from ...ir.ops.fused_simple import leading_broadcast_axes
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


_SHAPES_HINT = ("materialize the broadcast (expand) or keep the add separate; the fused "
                "kernel repeats a residual only over leading axes ([1, S, D] or [S, D] "
                "against [B, S, D]).")


def _full_operand(m) -> str | None:
    """The addend ("x" or "residual") that has the sum's dims, or None."""
    want = m.shape("sum").dims
    return next((name for name in ("x", "residual") if m.shape(name).dims == want), None)


def operands_match_norm_input(m, ctx) -> Miss | None:
    """One addend has the normalized sum's dims; the other equals them or repeats over leading
    axes only (ViT's [1, S, D] position embeddings), varying from row to row: a residual that
    broadcasts a normalized or inner axis, or is the same for every row (a per-feature bias:
    the producing matmul's epilogue takes it), is refused."""
    want = m.shape("sum").dims
    full = _full_operand(m)
    if full is None:
        return fail(MissReason.SHAPE_MISMATCH, hint=_SHAPES_HINT,
                    detail=f"x {m.shape('x').dims} + residual {m.shape('residual').dims} "
                           f"enlarges both to {want}: neither addend has the sum's dims")
    other = "residual" if full == "x" else "x"
    have = m.shape(other).dims
    axis = m.op("norm").axis % len(want) if want else 0
    padded = (1,) * (len(want) - len(have)) + tuple(have)
    if padded[axis:] != want[axis:]:
        return fail(MissReason.SHAPE_MISMATCH, hint=_SHAPES_HINT,
                    detail=f"{other} has dims {have}, which broadcast the normalized axes "
                           f"of the norm input {want}")
    lead = leading_broadcast_axes(want, have)
    if lead is None:
        return fail(MissReason.SHAPE_MISMATCH, hint=_SHAPES_HINT,
                    detail=f"{other} has dims {have}, which broadcast an inner (not leading) "
                           f"axis of the norm input {want}")
    if lead == axis and lead > 0:
        return fail(MissReason.SHAPE_MISMATCH,
                    hint="a per-feature addend is a bias, not a residual: where a matmul "
                         "makes the other addend, its epilogue takes the bias "
                         "(FuseMatMulBiasAct); otherwise the add stays before the norm. Only "
                         "an addend that varies row by row fuses as a residual.",
                    detail=f"{other} has dims {have}, the same for every row of the norm "
                           f"input {want}: a bias, not a residual")
    return None


def _residual_norm_rule(name: str, norm_cls, fused_cls) -> Rule:
    """One rule fusing `norm_cls(add(x, residual))` into `fused_cls`, exposing the sum when it
    escapes the match. The addend with the sum's full shape becomes the fused op's `x`.
    Its source is the line that calls this factory."""
    caller = sys._getframe(1)

    def build(b, m):
        norm = m.op("norm")
        expose = m.escapes("sum")
        op = fused_cls(eps=norm.eps, axis=norm.axis, has_gamma=norm.has_gamma,
                       has_beta=norm.has_beta, expose_sum=expose)
        full, other = ("x", "residual") if _full_operand(m) == "x" else ("residual", "x")
        ins = [m.v(full), m.v(other)] + [m.v(a) for a in _AFFINE if a in m.values]
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
