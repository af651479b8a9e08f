"""Shared pieces of the rules for composite ops whose VJP uses a backward op: the JVP is taken
through the op's own decomposition (forward mode cannot transpose a VJP built from backward ops,
which have no rules of their own), and `first_cotangent` guards the common "no cotangent" case.

Backward ops carry no VJP rule on purpose: `prepare_graph_for_ad` decomposes them into
primitives, so a gradient graph can be differentiated again (hvp, nth-order)."""
from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.op import Value
from ..forward import push_tangents


class _Identity(dict):
    """A value map that maps every value to itself (the decomposition is built in place)."""

    def __missing__(self, key):
        return key


def jvp_through_decomposition(b: Graph, node: Node, ins: Sequence[Value],
                              outs: Sequence[Value], tangents: Sequence[Value | None]
                              ) -> list[Value | None]:
    """The JVP of a composite node: rebuild its decomposition from `ins` in `b` and push the
    input tangents through the primitives it is made of."""
    start = len(b.nodes)
    built_out = node.op.decompose(b, list(ins))
    built_out = list(built_out) if isinstance(built_out, tuple) else [built_out]
    seeds = {v: t for v, t in zip(ins, tangents) if t is not None}
    tans = push_tangents(SimpleNamespace(nodes=b.nodes[start:]), b, _Identity(), seeds)
    return [tans.get(v) for v in built_out]
