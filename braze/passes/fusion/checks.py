"""Named checks shared by fusion rules. Each returns None (accept) or a Miss with a reason, so
the fusion report can quote exactly why a near match did not fuse."""
from __future__ import annotations

from ...ir.ops.elementwise import Unary
from ...rewrite import Miss, MissReason, fail


def target_claims(kind: str):
    """The target runs `kind` natively (else UNSUPPORTED_BY_TARGET)."""

    def check(m, ctx) -> Miss | None:
        t = ctx.target
        if t is not None and not t.claims_kind(kind):
            return fail(MissReason.UNSUPPORTED_BY_TARGET,
                        detail=f"target {t.name!r} does not claim {kind}")
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
