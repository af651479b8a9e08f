"""LegalizeBroadcast: for backends whose elementwise kernels only broadcast a scalar or a trailing
row (target constraint "trailing_broadcast_only"), operands of binary, compare and where ops that
broadcast any other way (a [4, 1] column against [4, 6], a [B, 1, S] mask against [B, H, S])
are materialized with an explicit `expand`.

An operand of rank r is expanded to the output's trailing r dims (the smallest expansion that
meets the constraint: a [2, 1, 1] operand of a [3, 2, 5, 7] output becomes [2, 5, 7], which
then broadcasts as a trailing block). Symbolic dims stay symbolic. Operands already legal are
left alone, and which nodes change is exactly what the constraint's predicate
(constraints.broadcasts_trailing_only) refuses, so legality and lowering never disagree.

Registered as a Lowering that fixes "trailing_broadcast_only", so `bz.rewrite_for_backend` uses
it for targets with that constraint; `LegalizeBroadcast(g)` rewrites every such node."""
from __future__ import annotations

from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.op import OP_REGISTRY, Value
from .constraints import broadcasts_trailing_only, trailing_broadcast_operand
from .lower.registry import Lowering, register_lowering

__all__ = ["BROADCAST_KINDS", "LEGALIZE_BROADCAST", "LegalizeBroadcast",
           "materialize_broadcasts"]

# elementwise kinds with several operands: binary, compare, where (read off the registry)
BROADCAST_KINDS = frozenset(k for k, cls in OP_REGISTRY.items()
                            if cls.elementwise and cls.arity != 1)


def materialize_broadcasts(g: Graph, node: Node, ins: list[Value], old: Graph) -> Value:
    """Build `node` in `g` reading `ins`, each operand that broadcasts other than as a scalar
    or a trailing block expanded to the output's trailing dims of its rank."""
    out = old.shape_of(node.values[0]).dims
    legal = []
    for v_old, v in zip(node.inputs, ins, strict=True):
        dims = old.shape_of(v_old).dims
        if trailing_broadcast_operand(dims, out):
            legal.append(v)
        else:
            legal.append(g.expand(v, out[len(out) - len(dims):]))
    return g.clone_node(node, legal, old)[0]


def _breaks_trailing_broadcast(node: Node, g: Graph) -> bool:
    return not broadcasts_trailing_only(node, g)


LEGALIZE_BROADCAST = Lowering(
    "LegalizeBroadcast", BROADCAST_KINDS, materialize_broadcasts,
    when=_breaks_trailing_broadcast, fixes="trailing_broadcast_only",
    doc="operands of binary / compare / where that broadcast other than as a scalar or a "
        "trailing block -> expand to the output's trailing dims")
LegalizeBroadcast = register_lowering(LEGALIZE_BROADCAST)
