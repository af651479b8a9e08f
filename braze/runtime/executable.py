"""`bz.compile`: a graph becomes an `Executable` for a target.

compile = stop_gradient dropped (passes.forward_only) -> the target's fusion pipeline ->
half-precision matmuls, convs, attention, norms and reductions on float32 kernels
(passes.half_compute) -> (a precision policy) -> legalize (composite ops without a kernel
decompose into ops that have one) -> per binding of the symbolic dims, a Program (static
values computed once, one kernel per node, one arena). `exe(feeds)` runs the program for the
feeds' binding, building and caching it on first sight of that binding (the MAX_PROGRAMS most
recently used bindings stay cached). Calls from several Python threads take turns: a
program's arena holds one call's values at a time."""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

import numpy as np

from ..errors import BrazeError, InterpretError
from ..interpret import bind_symbols, check_narrows, check_small_binding, decomposition_graph
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.symbolic import dim_symbols
from ..passes.expand import expand_where
from ..passes.forward_only import forward_only
from ..passes.half_compute import compute_half_in_f32
from .arguments import build_limits, checked_params, compile_args, feeds_mapping
from .codegen import cc
from .codegen.builds import BuildLimits
from .kernels import KERNELS, Dispatch, KernelContext
from .kernels.threads import ThreadLimit
from .plan import SharedArena
from .program import Program, Step, build_program

__all__ = ["compile", "Executable", "KernelDispatchReport", "MAX_PROGRAMS"]

MAX_PROGRAMS = 16
"""Programs (one per binding of the symbolic dims) an executable keeps; the least recently
used goes first (a server seeing every sequence length from 1 to 400 had grown to 2.7 GB)."""


def _has_kernel(op) -> bool:
    return any(cls in KERNELS for cls in type(op).__mro__)


def compile(graph: Graph, target: str = "cpu", *, params: Mapping[str, np.ndarray] | None = None,
            precision=None, threads: int | None = None, fuse: bool = True,
            shared_arena: SharedArena | None = None, build_timeout: float | None = 600.0,
            max_kernels: int | None = None, progress: bool = True) -> Executable:
    """Compile `graph` for `target` ("cpu"). `params` supplies weights for params without
    stored values and replaces stored ones (as `bz.interpret` takes them); `precision`
    ("bf16", "f16" or a PrecisionPolicy) rounds matmul and conv operands to that type with f32
    accumulation; `threads` caps the kernels' threads; `fuse=False` skips the fusion pipeline
    (the graph runs as given, legalized); `shared_arena` lets executables that never run at
    the same time plan into one buffer (see SharedArena). Each binding's generated kernels
    are built in parallel before its first call; `build_timeout` (seconds, None: no limit)
    and `max_kernels` (new kernels, None: no limit) bound that per binding, the nodes left
    over running their references; `progress=False` silences the progress lines of long
    builds (codegen.builds). The executable takes the params' values as they are now: change
    them through `exe.update_weights`, not in place (packed weights would keep the old values
    while other steps read the new)."""
    params = compile_args(graph, target, params, precision, threads)
    limits = build_limits(build_timeout, max_kernels, progress)
    lower = partial(_lowered, graph, target, precision=precision, fuse=fuse)
    legal, report, decomposed = lower(params)
    return Executable(graph, legal, report, params, precision, threads, decomposed,
                      shared_arena, lower, limits)


def _lowered(graph: Graph, target: str, params: Mapping[str, np.ndarray], *, precision,
             fuse: bool) -> tuple[Graph, object, dict[str, int]]:
    """`graph` as the executor runs it (the fusion pipeline unless not `fuse`, the precision
    policy, half-precision compute on f32 kernels, legalization), its fusion report and the
    kinds decomposed. Params of `params` with stored values are fused with the given values:
    fusion bakes stored values in (QKV weights joined into one param, a BatchNorm folded into
    its conv), so replacing them after fusing would miss those."""
    from ..passes.pipeline import fuse as run_fusion
    from ..report import FusionReport

    stored = {k: v for k, v in params.items() if k in graph.weights}
    if stored:
        graph = graph.detached_copy()
        graph.weights.update_raw(stored)
    graph = forward_only(graph)  # an executable runs forward: stop_gradient is the identity
    if fuse:
        fused, report = run_fusion(graph, target)
    else:
        fused, report = graph, FusionReport.analyze(graph, graph, target=str(target))
    fused, _ = compute_half_in_f32(fused)  # f16 / bf16 models: matmuls, norms, ... on f32 kernels
    if precision is not None:  # after it, so an f16 model's (now f32) matmuls take the policy
        from ..passes.precision import apply_precision

        fused, _ = apply_precision(fused, precision)
    legal, decomposed = legalize_for_kernels(fused)
    return legal, report, decomposed


def legalize_for_kernels(g: Graph) -> tuple[Graph, dict[str, int]]:
    """Decompose composite nodes that have no kernel into ops that have one (repeatedly).
    A node whose decomposition cannot be built for its types (gather_backward decomposes only
    with static dims) stays as it is and runs its NumPy reference. Returns the graph and how
    many nodes of each kind were decomposed."""
    def expand(node: Node, graph: Graph) -> bool:
        return not _has_kernel(node.op) and _decomposes(node, graph)

    counts: dict[str, int] = {}
    for n in g.nodes:
        if n.op.composite and expand(n, g):
            counts[n.op.label] = counts.get(n.op.label, 0) + 1
    if not counts:
        return g, counts
    out, _ = expand_where(g, expand)
    return out, counts


def _decomposes(node: Node, g: Graph) -> bool:
    """Whether `node`'s decomposition can be built for its input types."""
    try:
        decomposition_graph(node.op, [g.shape_of(v) for v in node.inputs])
    except BrazeError:
        return False
    return True


def _check_bound(g: Graph, symbols: Mapping[str, int]) -> None:
    """Every symbol of `g` has a value: an executable binds them from the feeds' shapes only,
    so one that no input's shape names (a range of length "n") is an error naming the first
    node whose type needs it, not a KeyError from planning."""
    unbound = sorted(set(g.dynamic_symbols()) - set(symbols))
    if not unbound:
        return
    sym = unbound[0]
    node = next((n for n in g.nodes for s in n.outputs for d in s.dims
                 if sym in dim_symbols(d)), None)
    where = "" if node is None else f" (node {node.label}" + (
        f" from {node.provenance})" if node.provenance else ")")
    raise InterpretError(f"graph {g.name!r} has symbolic dim {', '.join(map(repr, unbound))}"
                         f"{where} that no input's shape binds, and an executable binds "
                         f"symbols from the feeds only; compile the graph bound instead: "
                         f"bz.compile(g.bind({{{sym!r}: ...}}))")


@dataclass
class KernelDispatchReport:
    """For every node of the executed graph: how it runs (native kernel, generated kernel,
    reference fallback, view, or static: computed once from weights), plus the composite kinds
    decomposed because no kernel runs them."""

    rows: list[tuple[str, str, str, str]]  # (node, kind, dispatch, implementation)
    decomposed: dict[str, int]
    note: str | None = None  # why C kernels fell back (no compiler, a failed build), if so

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, _, d, _ in self.rows:
            out[d] = out.get(d, 0) + 1
        return out

    def by_dispatch(self, dispatch: str) -> list[tuple[str, str, str, str]]:
        return [r for r in self.rows if r[2] == dispatch]

    def __str__(self) -> str:
        lines = ["Dispatch report: " + ", ".join(f"{k} {v}" for k, v in
                                                 sorted(self.counts().items()))]
        if self.decomposed:
            lines.append("  decomposed (no kernel): " + ", ".join(
                f"{k} x{v}" for k, v in sorted(self.decomposed.items())))
        ref = self.by_dispatch(Dispatch.REFERENCE)
        if ref:
            lines.append(f"  reference fallback ({len(ref)}):")
            if self.note:
                lines.append(f"    ({self.note})")
            lines += [f"    {node} ({kind}){_why_reference(kind, impl)}"
                      for node, kind, _, impl in ref]
        lines.append("  per node:")
        lines += [f"    {node:<48} {kind:<24} {d:<13} {impl}" for node, kind, d, impl in
                  self.rows]
        return "\n".join(lines)


def _why_reference(kind: str, impl: str) -> str:
    """`: reason` for a reference kernel named with its reason (reference_kernel's `why`)."""
    prefix = f"reference {kind} ("
    return f": {impl[len(prefix):-1]}" if impl.startswith(prefix) else ""


class Executable:
    """A compiled graph. Call it with feeds (input name -> array) for the outputs."""

    def __init__(self, source: Graph, graph: Graph, report, params: dict, precision, threads,
                 decomposed: dict[str, int], shared_arena: SharedArena | None = None,
                 lower: Callable | None = None, limits: BuildLimits | None = None):
        self.source = source
        self.graph = graph
        self.report = report
        self.precision = precision
        self.threads = min(int(threads), cc.usable_cpus()) if threads else None
        self.decomposed = decomposed
        self.shared_arena = shared_arena
        self._params = dict(params)
        self._lower = lower  # params -> (graph, report, decomposed): compile's lowering
        self.build_limits = limits or BuildLimits()
        self._weights = {**graph.weights, **params}
        self._programs: dict[tuple, Program] = {}
        self._by_shapes: dict[tuple, Program] = {}  # feed shapes -> program, checked before
        self._feed_types = tuple((n.op.name, n.op.shape.dtype.np) for n in graph.inputs)
        self._static: dict = {}
        self._last: Program | None = None
        self._limit = ThreadLimit(self.threads)
        self._turn = threading.RLock()  # one call at a time: the arena is shared

    def __reduce__(self):
        """Pickled as what it was compiled from (graphs, report, weights, precision, threads):
        the copy plans its programs again on its first calls, in its own arena (a
        SharedArena stays with this process). Pickling once failed on the lock and the
        kernels' closures, so a spawned worker could not be handed an executable."""
        return (Executable, (self.source, self.graph, self.report, self._params,
                             self.precision, self.threads, self.decomposed, None, self._lower,
                             self.build_limits))

    # -- running --------------------------------------------------------------------------------
    def program(self, feeds: Mapping[str, np.ndarray]) -> Program:
        """The program for the feeds' binding of the symbolic dims (built once, cached)."""
        return self._program_for(bind_symbols(self.graph, feeds))

    def _program_for(self, symbols: dict[str, int]) -> Program:
        key = tuple(sorted(symbols.items()))
        with self._turn:
            prog = self._programs.pop(key, None)
            if prog is None:
                _check_bound(self.graph, symbols)
                check_small_binding(self.graph, symbols)
                check_narrows(self.graph, symbols)
                ctx = KernelContext(threads=self.threads or 0, precision=self.precision,
                                    symbols=symbols, build_limits=self.build_limits)
                try:
                    prog = build_program(self.graph, symbols, self._weights, ctx, self._static,
                                         self.shared_arena)
                except MemoryError as e:
                    raise InterpretError(f"the binding {dict(symbols)} of graph "
                                         f"{self.graph.name!r} needs more memory than there "
                                         f"is ({e}); bind smaller sizes") from None
            self._programs[key] = prog  # the most recently used last
            if len(self._programs) > MAX_PROGRAMS:
                old = self._programs.pop(next(iter(self._programs)))
                self._by_shapes = {k: p for k, p in self._by_shapes.items() if p is not old}
            self._last = prog
            return prog

    def _checked(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = feeds_mapping(self.graph, feeds)
        out = {}
        for node in self.graph.inputs:
            name, want = node.op.name, node.op.shape.dtype.np
            if name not in feeds:
                have = ", ".join(sorted(feeds)) or "nothing"
                raise InterpretError(f"graph {self.graph.name!r} needs input {name!r} "
                                     f"{node.op.shape}; feeds have {have}")
            given = feeds[name]
            arr = np.asarray(given)  # no copy: the program copies what it cannot bind
            if arr.dtype != want:
                what = "" if isinstance(given, np.ndarray) else f" (a {type(given).__name__})"
                raise InterpretError(f"input {name!r} declared {node.op.shape.dtype} but was "
                                     f"fed {arr.dtype}{what}; cast the feed")
            out[name] = arr
        return out

    def _seen_program(self, feeds: Mapping[str, np.ndarray]) -> Program | None:
        """The binding check of a call: the program for feeds whose names, dtypes and shapes
        match feeds checked before (None: check them in full)."""
        if type(feeds) is not dict or len(feeds) != len(self._feed_types):
            return None  # another mapping, or extra names: the full check says what is wrong
        shapes = []
        for name, want in self._feed_types:
            arr = feeds.get(name)
            if type(arr) is not np.ndarray or arr.dtype != want:
                return None
            shapes.append(arr.shape)
        prog = self._by_shapes.get(tuple(shapes))
        if prog is not None:
            self._last = prog
        return prog

    def __call__(self, feeds: Mapping[str, np.ndarray], *, copy: bool = True
                 ) -> list[np.ndarray]:
        """The outputs for `feeds`, owned by the caller. `copy=False` returns read-only views
        of the arena (and of static values) instead of copies: read them before the next
        call."""
        with self._turn, self._limit:
            prog = self._seen_program(feeds)
            if prog is None:
                feeds = self._checked(feeds)
                prog = self.program(feeds)
                self._by_shapes[tuple(feeds[name].shape for name, _ in self._feed_types)] = prog
            return prog.run(feeds, copy)

    def update_weights(self, params: Mapping[str, np.ndarray]) -> None:
        """New values for params (checked: names, dtypes, shapes); static values (weight
        preparation) are recomputed on the next call. New values of params with stored values
        are lowered again (see _lowered: fusion baked the old ones in)."""
        params = checked_params(self.source, params, "update_weights")
        with self._turn:
            self._params.update(params)
            if self._lower is not None and any(k in self.source.weights for k in params):
                self.graph, self.report, self.decomposed = self._lower(self._params)
                self._weights = dict(self.graph.weights)
            self._weights.update(self._params)
            self._programs.clear()
            self._by_shapes.clear()
            self._static.clear()
            self._last = None

    # -- inspecting -----------------------------------------------------------------------------
    @property
    def plan(self):
        """The memory plan of the last program run (or built)."""
        return (self._last or self._any_program()).plan

    def dispatch_report(self, feeds: Mapping[str, np.ndarray] | None = None
                        ) -> KernelDispatchReport:
        prog = self.program(self._checked(feeds)) if feeds is not None else self._last
        if prog is None:
            prog = self._any_program()
        stepped = {s.node.id: s for s in prog.steps}
        epilogue = {a.id: s for s in prog.steps for a in s.absorbs}
        folded = self._folded_into(prog)
        rows = []
        for n in self.graph.nodes:
            if n.op.source:
                continue
            who = n.name or f"%{n.id}"
            if n.provenance:
                who += f" [{n.provenance}]"
            if n.id in stepped:
                k = stepped[n.id].kernel
                rows.append((who, n.op.label, k.dispatch, k.name))
            elif n.id in epilogue:
                host = epilogue[n.id]
                rows.append((who, n.op.label, host.kernel.dispatch,
                             f"in the epilogue of %{host.node.id} ({host.kernel.name})"))
            elif n.id in prog.view_ids:
                rows.append((who, n.op.label, Dispatch.VIEW, "view of its input"))
            elif n.id in prog.static_ids:
                rows.append((who, n.op.label, Dispatch.STATIC, "computed once (weights / dims)"))
            elif n.id in folded:
                host = folded[n.id]
                rows.append((who, n.op.label, host.kernel.dispatch,
                             f"done inside %{host.node.id} ({host.kernel.name})"))
            else:
                rows.append((who, n.op.label, Dispatch.STATIC, "unused"))
        note = cc.why_not_compiled() if any(r[2] == Dispatch.REFERENCE for r in rows) else None
        return KernelDispatchReport(rows, dict(self.decomposed), note)

    def _folded_into(self, prog: Program) -> dict[int, Step]:
        """Node id -> the step that does its work itself: the nodes between what a step's
        kernel reads instead of an input (`Kernel.reads`) and that input (an operand's bf16
        rounding, done by the GEMM reading it)."""
        out = {}
        nodes = self.graph.nodes
        for step in prog.steps:
            for pos, v in step.kernel.reads:
                cur = step.node.inputs[pos]
                while cur != v and cur.node not in out and nodes[cur.node].inputs:
                    out[cur.node] = step
                    cur = nodes[cur.node].inputs[0]
        return out

    def _any_program(self) -> Program:
        if not self._programs:
            if not self.graph.has_dynamic_dims():
                return self._program_for({})  # static shapes: planned without feeds
            raise InterpretError("no program yet: its symbolic dims need binding; call the "
                                 "executable once (or .program(feeds), or pass feeds to "
                                 "dispatch_report(feeds))")
        return next(iter(self._programs.values()))

    def profile(self, feeds: Mapping[str, np.ndarray], repeat: int = 3):
        """Per-node time (median of `repeat` runs), bytes moved and achieved GFLOP/s or GB/s."""
        from .profile import profile_program

        if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
            raise InterpretError(f"profile: repeat must be a whole number >= 1, got {repeat!r}")
        feeds = self._checked(feeds)
        with self._turn, self._limit:
            return profile_program(self.program(feeds), feeds, repeat)
