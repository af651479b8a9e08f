"""Named checks shared by fusion rules. Each returns None (accept) or a Miss with a reason, so
the fusion report can quote exactly why a near match did not fuse."""
from __future__ import annotations

from ...errors import ShapeError
from ...ir.ops.elementwise import Unary
from ...ir.shapes import broadcast_dims
from ...rewrite import Miss, MissReason, fail


def target_claims(kind: str):
    """The target runs `kind` natively and its pipeline builds it (else UNSUPPORTED_BY_TARGET)."""

    def check(m, ctx) -> Miss | None:
        t = ctx.target
        if t is not None and not t.wants_fusion(kind):
            what = "build" if kind in t.claims or kind not in t.fusions else "claim"
            return fail(MissReason.UNSUPPORTED_BY_TARGET,
                        detail=f"target {t.name!r} does not {what} {kind}")
        return None

    check.__name__ = f"target_claims_{kind}"
    return check


def epilogue_activation_allowed(capture: str = "act"):
    """The captured activation (if any) is one the target applies in a matmul epilogue."""

    def check(m, ctx) -> Miss | None:
        node = m.nodes.get(capture)
        if node is None or ctx.target is None:
            return None
        op = node.op
        if isinstance(op, Unary) and op.fn not in ctx.target.epilogue_activations:
            return fail(MissReason.UNSUPPORTED_EPILOGUE_ACTIVATION,
                        detail=f"{op.fn.value} is not an epilogue activation of "
                               f"target {ctx.target.name!r}")
        return None

    return check


def rank_at_most(var: str, rank: int, reason: MissReason):
    """Captured value `var` has rank <= `rank`."""

    def check(m, ctx) -> Miss | None:
        if var in m.values and m.shape(var).rank > rank:
            return fail(reason, detail=f"{var} has shape {m.shape(var)}")
        return None

    check.__name__ = f"{var}_rank_at_most_{rank}"
    return check


def same_dtype(*names: str):
    """All named captures share one dtype."""

    def check(m, ctx) -> Miss | None:
        dts = {m.shape(n).dtype for n in names if n in m.values or n in m.nodes}
        if len(dts) > 1:
            return fail(MissReason.DTYPE_MISMATCH, detail=", ".join(str(d) for d in dts))
        return None

    return check


def broadcasts_onto(product: str, operand: str):
    """Captured `operand` broadcasts onto captured `product` without enlarging it ([N] or [1]
    onto [..., N]; not [k] onto [..., 1]): a fusion never changes a value's shape."""

    def check(m, ctx) -> Miss | None:
        if operand not in m.values:
            return None
        p, o = m.shape(product), m.shape(operand)
        try:
            out = broadcast_dims(p.dims, o.dims)
        except ShapeError:
            out = None
        if out != p.dims:
            return fail(MissReason.SHAPE_MISMATCH,
                        hint="the operand is larger than the product it is applied to, so the "
                             "op broadcasts the product up; a fused epilogue cannot change the "
                             "product's shape. Keep the op separate.",
                        detail=f"{operand} {o} would enlarge the product {p} to "
                               f"{p.with_dims(out) if out is not None else 'an invalid shape'}")
        return None

    check.__name__ = f"{operand}_broadcasts_onto_{product}"
    return check
