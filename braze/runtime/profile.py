"""`exe.profile(feeds)`: per-node time, bytes moved and achieved throughput of one program."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

__all__ = ["Profile", "profile_program"]


@dataclass
class ProfileRow:
    node: str
    kind: str
    implementation: str
    seconds: float
    flops: int
    bytes: int

    @property
    def gflops(self) -> float:
        return self.flops / self.seconds / 1e9 if self.seconds > 0 else 0.0

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass
class Profile:
    rows: list[ProfileRow]

    @property
    def total_seconds(self) -> float:
        return sum(r.seconds for r in self.rows)

    def by_kind(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for r in self.rows:
            out[r.kind] = out.get(r.kind, 0.0) + r.seconds
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def __str__(self) -> str:
        total = self.total_seconds
        lines = [f"Profile: {len(self.rows)} steps, {total * 1e3:.2f} ms"]
        lines.append("  by kind: " + ", ".join(f"{k} {t * 1e3:.2f} ms ({t / total:.0%})"
                                               for k, t in list(self.by_kind().items())[:8]))
        lines.append(f"  {'ms':>8} {'GFLOP/s':>9} {'GB/s':>7}  node")
        for r in sorted(self.rows, key=lambda r: -r.seconds):
            rate = f"{r.gflops:9.1f}" if r.flops > r.bytes else f"{'':9}"
            lines.append(f"  {r.seconds * 1e3:8.3f} {rate} {r.gbps:7.2f}  {r.node} "
                         f"({r.kind}: {r.implementation})")
        return "\n".join(lines)


def profile_program(prog, feeds, repeat: int = 3) -> Profile:
    runs = [prog.profile(feeds) for _ in range(max(repeat, 1))]
    rows = []
    for i, (step, _) in enumerate(runs[0]):
        secs = statistics.median(r[i][1] for r in runs)
        n = step.node
        who = (n.name or f"%{n.id}") + (f" [{n.provenance}]" if n.provenance else "")
        kind = " + ".join([n.op.label] + [a.op.label for a in step.absorbs])
        rows.append(ProfileRow(who, kind, step.kernel.name, secs, step.kernel.flops,
                               step.kernel.bytes))
    return Profile(rows)
