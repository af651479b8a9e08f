"""Cleanup passes: dead code elimination and common subexpression elimination. Both are one
linear sweep that rebuilds a new graph (the input is never mutated) and return
`(graph, changed)`; `DCE_PASS` and `CSE_PASS` wrap them as FunctionPasses."""
from __future__ import annotations

from ..ir.graph import Graph
from ..ir.op import Value
from ..ir.ops.elementwise import Binary
from ..ir.ops.io import Input, Param
from ..rewrite import RewriteContext
from ..rewrite.dispatch import KindsPresent
from .base import FunctionPass

__all__ = ["dead_code_elimination", "eliminate_dead_code", "common_subexpression_elimination",
           "DCE_PASS", "CSE_PASS"]


def dead_code_elimination(g: Graph, ctx: RewriteContext | None = None) -> tuple[Graph, bool]:
    """Drop every node the outputs do not need. Graph inputs are always kept (they are the
    graph's signature); unused params are dropped together with their weights."""
    new, _ = eliminate_dead_code(g)
    return new, new is not g


def eliminate_dead_code(g: Graph) -> tuple[Graph, list[int | None]]:
    """`dead_code_elimination`, also giving each old node's id in the new graph (None when it
    was dropped). Returns `g` itself when nothing is dead."""
    live = [False] * len(g.nodes)
    for v in g.outputs:
        live[v.node] = True
    for node in reversed(g.nodes):
        if live[node.id]:
            for v in node.inputs:
                live[v.node] = True
        elif isinstance(node.op, Input):
            live[node.id] = True
    if all(live):
        return g, list(range(len(g.nodes)))
    new = Graph(g.name, record_provenance=False)
    new_id = new.copy_live(g, live)  # the live nodes in order, renumbered (types unchanged)
    kept = {n.op.name for n in new.params}
    new.weights = g.weights.carry(kept)
    new.set_outputs([Value(new_id[v.node], v.index) for v in g.outputs])
    return new, new_id


def common_subexpression_elimination(g: Graph, ctx: RewriteContext | None = None
                                     ) -> tuple[Graph, bool]:
    """Merge nodes with equal ops (compared by attributes; constants by bytes; regions by
    body contents) reading identical inputs (either order for commutative binaries). Inputs
    and params are never merged. The first node survives with its name and provenance; later
    duplicates map onto it. Returns `g` itself when no two nodes are equal (found by one scan
    that builds nothing)."""
    merged = _duplicates(g)
    if not merged:
        return g, False
    new = Graph(g.name, record_provenance=False)
    outs_of: list = [None] * len(g.nodes)  # old node id -> the new values it maps onto
    start = min(merged)
    outs_of[:start] = new.copy_prefix(g, start)  # before the first duplicate: as they are
    for node in g.nodes[start:]:
        first = merged.get(node.id)
        if first is not None:
            outs_of[node.id] = outs_of[first]
            continue
        ins = tuple([outs_of[v.node][v.index] for v in node.inputs])
        outs_of[node.id] = new.copy_node(node, ins)
    new.weights = g.weights.carry()
    new.set_outputs([outs_of[v.node][v.index] for v in g.outputs])
    kinds = KindsPresent.of(g).copy()  # the next rule pass reads them without a recount
    kinds.add_nodes((g.nodes[i] for i in merged), -1)
    KindsPresent.remember(new, kinds)
    return new, True


def _duplicates(g: Graph) -> dict[int, int]:
    """Node id -> id of the first equal node (ops equal, inputs the same after merging the
    duplicates before it), for every node CSE merges away; empty when there is none."""
    seen: dict[tuple, int] = {}
    merged: dict[int, int] = {}
    rep: dict[Value, Value] = {}  # a merged node's values -> the surviving node's
    for node in g.nodes:
        op = node.op
        if op.source and isinstance(op, (Input, Param)):
            continue
        ins = tuple([rep.get(v, v) for v in node.inputs]) if rep else node.inputs
        try:  # one hash of the op (an op with an unhashable attribute is never merged)
            first = seen.setdefault(_key(op, ins), node.id)
        except TypeError:
            continue
        if first != node.id:
            merged[node.id] = first
            rep.update(zip(node.values, g.nodes[first].values))
    return merged


def _key(op, ins: tuple[Value, ...]) -> tuple:
    """The identity of `op(ins)` (commutative binaries in operand-independent order)."""
    if isinstance(op, Binary) and op.fn.commutative and len(ins) == 2:
        a, b = ins
        if (b.node, b.index) < (a.node, a.index):
            ins = (b, a)
    return (op, ins)


DCE_PASS = FunctionPass("DeadCodeElimination", dead_code_elimination)
CSE_PASS = FunctionPass("CommonSubexpressionElimination", common_subexpression_elimination)
