"""The pass protocol and `run_passes`: each pass returns a new graph plus what it did; the runner
can verify the graph and check numeric equivalence after every pass, naming the first pass that
breaks it and the passes that ran before."""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from ..errors import BrazeError, PassError
from ..ir.graph import Graph
from ..rewrite import MissedFusion, RewriteContext, Rule, RuleStats, rewrite


@dataclass
class PassResult:
    """What one pass did: the new graph, whether anything changed, rule stats, misses, time."""

    name: str
    graph: Graph
    changed: bool
    stats: dict[str, RuleStats] = field(default_factory=dict)
    misses: list[MissedFusion] = field(default_factory=list)
    seconds: float = 0.0


@runtime_checkable
class Pass(Protocol):
    """A graph-to-graph transformation. `run` must not mutate its input graph."""

    name: str

    def run(self, g: Graph, ctx: RewriteContext) -> PassResult: ...


@dataclass
class RulePass:
    """A pass made of declarative rules applied to a fixpoint by the rewrite driver."""

    name: str
    rules: Sequence[Rule]

    def run(self, g: Graph, ctx: RewriteContext) -> PassResult:
        t0 = time.perf_counter()
        res = rewrite(g, self.rules, ctx)
        return PassResult(self.name, res.graph, res.changed, res.stats, res.misses,
                          time.perf_counter() - t0)


@dataclass
class FunctionPass:
    """A pass written as a plain function `fn(g, ctx) -> (graph, changed)` (cleanup passes)."""

    name: str
    fn: object

    def run(self, g: Graph, ctx: RewriteContext) -> PassResult:
        t0 = time.perf_counter()
        out, changed = self.fn(g, ctx)
        return PassResult(self.name, out, changed, seconds=time.perf_counter() - t0)


def run_passes(
    g: Graph,
    passes: Sequence[Pass],
    ctx: RewriteContext | None = None,
    *,
    verify: bool = False,
    check_numerics: bool = False,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    seed: int = 0,
) -> tuple[Graph, list[PassResult]]:
    """Run `passes` in order. With `verify`, `bz.verify` runs after each pass; with
    `check_numerics`, each pass's output is interpreted on random inputs and compared with its
    input. Either failure raises PassError naming the pass and the passes before it."""
    ctx = ctx or RewriteContext()
    results: list[PassResult] = []
    probe = _NumericProbe(g, seed) if check_numerics else None
    cur = g
    for p in passes:
        if not callable(getattr(p, "run", None)):
            raise PassError(f"run_passes takes pass objects (with .name and .run(graph, ctx)), "
                            f"got {p!r}; a fusion by name: bz.fuse(g, target=...) or the "
                            "pipeline builder")
        try:
            res = p.run(cur, ctx)
        except PassError:
            raise
        except BrazeError as e:
            raise PassError(f"pass {p.name} failed{_after(results)}: {e}") from e
        if verify:
            from ..ir.verify import verify as verify_graph

            try:
                verify_graph(res.graph)
            except BrazeError as e:
                raise PassError(f"pass {p.name} produced an invalid graph{_after(results)}: "
                                f"{e}") from e
        if probe is not None and res.changed:
            probe.check(res.graph, p.name, results, rtol, atol)
        results.append(res)
        cur = res.graph
    return cur, results


def _after(results: list[PassResult]) -> str:
    if not results:
        return " (it ran first)"
    return " (after " + ", ".join(r.name for r in results) + ")"


class _NumericProbe:
    """Fixed random inputs and params, and the original graph's outputs on them."""

    def __init__(self, g: Graph, seed: int):
        from ..interpret import init_params, interpret, random_feeds

        self.feeds = random_feeds(g, seed)
        self.params = init_params(g, seed)
        self.expected = interpret(g, self.feeds, self.params)

    def check(self, g: Graph, name: str, results, rtol: float, atol: float) -> None:
        from ..interpret import interpret

        got = interpret(g, self.feeds, self.params)
        for i, (a, b) in enumerate(zip(self.expected, got, strict=True)):
            a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
            if a64.shape != b64.shape or not np.allclose(b64, a64, rtol=rtol, atol=atol):
                diff = np.max(np.abs(a64 - b64)) if a64.shape == b64.shape else "shape"
                raise PassError(f"pass {name} changed output {i} (max abs diff {diff})"
                                f"{_after(results)}")
