"""`forward_only(g)`: the graph as a forward run sees it. `stop_gradient` is the identity
except to autodiff, and a compiled executable only runs forward (gradients are graphs made
before compiling), so each one is dropped, and a `where(c, x, x)` it leaves (an imported
`nn.Embedding(padding_idx=...)` selects the padding rows' stopped copy) becomes x: the
embedding runs as a plain gather instead of an element-wise region. A region a graph was
fused into before compiling keeps its body's stop_gradient; generated region code reads it
as the identity."""
from __future__ import annotations

from ..ir.graph import Graph
from ..rewrite import P, Rule, V, rewrite
from .canonicalize.simplify import WHERE_SAME
from .cleanup import dead_code_elimination

__all__ = ["forward_only", "DROPPED_KINDS"]

DROPPED_KINDS = frozenset({"stop_gradient"})  # op kinds no executable holds

DROP_STOP_GRADIENT = Rule("DropStopGradient", lambda b, m: m.v("x"),
                          pattern=P.stop_gradient(V("x")))


def forward_only(g: Graph) -> Graph:
    """`g` without its stop_gradient nodes (and the where(c, x, x) they leave); `g` itself
    when it has none."""
    if not any(n.op.kind in DROPPED_KINDS for n in g.nodes):
        return g
    out = rewrite(g, [DROP_STOP_GRADIENT, WHERE_SAME]).graph
    return dead_code_elimination(out)[0]
