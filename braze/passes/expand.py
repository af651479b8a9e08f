"""Expand selected composite nodes into their decompositions, repeatedly, until none is left.
Unfuse (for autodiff), legalization (for backends without a kernel) and the ONNX exporter
(kinds without an ONNX mapping) all use this one mechanism, so they can never disagree with the
ops' own `decompose`."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..errors import BrazeError
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.op import Op, Value

MAX_DEPTH = 16


def expand_nodes(g: Graph, should_expand: Callable[[Op], bool]) -> tuple[Graph, bool]:
    """A new graph where every node whose op passes `should_expand` is replaced by its
    decomposition (recursively). Returns (graph, whether anything was expanded)."""
    return expand_where(g, lambda node, graph: should_expand(node.op))


def expand_where(g: Graph, should_expand: Callable[[Node, Graph], bool]) -> tuple[Graph, bool]:
    """Like `expand_nodes`, deciding per node (its op, inputs and types in its graph): composite
    nodes for which `should_expand(node, graph)` holds are decomposed, repeatedly."""
    changed = False
    test = lambda node, graph: node.op.composite and should_expand(node, graph)  # noqa: E731
    for _ in range(MAX_DEPTH):
        if not any(test(n, g) for n in g.nodes):
            return g, changed
        g = _expand_once(g, test)
        changed = True
    raise RecursionError("decompositions still produce expandable ops after 16 rounds")


def _expand_once(g: Graph, test: Callable[[Node, Graph], bool]) -> Graph:
    return replace_nodes(g, lambda node, graph: _decompose if test(node, graph) else None)


def _decompose(new: Graph, node: Node, ins: list[Value], old: Graph):
    return node.op.decompose(new, ins)


Builder = Callable[[Graph, Node, list[Value], Graph], "Value | tuple[Value, ...]"]


def replace_nodes(g: Graph, pick: Callable[[Node, Graph], Builder | None]) -> Graph:
    """One pass over `g` into a new graph: each node for which `pick(node, g)` returns a builder
    is replaced by what `builder(new_graph, node, new_inputs, g)` builds (its output value or
    values, one per node output); other nodes are copied. New nodes inherit the replaced node's
    provenance. Lowerings and decompositions both go through here."""
    new = Graph(g.name, record_provenance=False)
    vmap: dict[Value, Value] = {}
    for node in g.nodes:
        ins = [vmap[v] for v in node.inputs]
        build = pick(node, g)
        if build is not None:
            start = len(new.nodes)
            try:
                out = build(new, node, ins, g)
            except BrazeError as e:  # name the node being rewritten, once
                where = node.describe()
                if e.args and isinstance(e.args[0], str) and where not in e.args[0]:
                    e.args = (f"rewriting {where}: {e.args[0]}", *e.args[1:])
                raise
            outs = out if isinstance(out, tuple) else (out,)
            for i in range(start, len(new.nodes)):
                n = new.nodes[i]
                if n.provenance is None and node.provenance is not None:
                    new.nodes[i] = dataclasses.replace(n, provenance=node.provenance)
        else:
            outs = new.clone_node(node, ins, g)
        for old, nv in zip(node.values, outs, strict=True):
            vmap[old] = nv
    new.weights = {**new.weights, **g.weights}  # keep weights a builder added (inlined bodies)
    new.set_outputs([vmap[v] for v in g.outputs])
    return new
