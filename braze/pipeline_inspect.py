"""`bz.inspect_pipeline(g, target)`: the graph at every stage of compilation, as text. Stages:
as built, after each pass of `bz.fuse`'s pipeline that changed it, legalized for the target
(`bz.rewrite_for_backend`, with the target's dispatch report), and the compiled executor's plan
(kernel per node, memory plan). `dump_dir=` writes one numbered file per stage and an index.

This sits above the runtime (it compiles), so it lives beside the CLI, not in passes/."""
from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .errors import BrazeError
from .ir.graph import Graph


class Stage(NamedTuple):
    """One stage of the pipeline: its name and the text dump of its result."""

    name: str
    text: str


@dataclass
class PipelineInspection:
    """The graph at every pipeline stage. `stages` lists (name, text) in order; `summaries`
    says per stage what changed (node count and op-kind deltas); `unchanged` names the passes
    that left the graph as it was (they have no stage); `report` is the FusionReport and
    `executable` the compiled executor (None when the plan stage was skipped)."""

    graph_name: str
    target: str
    stages: list[Stage] = field(default_factory=list)
    summaries: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    report: object = None
    executable: object = None

    def stage(self, name: str) -> str:
        """The text of the last stage called `name` (KeyError when there is none)."""
        for s in reversed(self.stages):
            if s.name == name:
                return s.text
        raise KeyError(f"no stage {name!r}; stages: {[s.name for s in self.stages]}")

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    def file_names(self) -> list[str]:
        """The file each stage is written to by `write`: 00_built.txt, 01_<pass>.txt, ..."""
        width = max(2, len(str(len(self.stages) - 1)))
        return [f"{i:0{width}d}_{_file_safe(s.name)}.txt" for i, s in enumerate(self.stages)]

    def index(self) -> str:
        """One line per stage (number, name, what changed) plus the passes that changed
        nothing."""
        lines = [f"Pipeline inspection of {self.graph_name!r} for target {self.target}: "
                 f"{len(self.stages)} stages"]
        lines += [f"  {f:<44} {summary}" for f, summary in zip(self.file_names(), self.summaries,
                                                              strict=True)]
        if self.unchanged:
            lines += textwrap.wrap("passes that changed nothing: " + ", ".join(self.unchanged),
                                   width=98, initial_indent="  ", subsequent_indent="    ")
        return "\n".join(lines)

    def __str__(self) -> str:
        parts = [self.index()]
        for f, s, summary in zip(self.file_names(), self.stages, self.summaries, strict=True):
            parts.append(f"\n== {f.removesuffix('.txt')}: {summary} ==\n{s.text}")
        return "\n".join(parts)

    def write(self, dump_dir: str | os.PathLike) -> list[str]:
        """Write each stage to its numbered file and the index to index.txt under `dump_dir`
        (created if missing). Returns the paths written, index last."""
        os.makedirs(dump_dir, exist_ok=True)
        paths = []
        for name, s, summary in zip(self.file_names(), self.stages, self.summaries, strict=True):
            path = os.path.join(dump_dir, name)
            with open(path, "w") as f:
                f.write(f"# stage {s.name}: {summary}\n{s.text}\n")
            paths.append(path)
        path = os.path.join(dump_dir, "index.txt")
        with open(path, "w") as f:
            f.write(self.index() + "\n")
        return paths + [path]


def inspect_pipeline(g: Graph, target: str = "cpu", *, dump_dir: str | os.PathLike | None = None,
                     compile: bool = True, feeds: Mapping[str, np.ndarray] | None = None,
                     symbols: Mapping[str, int] | None = None, **options) -> PipelineInspection:
    """The text of `g` at every stage of compiling it for `target`: "built", then each pass of
    `bz.fuse`'s pipeline that changed it (named after the pass), "legalized" (`g` made legal by
    `bz.rewrite_for_backend`, with `bz.dispatch_report`), and "compiled" (the executor's kernel
    per node and memory plan). The plan needs the symbolic dims bound: from `feeds`, else random
    feeds with `symbols` (unbound dims are 3); params without values get random weights. With
    `compile=False`, or when the graph cannot be compiled, the plan stage is replaced by a note.
    `options` switch pipeline steps as for `bz.fuse`. `g` is not changed."""
    from .passes.legalize import LegalizeError, dispatch_report, rewrite_for_backend
    from .passes.pipeline import compile_pipeline

    pipeline = compile_pipeline(target, **options)
    out = PipelineInspection(g.name, pipeline.target.name)
    _add(out, "built", g, None, str(g))
    fused, results, out.report = pipeline.run_traced(g)
    prev = g
    for res in results:
        if not res.changed:
            out.unchanged.append(res.name)
            continue
        _add(out, res.name, res.graph, prev, str(res.graph))
        prev = res.graph
    try:
        legal, note = rewrite_for_backend(fused, pipeline.target), ""
    except LegalizeError as e:
        legal, note = rewrite_for_backend(fused, pipeline.target, strict=False), f"\n{e}"
    text = f"{legal}\n\n{dispatch_report(legal, pipeline.target)}{note}"
    _add(out, "legalized", legal, fused, text, "" if legal is not fused else "unchanged")
    if compile:
        _add_compiled(out, legal, feeds, symbols)
    else:
        _add_note(out, "compiled", "skipped (compile=False)")
    if dump_dir is not None:
        out.write(dump_dir)
    return out


def _add_compiled(out: PipelineInspection, legal: Graph, feeds, symbols) -> None:
    """The compiled executor's plan for `legal` (already fused and legalized for the target),
    or a note saying why there is none."""
    from .interpret import init_params, random_feeds
    from .runtime import compile as compile_graph

    try:
        feeds = dict(feeds) if feeds is not None else random_feeds(legal, 0, symbols)
        missing = [n.op.name for n in legal.params if n.op.name not in legal.weights]
        params = init_params(legal, 0) if missing else {}
        exe = compile_graph(legal, params=params, fuse=False)
        with np.errstate(all="ignore"):  # random weights may make weight preparation NaN
            dispatch = exe.dispatch_report(feeds)
        prog = exe.program(feeds)
    except (BrazeError, NotImplementedError) as e:
        _add_note(out, "compiled", f"skipped: the graph cannot be compiled ({e})")
        return
    out.executable = exe
    if exe.graph is not legal:
        _add(out, "kernel_legalized", exe.graph, legal, str(exe.graph))
    bound = ", ".join(f"{k}={v}" for k, v in sorted(prog.symbols.items())) or "none"
    weights = " (random weights for params without values)" if missing else ""
    text = (f"compiled by braze's executor (graph legalized for {out.target}); symbolic dims "
            f"bound: {bound}{weights}\n{len(prog.steps)} kernel steps\n\n{dispatch}\n\n"
            f"Memory plan: {prog.plan}")
    out.stages.append(Stage("compiled", text))
    out.summaries.append(f"{len(prog.steps)} kernel steps, {prog.plan.summary()}")


def _add(out: PipelineInspection, name: str, g: Graph, prev: Graph | None, text: str,
         extra: str = "") -> None:
    out.stages.append(Stage(name, text))
    summary = f"{len(g.nodes)} nodes"
    if prev is not None:
        delta = _count_delta(prev.op_counts(), g.op_counts())
        summary = f"{len(prev.nodes)} -> {len(g.nodes)} nodes" + (f" ({delta})" if delta else "")
    out.summaries.append(summary + (f", {extra}" if extra else ""))


def _add_note(out: PipelineInspection, name: str, note: str) -> None:
    out.stages.append(Stage(name, note))
    out.summaries.append(note.split(" (")[0])


def _count_delta(before: dict[str, int], after: dict[str, int]) -> str:
    """'conv2d -2, fused_conv_bias_act +2': op kinds whose count changed."""
    kinds = sorted(set(before) | set(after))
    return ", ".join(f"{k} {after.get(k, 0) - before.get(k, 0):+d}" for k in kinds
                     if after.get(k, 0) != before.get(k, 0))


def _file_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "stage"


__all__ = ["PipelineInspection", "Stage", "inspect_pipeline"]
