"""Cleanup passes: dead code elimination and common subexpression elimination. Both are one
linear sweep that rebuilds a new graph (the input is never mutated) and return
`(graph, changed)`; `DCE_PASS` and `CSE_PASS` wrap them as FunctionPasses."""
from __future__ import annotations

from ..ir.graph import Graph
from ..ir.op import Value
from ..ir.ops.elementwise import Binary
from ..ir.ops.io import Input, Param
from ..rewrite import RewriteContext
from .base import FunctionPass

__all__ = ["dead_code_elimination", "common_subexpression_elimination", "DCE_PASS", "CSE_PASS"]


def dead_code_elimination(g: Graph, ctx: RewriteContext | None = None) -> tuple[Graph, bool]:
    """Drop every node the outputs do not need. Graph inputs are always kept (they are the
    graph's signature); unused params are dropped together with their weights."""
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
        return g, False
    new = Graph(g.name, record_provenance=False)
    vmap: dict[Value, Value] = {}
    for node in g.nodes:
        if live[node.id]:
            vmap.update(zip(node.values, new.clone_node(node, [vmap[v] for v in node.inputs], g)))
    kept = {n.op.name for n in new.params}
    new.weights = {k: w for k, w in g.weights.items() if k in kept}
    new.set_outputs([vmap[v] for v in g.outputs])
    return new, True


def common_subexpression_elimination(g: Graph, ctx: RewriteContext | None = None
                                     ) -> tuple[Graph, bool]:
    """Merge nodes with equal ops (compared by attributes; constants by bytes; regions by
    body contents) reading identical inputs (either order for commutative binaries). Inputs
    and params are never merged. The first node survives with its name and provenance; later
    duplicates map onto it."""
    new = Graph(g.name, record_provenance=False)
    vmap: dict[Value, Value] = {}
    seen: dict[tuple, tuple[Value, ...]] = {}
    changed = False
    for node in g.nodes:
        ins = tuple(vmap[v] for v in node.inputs)
        key = None if isinstance(node.op, (Input, Param)) else _key(node.op, ins)
        outs = seen.get(key) if key is not None else None
        if outs is None:
            outs = new.clone_node(node, ins, g)
            if key is not None:
                seen[key] = outs
        else:
            changed = True
        vmap.update(zip(node.values, outs))
    if not changed:
        return g, False
    new.weights = dict(g.weights)
    new.set_outputs([vmap[v] for v in g.outputs])
    return new, True


def _key(op, ins: tuple[Value, ...]) -> tuple | None:
    """A hashable identity of `op(ins)` (commutative binaries in operand-independent order),
    or None for an op that cannot be hashed."""
    if isinstance(op, Binary) and op.fn.commutative:
        ins = tuple(sorted(ins, key=lambda v: (v.node, v.index)))
    key = (op, ins)
    try:
        hash(key)
    except TypeError:
        return None
    return key


DCE_PASS = FunctionPass("DeadCodeElimination", dead_code_elimination)
CSE_PASS = FunctionPass("CommonSubexpressionElimination", common_subexpression_elimination)
