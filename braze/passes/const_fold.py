"""ConstantFolding: computations whose every input is known at compile time are evaluated once,
with the reference interpreter, and replaced by their result.

Known values are constants, params with a stored value (`g.param(..., value=...)`, when
`fold_weights` is on) and what ops compute from known values alone. Never known: graph inputs,
params without a stored value (fed at run time), anything with a symbolic dim or an attribute
that names one (`range("seq")`, `sym_const`: bound at run time). A param or constant by itself
is never folded: only computations are.

What a fold becomes follows the weight-concatenation rule of the shared-input fusions
(`fusion/shared_matmul.concat_weights`): a result computed from constants alone is a new
`constant`; a result that read a stored weight is a new param holding the value in
`g.weights`, named after the op and its source params (`transpose(w1)`), so it is still a
weight (saved, listed, rounded by precision policies). Folding bakes the stored values in: fold
again after changing them. The executor's weight preparation computes the same subgraphs once
per weights update instead, so `bz.fuse` folds constants only (see pipeline.py).

A fold whose result holds more than `max_elements` elements is not made: the op stays computed
and the miss (SIZE_LIMIT_EXCEEDED) says so; values computed from it stay computed too. A lone
`expand` of a known value is not folded either: it only broadcasts, and a materialized copy would
be larger than what it reads (its consumers are folded as usual). Sources the folds leave
unread are dropped; the input graph is never changed."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from ..errors import PassError
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.op import Op, Value
from ..ir.ops.io import Constant, Input, Param
from ..ir.shapes import Shape, static_numel
from ..rewrite import MissedFusion, MissReason, RewriteContext, RuleStats
from .base import PassResult
from .naming import fresh_name

__all__ = ["ConstantFolding", "DEFAULT_MAX_ELEMENTS", "fold_constants", "known_source",
           "may_fold"]

DEFAULT_MAX_ELEMENTS = 1 << 20
_NEVER_A_FOLD = frozenset({"expand"})  # broadcasts: folding only copies the input, larger


@dataclass
class ConstantFolding:
    """Fold every computation of known values into one constant (or stored param) per value
    that something run-time reads. `max_elements` caps a folded result's size; with
    `fold_weights=False` only constants count as known (stored params stay run-time values).
    Stats: "ConstantFolding" counts folded values (`matches`), candidates (`attempts`) and
    results over the cap (`near_misses`, each also a miss naming the node and its size)."""

    name: str = "ConstantFolding"
    max_elements: int = DEFAULT_MAX_ELEMENTS
    fold_weights: bool = True

    def run(self, g: Graph, ctx: RewriteContext | None = None) -> PassResult:
        t0 = time.perf_counter()
        out, stats, misses = fold_constants(g, max_elements=self.max_elements,
                                            fold_weights=self.fold_weights)
        stats.seconds = time.perf_counter() - t0
        return PassResult(self.name, out, out is not g, {stats.rule: stats}, misses,
                          stats.seconds)

    def __call__(self, g: Graph) -> Graph:
        return self.run(g).graph


def fold_constants(g: Graph, *, max_elements: int = DEFAULT_MAX_ELEMENTS,
                   fold_weights: bool = True
                   ) -> tuple[Graph, RuleStats, list[MissedFusion]]:
    """`ConstantFolding` as a function: (graph, stats, misses). Returns `g` itself when there is
    nothing to fold. One forward sweep decides what is known, one backward sweep what the new
    graph needs, one interpreter run computes every fold: linear in the graph's size."""
    stats = RuleStats("ConstantFolding", "const_fold.py")
    known, misses = _known_values(g, max_elements, fold_weights, stats)
    if not stats.attempts:  # no computation reads only known values: nothing can fold
        return g, stats, misses
    actions = _actions(g, known)
    roots = [n for n in g.nodes if actions[n.id] == "fold"]
    stats.matches = sum(len(n.values) for n in roots)
    if not roots:
        return g, stats, misses
    values = _evaluate(g, roots, known)
    return _rebuild(g, actions, values, _weight_sources(g, known)), stats, misses


# -- what is known ------------------------------------------------------------------------------
def _known_values(g: Graph, cap: int, fold_weights: bool, stats: RuleStats
                  ) -> tuple[list[bool], list[MissedFusion]]:
    known = [False] * len(g.nodes)
    misses: list[MissedFusion] = []
    for n in g.nodes:
        op = n.op
        if op.source:
            known[n.id] = known_source(g, op, fold_weights)
            continue
        if not all(known[v.node] for v in n.inputs) or not _static(n):
            continue
        stats.attempts += 1
        size = sum(static_numel(s.dims) for s in n.outputs)
        if size > cap:
            stats.near_misses += 1
            misses.append(_over_cap(n, size, cap))
            continue
        known[n.id] = True
    return known, misses


def known_source(g: Graph, op: Op, fold_weights: bool) -> bool:
    """Whether a source op's value is known at compile time: a constant, or (with
    `fold_weights`) a param with a stored value."""
    return isinstance(op, Constant) or (
        fold_weights and isinstance(op, Param) and op.name in g.weights)


def may_fold(g: Graph, fold_weights: bool) -> bool:
    """Whether folding `g` would try anything: some computation reads known values alone and
    has static results. Looks only at the readers of known sources (the first such
    computation reads sources alone) and at computations without inputs, so a caller can skip
    the full scan of `_known_values` when nothing can fold."""
    known = [False] * len(g.nodes)
    sources = []
    for n in g.nodes:
        op = n.op
        if not op.source:
            if not n.inputs and _static(n):
                return True
        elif known_source(g, op, fold_weights):
            known[n.id] = True
            sources.append(n.id)
    for nid in sources:
        for u in g.users(nid):
            if all(known[v.node] for v in u.inputs) and _static(u):
                return True
    return False


def _static(n: Node) -> bool:
    """Whether the node's results are fixed at compile time: static output dims, and no
    attribute naming a symbolic dim (ops that read the run-time bindings)."""
    if not all(s.is_static for s in n.outputs):
        return False
    return not getattr(n.op, "needs_symbols", False) or not _names_a_symbol(n.op)


def _names_a_symbol(op: Op) -> bool:
    stack = [getattr(op, f.name) for f in dataclasses.fields(op)]
    while stack:
        x = stack.pop()
        if type(x) is str:
            return True
        if isinstance(x, tuple):
            stack.extend(x)
    return False


def _over_cap(n: Node, size: int, cap: int) -> MissedFusion:
    reason = MissReason.SIZE_LIMIT_EXCEEDED
    shapes = ", ".join(str(s) for s in n.outputs)
    return MissedFusion(pattern="ConstantFolding", node=n.name or f"%{n.id}", reason=reason,
                        context=n.describe(), hint=reason.default_hint,
                        detail=f"{shapes} is {size} elements, over max_elements={cap}",
                        node_id=n.id)


# -- what the new graph needs -------------------------------------------------------------------
def _actions(g: Graph, known: list[bool]) -> list[str]:
    """Per node: "keep" (copied), "fold" (replaced by its value) or "drop" (only folds read
    it). A known computation is folded where a run-time op, a kept expand or an output reads
    it; a known source is kept where such a reader or an output reads it."""
    needed = [False] * len(g.nodes)
    for v in g.outputs:
        needed[v.node] = True
    actions = ["drop"] * len(g.nodes)
    for n in reversed(g.nodes):
        if not known[n.id] or isinstance(n.op, Input):
            action = "keep"
        elif not needed[n.id]:
            continue
        elif n.op.source or n.op.kind in _NEVER_A_FOLD:
            action = "keep"
        else:
            action = "fold"
        actions[n.id] = action
        if action == "keep":
            for v in n.inputs:
                needed[v.node] = True
    return actions


# -- evaluation and rebuilding ------------------------------------------------------------------
def _evaluate(g: Graph, roots: list[Node], known: list[bool]) -> dict[Value, np.ndarray]:
    """Every root's values, from one interpreter run over the known nodes they read."""
    from ..interpret import interpret

    wanted = [False] * len(g.nodes)
    for n in roots:
        wanted[n.id] = True
    for n in reversed(g.nodes):
        if wanted[n.id]:
            for v in n.inputs:
                wanted[v.node] = True
    sub = Graph(f"{g.name}.folds", record_provenance=False)
    vmap: dict[Value, Value] = {}
    for n in g.nodes:
        if wanted[n.id]:
            vmap.update(zip(n.values, sub.clone_node(n, [vmap[v] for v in n.inputs], g)))
    sub.weights = {p.op.name: g.weights[p.op.name] for p in sub.params}
    outs = [v for n in roots for v in n.values]
    sub.set_outputs([vmap[v] for v in outs])
    with np.errstate(all="ignore"):  # IEEE results (T5's log(0) = -inf), no compile warnings
        results = interpret(sub, {})
    values: dict[Value, np.ndarray] = {}
    for v, arr in zip(outs, results, strict=True):
        want = g.shape_of(v)
        arr = np.asarray(arr)
        if arr.shape != want.dims:
            raise PassError(f"ConstantFolding: the reference of {g.nodes[v.node].describe()} "
                            f"gave shape {arr.shape}, its node declares {want}")
        values[v] = arr.astype(want.dtype.np, copy=False)
    return values


def _rebuild(g: Graph, actions: list[str], values: dict[Value, np.ndarray],
             sources: list[tuple[str, ...]]) -> Graph:
    new = Graph(g.name, record_provenance=False)
    vmap: dict[Value, Value] = {}
    first = next((i for i, a in enumerate(actions) if a != "keep"), len(actions))
    for n, outs in zip(g.nodes, new.copy_prefix(g, first)):  # kept as they are
        vmap.update(zip(n.values, outs))
    for n in g.nodes[first:]:
        action = actions[n.id]
        if action == "keep":
            vmap.update(zip(n.values, new.clone_node(n, [vmap[v] for v in n.inputs], g)))
        elif action == "fold":
            for v in n.values:
                vmap[v] = _literal(new, g, n, values[v], sources[n.id])
    kept = {p.op.name for p in new.params}
    new.weights.update_raw(g.weights.carry(kept))
    new.set_outputs([vmap[v] for v in g.outputs])
    return new


def _literal(new: Graph, old: Graph, n: Node, value: np.ndarray, weights: tuple[str, ...]
             ) -> Value:
    """The folded value as a constant, or as a stored param when it was computed from weights."""
    if not weights:
        name = n.name if n.name is not None and not new.has_name(n.name) else None
        return new.add_node(Constant(value), (), name=name, provenance=n.provenance)[0]
    shown = weights if len(weights) <= _SHOWN else (*weights[:_SHOWN], "...")
    name = fresh_name(old, new, f"{n.op.label}({'|'.join(shown)})")
    v = new.add_node(Param(name, Shape(value.shape, old.shape_of(n.values[0]).dtype)), (),
                     name=name, provenance=n.provenance)[0]
    new.param_ids.append(v.node)
    new.weights[name] = value
    return v


def _weight_sources(g: Graph, known: list[bool]) -> list[tuple[str, ...]]:
    """Per known node: the first few params it is computed from (`_SHOWN` + 1 at most, in
    order of first use; one bounded merge per node keeps this linear)."""
    sources: list[tuple[str, ...]] = [()] * len(g.nodes)
    for n in g.nodes:
        if not known[n.id]:
            continue
        if isinstance(n.op, Param):
            sources[n.id] = (n.op.name,)
            continue
        names: list[str] = []
        for v in n.inputs:
            names.extend(x for x in sources[v.node] if x not in names)
        sources[n.id] = tuple(names[:_SHOWN + 1])
    return sources


_SHOWN = 3
