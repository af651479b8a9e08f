"""The rewrite driver: finds matches over a graph (roots visited last-to-first so the largest
pattern claims its nodes), applies the safety rule and each rule's checks, and rebuilds a new
graph in topological order. The input graph is never mutated.

Safety: a match never removes a value that anything outside it reads, or that the graph
returns, unless its rule provides that value in the replacement. Before it is accepted, a
match's replacement is built on trial (see `trial`): one that reads its own intermediates,
fails to build, or would change a value's shape or dtype is refused; an accepted match's
trial is what the rebuild puts in the new graph (`trial.replay`). A match whose inputs are
computed from its own interior (alone, or through other matches of the same sweep) would make a
cycle and is refused too. Every refusal is a `MissedFusion` with a reason, so a rule and its
diagnostics can never disagree, and a valid graph never makes the driver raise."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import PassError
from ..ir.graph import Graph
from ..ir.graph_core import GraphCore
from ..ir.node import Node
from ..ir.op import Value
from .dispatch import KindsPresent, Retry, RootDispatch, dispatch_for, roots_to_retry
from .miss import Miss, MissedFusion, MissReason, fail
from .rule import Match, Rule
from .trial import check_provided, replay, trial_build


@dataclass
class RuleStats:
    """Per-rule counters: structural attempts, accepted matches, near misses, time."""

    rule: str
    source: str
    attempts: int = 0
    matches: int = 0
    near_misses: int = 0
    seconds: float = 0.0

    def merge(self, other: RuleStats) -> None:
        self.attempts += other.attempts
        self.matches += other.matches
        self.near_misses += other.near_misses
        self.seconds += other.seconds


@dataclass
class RewriteContext:
    """What rules may consult: the target (claims, epilogue activations, limits) and options."""

    target: Any = None
    options: Any = None


@dataclass
class RewriteResult:
    graph: Graph
    changed: bool
    stats: dict[str, RuleStats] = field(default_factory=dict)
    misses: list[MissedFusion] = field(default_factory=list)
    node_map: dict[int, int] = field(default_factory=dict)  # old node id -> new (copied nodes)
    made: list[int] = field(default_factory=list)  # new ids made while building replacements
    claimed: list[int] = field(default_factory=list)  # old ids the matches replaced
    tried: list[int] = field(default_factory=list)  # old ids of roots of matches not taken


def _carry_misses(misses: dict[tuple, MissedFusion], node_map: dict[int, int], new: Graph
                  ) -> dict[tuple, MissedFusion]:
    """Re-key misses to the rebuilt graph's node ids; a miss whose node a later sweep fused away
    is no longer a miss and is dropped."""
    out: dict[tuple, MissedFusion] = {}
    for (pattern, nid, reason), m in misses.items():
        if nid not in node_map:
            continue
        node = new.nodes[node_map[nid]]
        out[(pattern, node.id, reason)] = dataclasses.replace(
            m, node_id=node.id, node=node.name or f"%{node.id}", context=node.describe())
    return out


def rewrite(g: Graph, rules: Sequence[Rule], ctx: RewriteContext | None = None,
            *, max_sweeps: int = 8, roots: set[int] | None = None) -> RewriteResult:
    """Apply `rules` until no rule matches (at most `max_sweeps` sweeps; more means a runaway
    rule and raises PassError). Returns the new graph, stats and the near misses of all sweeps.
    `roots` limits the first sweep to those nodes (a caller that knows where nothing can match,
    see `Rule.depth`); `tried` of the result lists the roots of matches the last sweep did not
    take."""
    ctx = ctx or RewriteContext()
    total: dict[str, RuleStats] = {r.name: RuleStats(r.name, r.source) for r in rules}
    changed = False
    cur = g
    misses: dict[tuple, MissedFusion] = {}
    kinds = KindsPresent.of(g)
    for _ in range(max_sweeps):
        dispatch = dispatch_for(kinds, rules)
        res = rewrite_once(cur, rules, ctx, dispatch, roots=roots)
        for k, s in res.stats.items():
            total[k].merge(s)
        for m in res.misses:  # a near miss seen in any sweep is reported once
            misses.setdefault((m.pattern, m.node_id, m.reason), m)
        if not res.changed:
            return RewriteResult(cur, changed, total, list(misses.values()), tried=res.tried)
        misses = _carry_misses(misses, res.node_map, res.graph)
        changed = True
        kinds = kinds.after_rewrite(cur, res)
        KindsPresent.remember(res.graph, kinds)
        roots = roots_to_retry(cur, res, dispatch_for(kinds, rules).rules)
        cur = res.graph
    raise PassError(f"rules {[r.name for r in rules]} still matched after {max_sweeps} sweeps: "
                    "a rule's replacement matches its own pattern")


def rewrite_once(g: Graph, rules: Sequence[Rule], ctx: RewriteContext,
                 dispatch: RootDispatch | None = None, *, roots: set[int] | Retry | None = None
                 ) -> RewriteResult:
    """One sweep: match everywhere (or at `roots` only: a set for every rule, or a `Retry`
    with a set per rule), then rebuild. When the accepted
    matches of a sweep would read each other's results in a cycle, the lowest-priority one in
    the cycle is refused (WOULD_CYCLE) and the sweep is redone without it."""
    vetoed: dict[tuple, Miss] = {}
    dispatch = dispatch or RootDispatch(rules)
    while True:
        try:
            return _sweep(g, rules, ctx, vetoed, dispatch, roots)
        except _MatchCycle as c:
            vetoed[_key(c.match)] = c.miss


def _key(m: Match) -> tuple:
    return (m.rule.name, m.root.id, m.consumed)


def _sweep(g: Graph, rules: Sequence[Rule], ctx: RewriteContext, vetoed: dict[tuple, Miss],
           dispatch: RootDispatch, roots: set[int] | Retry | None) -> RewriteResult:
    stats = {r.name: RuleStats(r.name, r.source) for r in rules}
    claimed: dict[int, Match] = {}
    accepted: list[Match] = []
    reads: dict[int, set[Value]] = {}  # node id -> its values that accepted matches read
    near: list[tuple[int, MissedFusion]] = []
    near_cover: dict[str, set[int]] = {}  # per rule: nodes inside matches already reported
    explained: set[int] = set()
    outputs = set(g.outputs)
    candidates = dispatch.candidates
    tried: list[int] = []
    by_rule = None  # per rule: the nodes to try it at (None: every node the sweep visits)
    if isinstance(roots, Retry):
        by_rule = None if roots.uniform else roots.by_rule
        roots = roots.union
    if not dispatch.rules:
        order = ()
    elif roots is None:
        order = reversed(g.nodes)
    else:  # the same order as a whole sweep, over fewer nodes
        order = [g.nodes[i] for i in sorted(roots, reverse=True)]
    seen_ops = dispatch.by_op
    for node in order:
        op = node.op
        if op.source or node.id in claimed:
            continue
        seen = seen_ops.get(id(op))  # RootDispatch.candidates' memo, read inline
        for rule in (seen[1] if seen is not None and seen[0] is op else candidates(op)):
            # each passed its root test (see RootDispatch)
            if by_rule is not None:
                only = by_rule.get(rule)
                if only is not None and node.id not in only:
                    continue
            st = stats[rule.name]
            t0, attempts = time.perf_counter(), st.attempts
            verdict = _try_rule(g, rule, node, ctx, claimed, outputs, st, vetoed, reads)
            st.seconds += time.perf_counter() - t0
            if isinstance(verdict, Match):
                st.matches += 1
                accepted.append(verdict)
                for nid in verdict.consumed:
                    claimed[nid] = verdict
                for v in verdict.trial.stands_for.values():
                    reads.setdefault(v.node, set()).add(v)
                break
            if st.attempts != attempts:
                tried.append(node.id)
            if isinstance(verdict, tuple):
                nid, missed, consumed = verdict
                cover = near_cover.setdefault(rule.name, set())
                explained.update(consumed)
                if nid not in cover:  # a larger near match of this rule already says why
                    cover.update(consumed)
                    st.near_misses += 1
                    near.append((nid, missed))
    misses = [m for nid, m in near if nid not in claimed]
    for rule in rules:
        if rule.explain is None or rule.anchor is None:
            continue
        for node in g.nodes:
            if node.id in claimed or node.id in explained or not rule.anchor(node.op):
                continue
            miss = rule.explain(g, node, ctx)
            if miss is not None:
                stats[rule.name].near_misses += 1
                misses.append(_missed(rule, node, miss))
    if not accepted:
        return RewriteResult(g, False, stats, misses, tried=tried)
    new, node_map, made = _rebuild(g, claimed, accepted, outputs)
    return RewriteResult(new, True, stats, misses, node_map, made, list(claimed), tried)


def _try_rule(g, rule, node, ctx, claimed, outputs, st, vetoed, reads):
    """A Match if `rule` fuses at `node`, (node id, MissedFusion) for a near miss, else None.
    Checks run cheapest first: claims, safety, the rule's checks, cycles, then the trial
    build of the replacement.

    A match that would remove a value an accepted match of this sweep reads (`reads`: node id
    -> values read, from the accepted trials) is skipped like one overlapping a claim, unless
    its replacement provides that value: the accepted one must still find its input. The next
    sweep tries the node again (it is among the roots `tried`)."""
    first_miss = None
    matcher = rule.matcher  # a matcher called directly: one generator less per try
    for m in (matcher(g, node, ctx) if matcher is not None else rule.matches_at(g, node, ctx)):
        st.attempts += 1
        if any(nid in claimed for nid in m.consumed):
            continue
        read = [nid for nid in m.consumed if nid in reads] if reads else None
        miss = _safety(g, m, outputs)
        if miss is None:
            for check in rule.checks:
                miss = check(m, ctx)
                if miss is not None:
                    break
        if miss is None:
            miss = vetoed.get(_key(m)) if vetoed else None
        if miss is None and _depends_on_itself(g, m):
            miss = fail(MissReason.WOULD_CYCLE,
                        detail="an input of the match is computed from its own interior")
        if miss is None:
            miss = trial_build(m, outputs)
        if miss is None and read and _starves(m, read, reads):
            m.trial = None
            continue
        if miss is None:
            return m
        if first_miss is None:
            first_miss = (node.id, _missed(rule, node, miss, m), m.consumed)
    return first_miss


def _starves(m: Match, read: list[int], reads: dict[int, set[Value]]) -> bool:
    """Whether `m` (its trial built) removes a value of `read` (nodes it consumes) that an
    accepted match reads, without its replacement providing it."""
    result = m.trial.result
    mapping = result if isinstance(result, dict) else {"root": result}
    provided = set()
    for name, vals in mapping.items():
        n = m.nodes[name]
        provided.update(n.values[:len(vals) if isinstance(vals, tuple) else 1])
    return any(v not in provided for nid in read for v in reads[nid])


def _safety(g: GraphCore, m: Match, outputs: set[Value]) -> Miss | None:
    """Interior values read outside the match (or returned) block it unless provided."""
    inside = set(m.consumed)
    by_id = None
    escaping = set()
    nodes, reader_ids = g.nodes, g.reader_ids
    for nid in m.consumed:
        ext = reader_ids((nid,)) - inside
        node = nodes[nid]
        out_hit = any(v in outputs for v in node.values) if outputs else False
        if not out_hit and not ext:
            continue
        if by_id is None:
            by_id = {n.id: name for name, n in m.nodes.items()}
        name = by_id.get(nid)
        if name is not None and name in m.provides:
            escaping.add(name)
            continue
        if out_hit:
            return Miss(MissReason.GRAPH_OUTPUT, detail=f"{node.label} is a graph output")
        return Miss(MissReason.MULTI_CONSUMER,  # users are listed in node order
                    detail=f"{node.label} is also read by {nodes[min(ext)].label}")
    m._escaping = frozenset(escaping)
    return None


def _depends_on_itself(g: GraphCore, m: Match) -> bool:
    """True when an external input of the match is computed from one of its interior nodes
    (fusing would create a cycle)."""
    inside = set(m.consumed)
    lo = min(inside)
    ext = [v.node for nid in inside for v in g.nodes[nid].inputs if v.node not in inside]
    stack = [n for n in ext if n > lo]
    seen = set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in inside:
            return True
        stack.extend(v.node for v in g.nodes[n].inputs if v.node >= lo)
    return False


def _missed(rule: Rule, node: Node, miss: Miss, m: Match | None = None) -> MissedFusion:
    return MissedFusion(
        pattern=rule.name,
        node=node.name or f"%{node.id}",
        reason=miss.reason,
        context=node.describe(),
        hint=miss.hint or miss.reason.default_hint,
        detail=miss.detail,
        node_id=node.id,
    )


class _MatchCycle(Exception):
    """Raised inside `_rebuild` when accepted matches read each other's results in a cycle;
    `match` is the one to refuse (accepted last among the cycle's members)."""

    def __init__(self, match: Match, cycle: list[Match]):
        super().__init__(match.rule.name)
        self.match = match
        others = ", ".join(f"{c.rule.name} at {c.root.label}" for c in cycle if c is not match)
        self.miss = fail(MissReason.WOULD_CYCLE,
                         detail=f"fused, it would read and feed {others}")


def _rebuild(g: Graph, claimed: dict[int, Match], accepted: list[Match], outputs: set[Value]
             ) -> tuple[Graph, dict[int, int], list[int]]:
    """The new graph, old node id -> new for copied nodes, and the ids of the nodes the
    replacements built."""
    new = Graph(g.name, record_provenance=False)
    made_ids: list[int] = []
    # old node id -> the new values of all its outputs (a copy, or a match providing them all);
    # a match providing only some outputs of a node puts them in `partial`
    outs_of: list[tuple[Value, ...] | None] = [None] * len(g.nodes)
    partial: dict[Value, Value] = {}
    done_matches: set[int] = set()
    in_progress: list[Match] = []
    order = {id(m): i for i, m in enumerate(accepted)}

    def made(v: Value) -> Value | None:
        outs = outs_of[v.node]
        return outs[v.index] if outs is not None else partial.get(v)

    def resolve(v: Value) -> Value:
        nv = made(v)
        if nv is None:
            emit(g.nodes[v.node])
            nv = made(v)
            if nv is None:
                raise PassError(f"rewrite lost value {v!r} of {g.nodes[v.node].label}: a rule "
                                "consumed it without providing a replacement")
        return nv

    def emit(node: Node) -> None:
        nid = node.id
        m = claimed.get(nid)
        if m is not None:
            emit_match(m)
            return
        if outs_of[nid] is not None or (partial and Value(nid, 0) in partial):
            return  # copied, or provided by a match that captured it
        try:  # nodes come in topological order: inputs are usually copied already
            ins = tuple([outs_of[v.node][v.index] for v in node.inputs])
        except TypeError:  # an input not made yet, or only partly provided
            ins = tuple([resolve(v) for v in node.inputs])
        # every new value has its old type (copies; replacements pass check_provided)
        outs_of[nid] = new.copy_node(node, ins)

    def emit_match(m: Match) -> None:
        key = id(m)
        if key in done_matches:
            return
        if any(p is m for p in in_progress):
            cycle = in_progress[next(i for i, p in enumerate(in_progress) if p is m):]
            raise _MatchCycle(max(cycle, key=lambda c: order[id(c)]), cycle)
        in_progress.append(m)
        start = len(new.nodes)
        trial, m.trial = m.trial, None  # the scratch graph is not needed after this
        # a replay copies the trial's nodes with their checked types: nothing to check again
        result = replay(trial, new, resolve) if trial is not None else None
        if result is None:  # a name the trial took is taken here: build it again
            m._resolve = resolve
            try:
                result = m.rule.rewrite(new, m)
            finally:
                m._resolve = None
            problem = check_provided(m, result, new, outputs)
            if problem is not None:  # the trial build passed with the same input types
                raise PassError(f"rule {m.rule.name} at {m.describe()}: its replacement "
                                f"differs from its trial build: {problem.detail}")
        _record(m, result, outs_of, partial)
        _stamp(new, start, m)
        made_ids.extend(range(start, len(new.nodes)))
        in_progress.pop()
        done_matches.add(key)

    # nodes before the first claimed one are read and made unchanged: shared as they are
    first = min(claimed)
    outs_of[:first] = new.copy_prefix(g, first)
    copy = new.copy_node
    try:
        for node in g.nodes[first:]:
            nid = node.id
            if partial or nid in claimed or outs_of[nid] is not None:
                emit(node)
                continue
            try:  # emit's common case, inlined: a copy whose inputs are all made
                ins = tuple([outs_of[v.node][v.index] for v in node.inputs])
            except TypeError:
                emit(node)
                continue
            outs_of[nid] = copy(node, ins)
        outs = [resolve(v) for v in g.outputs]
    finally:  # the closures refer to each other: free them now, not in a GC pass
        emit = emit_match = resolve = made = None
    made_weights = new.weights  # values of params that replacements created (e.g. joined)
    kept = {new.nodes[i].op.name for i in new.param_ids}
    new.weights = g.weights.carry(kept)  # deferred (joined) weights stay deferred
    new.weights.update_raw(made_weights)
    new.set_outputs(outs)
    node_map = {i: vals[0].node for i, vals in enumerate(outs_of)
                if vals is not None and i not in claimed}
    node_map.update((v.node, nv.node) for v, nv in partial.items()
                    if v.index == 0 and v.node not in claimed)
    return new, node_map, made_ids


def _record(m: Match, result, outs_of: list, partial: dict[Value, Value]) -> None:
    mapping = result if isinstance(result, dict) else {"root": result}
    for name, vals in mapping.items():
        node = m.nodes[name]
        vals = vals if isinstance(vals, tuple) else (vals,)
        if len(vals) == len(node.outputs):
            outs_of[node.id] = vals
        else:
            partial.update(zip(node.values, vals, strict=False))
    if not m._escaping:
        return
    first_name: dict[int, str] = {}  # node id -> the first capture naming it
    for k, n in m.nodes.items():
        first_name.setdefault(n.id, k)
    for nid in m.consumed:
        node = m.graph.nodes[nid]
        name = first_name.get(nid)
        if name in m.provides and m.escapes(name) and outs_of[nid] is None and \
                node.values[0] not in partial:
            raise PassError(f"rule {m.rule.name} did not provide {node.label}, which is used "
                            "outside the match")


def _stamp(new: Graph, start: int, m: Match) -> None:
    """Nodes made by a replacement inherit the root's provenance (and its name, on the node that
    now produces the root's value)."""
    prov = m.root.provenance
    for i in range(start, len(new.nodes)):
        n = new.nodes[i]
        if n.provenance is None and prov is not None:
            new.nodes[i] = dataclasses.replace(n, provenance=prov)
