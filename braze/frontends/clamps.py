"""Size clamps no binding decides, resolved by a checked assumption.

Models clamp slice bounds against constants: MPT cuts its ALiBi table with
`max(0, 64 - seq)`. Under braze's "symbols >= 2" rule `64 - seq` has no fixed sign, so the Max
is not a polynomial. Importers then take the expression itself (the clamp is a no-op) and record
that `64 - seq >= 0` must hold; the import is accepted only if a dynamic_narrow enforces each
such requirement at run time (its start, or the room after its end, is the expression), so a
binding that would need the clamp raises a ShapeError rather than computing a different slice."""
from __future__ import annotations

from ..errors import FrontendError
from ..ir.graph import Graph
from ..ir.ops.indexing import DynamicNarrow
from ..ir.symbolic import SymDim

__all__ = ["clamp_choice", "check_assumptions"]


def clamp_choice(a: SymDim, b: SymDim, is_max: bool) -> tuple[SymDim, SymDim] | None:
    """(value, requirement >= 0) for Max / Min of a constant bound and a symbolic expression
    whose order no binding decides; None when both are symbolic (no clamp to assume away)."""
    const, expr = (a, b) if a.is_const else (b, a)
    if not const.is_const or expr.is_const:
        return None
    return expr, (expr - const if is_max else const - expr)


def check_assumptions(g: Graph, assumed: list[SymDim], where: str) -> None:
    """FrontendError unless every assumed-nonnegative expression is a dynamic_narrow's start
    or the room after its end, both of which it checks whenever the graph runs."""
    checked: set[SymDim] = set()
    for n in g.nodes:
        if isinstance(n.op, DynamicNarrow):
            size = g.shape_of(n.inputs[0]).dims[n.op.axis]
            start = SymDim.of(n.op.start)
            checked |= {start, SymDim.of(size) - start - SymDim.of(n.op.length)}
    loose = [str(e) for e in assumed if e not in checked]
    if loose:
        raise FrontendError(
            f"{where}: the model clamps sizes (a max / min of a size and a constant) in a way no "
            f"binding decides; braze would need {', '.join(loose)} >= 0, which it relies on only "
            "for a slice bound it checks at run time, and this clamp feeds something else; fix "
            "the dims (static shapes) or remove the clamp in the model")
