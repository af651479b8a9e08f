"""`FusionReport`: node counts per op kind before and after, fused kinds, misses with reasons and
hints, per-pass time and per-rule match statistics. Renderers: text, one-line summary, JSON,
HTML."""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..ir.analysis import weight_prep_nodes
from ..ir.graph import Graph
from ..rewrite.driver import RuleStats
from ..rewrite.miss import MissedFusion, MissReason

_TRACKED = ("matmul", "attention", "rope", "narrow", "silu", "mul", "add", "layer_norm",
            "rms_norm", "gelu", "conv2d", "batch_norm")


@dataclass
class FusionReport:
    """What a fusion pipeline did to one graph."""

    graph_name: str
    target: str
    nodes_before: int
    nodes_after: int
    counts_before: dict[str, int]
    counts_after: dict[str, int]
    misses: list[MissedFusion] = field(default_factory=list)
    pass_times: list[tuple[str, float]] = field(default_factory=list)
    rule_stats: dict[str, RuleStats] = field(default_factory=dict)
    weight_prep_before: int = 0
    weight_prep_after: int = 0

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def analyze(cls, before: Graph, after: Graph, results: Sequence = (), target: str = "") -> (
            FusionReport):
        """Compare two graphs; `results` (PassResults) add misses, timings and rule stats."""
        misses: dict[tuple, MissedFusion] = {}
        stats: dict[str, RuleStats] = {}
        times = []
        for r in results:
            times.append((r.name, r.seconds))
            for m in r.misses:
                misses.setdefault((m.pattern, m.context, m.reason, m.detail), m)
            for k, s in r.stats.items():
                stats.setdefault(k, RuleStats(s.rule, s.source)).merge(s)
        prep_before, prep_after = weight_prep_nodes(before), weight_prep_nodes(after)
        return cls(before.name, target, _live(before) - len(prep_before),
                   _live(after) - len(prep_after), before.op_counts(), after.op_counts(),
                   list(misses.values()), times, stats, len(prep_before), len(prep_after))

    @classmethod
    def scan(cls, g: Graph, target: str = "cpu", **options) -> FusionReport:
        """What `bz.fuse(g, target)` would fuse and miss, without keeping the fused graph."""
        from ..passes.pipeline import fuse

        return fuse(g, target, **options)[1]

    # -- queries --------------------------------------------------------------------------------
    @property
    def fused_counts(self) -> dict[str, int]:
        """Fused kinds present after fusion (label -> count)."""
        from ..ir.op import OP_REGISTRY

        fused = {k for k, c in OP_REGISTRY.items() if c.fused}
        return {k: v for k, v in sorted(self.counts_after.items()) if k in fused or
                k.startswith("fused_") or k == "elementwise_region"}

    @property
    def missed(self) -> list[MissedFusion]:
        """The fusions that did not happen (same as `misses`)."""
        return self.misses

    def count(self, label: str, when: str = "after") -> int:
        counts = self.counts_after if when == "after" else self.counts_before
        return counts.get(label, 0)

    def misses_by_reason(self) -> dict[MissReason, list[MissedFusion]]:
        out: dict[MissReason, list[MissedFusion]] = {}
        for m in self.misses:
            out.setdefault(m.reason, []).append(m)
        return out

    @property
    def total_seconds(self) -> float:
        return sum(t for _, t in self.pass_times)

    # -- renderers ------------------------------------------------------------------------------
    def summary_line(self) -> str:
        """One line for logs and CSV."""
        fused = ",".join(f"{k}={v}" for k, v in self.fused_counts.items()) or "none"
        return (f"{self.graph_name} target={self.target} nodes={self.nodes_before}->"
                f"{self.nodes_after} fused[{fused}] misses={len(self.misses)} "
                f"time={self.total_seconds * 1e3:.1f}ms")

    def __str__(self) -> str:
        lines = [f"Fusion report for {self.graph_name!r} (target {self.target or '-'})",
                 f"  nodes: {self.nodes_before} -> {self.nodes_after}"]
        if self.weight_prep_before or self.weight_prep_after:
            lines.append(f"  weight preparation (runs once per weights update, not per call): "
                         f"{self.weight_prep_before} -> {self.weight_prep_after} nodes")
        if self.fused_counts:
            lines.append("  fused:")
            lines += [f"    {k:<28} {v}" for k, v in self.fused_counts.items()]
        kinds = [k for k in _TRACKED if self.count(k, "before") or self.count(k)]
        if kinds:
            lines.append("  op counts (before -> after):")
            lines += [f"    {k:<28} {self.count(k, 'before')} -> {self.count(k)}" for k in kinds]
        if self.misses:
            lines.append(f"  not fused ({len(self.misses)}):")
            for reason, ms in self.misses_by_reason().items():
                lines.append(f"    {reason.value} x{len(ms)}")
                shown = ms[:5]
                for hint in dict.fromkeys(m.hint for m in shown):  # each under its own hint
                    for m in shown:
                        if m.hint == hint:
                            d = f" ({m.detail})" if m.detail else ""
                            lines.append(f"      {m.pattern} at {m.context}{d}")
                    lines.append(f"      hint: {hint}")
                if len(ms) > 5:
                    lines.append(f"      ... and {len(ms) - 5} more")
        else:
            lines.append("  not fused: nothing (no near misses)")
        if self.pass_times:
            lines.append(f"  passes ({self.total_seconds * 1e3:.1f} ms):")
            lines += [f"    {n:<32} {t * 1e3:8.2f} ms" for n, t in self.pass_times]
        active = [s for s in self.rule_stats.values() if s.attempts or s.near_misses]
        if active:
            lines.append("  rules (attempts / matches / near misses):")
            lines += [f"    {s.rule:<28} {s.attempts:5d} / {s.matches:4d} / {s.near_misses:4d}"
                      f"   {s.source}" for s in active]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "graph": self.graph_name, "target": self.target,
            "nodes_before": self.nodes_before, "nodes_after": self.nodes_after,
            "weight_prep_before": self.weight_prep_before,
            "weight_prep_after": self.weight_prep_after,
            "counts_before": self.counts_before, "counts_after": self.counts_after,
            "fused": self.fused_counts,
            "misses": [m.to_dict() for m in self.misses],
            "pass_times": [{"pass": n, "seconds": t} for n, t in self.pass_times],
            "rules": [{"rule": s.rule, "source": s.source, "attempts": s.attempts,
                       "matches": s.matches, "near_misses": s.near_misses,
                       "seconds": s.seconds} for s in self.rule_stats.values()],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def to_html(self, before: Graph | None = None, after: Graph | None = None) -> str:
        """A standalone HTML page: summary, misses table, and the before/after text IR."""
        from .html import render_html

        return render_html(self, before, after)


def _live(g: Graph) -> int:
    """Non-source nodes (the model's computation, weight preparation included)."""
    return sum(1 for n in g.nodes if not n.op.source)
