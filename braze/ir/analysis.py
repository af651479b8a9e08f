"""Graph analyses shared by passes, the report and the executor."""
from __future__ import annotations

from .graph_core import GraphCore
from .ops.io import Input

__all__ = ["weight_prep_nodes"]


def weight_prep_nodes(g: GraphCore) -> set[int]:
    """Ids of non-source nodes computed from params, constants and dims alone (no graph input
    reaches them): weight preparation - concatenated QKV weights, BatchNorm folded into conv
    weights, transposed or cast weights - which runs once per weights update, not per call."""
    static = [False] * len(g.nodes)
    for n in g.nodes:
        if not isinstance(n.op, Input):
            static[n.id] = all(static[v.node] for v in n.inputs)
    return {n.id for n in g.nodes if static[n.id] and not n.op.source}
