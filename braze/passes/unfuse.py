"""Unfuse: expand every fused kind (and region) into primitives through the kinds' own
`decompose`, so autodiff and backends without fused kernels see plain ops."""
from __future__ import annotations

from ..ir.graph import Graph
from .expand import expand_nodes


def unfuse_fused_for_autodiff(g: Graph) -> Graph:
    """A new graph with no fused nodes; numerically equal to `g`. The input is not changed."""
    out, _ = expand_nodes(g, lambda op: op.fused)
    return out


def unfuse_pass(g: Graph, ctx) -> tuple[Graph, bool]:
    """`unfuse_fused_for_autodiff` as a FunctionPass body."""
    return expand_nodes(g, lambda op: op.fused)
