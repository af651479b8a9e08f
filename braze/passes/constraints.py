"""Target constraints: demands a backend makes on ops it claims, each a name, a description and
a predicate. `SATISFIES[name](node, graph)` is True when `node` meets the demand; nodes of kinds
a constraint does not mention always meet it. Lowerings that fix a constraint use the same
predicate to pick their nodes, so legality and lowering can never disagree."""
from __future__ import annotations

from collections.abc import Callable

from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.shapes import normalize_axis

_AXIS_KINDS = ("argmax", "cumsum", "softmax", "log_softmax")


def reduces_last_axis_only(node: Node, g: Graph) -> bool:
    """Reductions (reduce, argmax, cumsum, softmax, log_softmax) act on the trailing axis."""
    op = node.op
    if op.kind not in ("reduce", *_AXIS_KINDS):
        return True
    rank = g.shape_of(node.inputs[0]).rank
    if op.kind == "reduce":
        return rank == 0 or tuple(op.axes) == (rank - 1,)
    return normalize_axis(op.axis, rank) == rank - 1


def trailing_broadcast_operand(dims: tuple, out: tuple) -> bool:
    """Whether an operand of `dims` broadcasts to `out` as a scalar or a trailing block: its
    dims, leading size-1 axes stripped, equal the trailing axes of `out`."""
    start = 0
    while start < len(dims) and dims[start] == 1:
        start += 1
    rest = tuple(dims[start:])
    return not rest or rest == tuple(out[len(out) - len(rest):])


def broadcasts_trailing_only(node: Node, g: Graph) -> bool:
    """Every operand of an elementwise op, leading size-1 axes stripped, equals the trailing
    axes of the output (a scalar, a row, or the full shape)."""
    if not node.op.elementwise or len(node.inputs) < 2:
        return True
    out = g.shape_of(node.values[0]).dims
    return all(trailing_broadcast_operand(g.shape_of(v).dims, out) for v in node.inputs)


CONSTRAINTS: dict[str, str] = {
    "reduce_last_axis_only": "reductions over the trailing axis only",
    "trailing_broadcast_only": "elementwise operands broadcast only as a scalar or a trailing "
                               "row of the output (no size-1 axes inside)",
}

SATISFIES: dict[str, Callable[[Node, Graph], bool]] = {
    "reduce_last_axis_only": reduces_last_axis_only,
    "trailing_broadcast_only": broadcasts_trailing_only,
}


def violated(node: Node, g: Graph, constraints) -> list[str]:
    """The names in `constraints` that `node` breaks."""
    return [c for c in constraints if not SATISFIES[c](node, g)]
