"""Lowerings as data. A `Lowering` rewrites nodes of some op kinds into other ops: the control
flow, dot_general, off-axis reductions, loss and backward ops, batch/group norm, resize and the
logical kernels each register one in their own file of this package. A lowering is usable two
ways, from one definition:

- as a pass (`LowerDotGeneral.run(g, ctx)` or `LowerDotGeneral(g)`), rewriting every node it
  applies to;
- by `bz.rewrite_for_backend(g, target)`, which applies it only to the nodes the target cannot
  run: nodes whose label the target does not claim (`fixes=None`), or nodes that break the
  target constraint the lowering `fixes` (e.g. "reduce_last_axis_only").

Composite kinds need no entry: their `decompose` is their default lowering."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ...ir.graph import Graph
from ...ir.node import Node
from ...rewrite import RewriteContext
from ..base import PassResult
from ..expand import Builder, replace_nodes


def _always(node: Node, g: Graph) -> bool:
    return True


@dataclass(frozen=True)
class Lowering:
    """Rewrite nodes of `kinds` for which `when(node, graph)` holds with `build(new_graph, node,
    new_inputs, old_graph) -> output value(s)`. `fixes` names the target constraint it satisfies,
    or None when it lowers ops a target does not claim."""

    name: str
    kinds: frozenset[str]
    build: Builder
    when: Callable[[Node, Graph], bool] = _always
    fixes: str | None = None
    doc: str = ""

    def applies(self, node: Node, g: Graph) -> bool:
        return node.op.kind in self.kinds and self.when(node, g)


@dataclass
class LoweringPass:
    """A Lowering run as a pass over every node it applies to. Calling it on a graph returns
    the lowered graph; the input graph is never changed."""

    lowering: Lowering
    name: str = field(init=False)

    def __post_init__(self):
        self.name = self.lowering.name

    def run(self, g: Graph, ctx: RewriteContext | None = None) -> PassResult:
        t0 = time.perf_counter()
        low = self.lowering
        if not any(low.applies(n, g) for n in g.nodes):
            return PassResult(self.name, g, False, seconds=time.perf_counter() - t0)
        out = replace_nodes(g, lambda n, gg: low.build if low.applies(n, gg) else None)
        return PassResult(self.name, out, True, seconds=time.perf_counter() - t0)

    def __call__(self, g: Graph) -> Graph:
        return self.run(g).graph


LOWERINGS: dict[str, Lowering] = {}


def register_lowering(lowering: Lowering) -> LoweringPass:
    """Add `lowering` to the registry `rewrite_for_backend` consults; returns it as a pass."""
    if lowering.name in LOWERINGS and LOWERINGS[lowering.name] is not lowering:
        raise ValueError(f"lowering {lowering.name!r} registered twice")
    LOWERINGS[lowering.name] = lowering
    return LoweringPass(lowering)


def lowerings_for(kind: str) -> list[Lowering]:
    """Registered lowerings that rewrite `kind`, in registration order."""
    return [lw for lw in LOWERINGS.values() if kind in lw.kinds]
