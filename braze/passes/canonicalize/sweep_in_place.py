"""The rewrite driver's sweeps for rules that replace only their root (AlgebraicSimplify's
table), without rebuilding the graph after each sweep.

A driver sweep rebuilds every node after the first match (node ids shift), and a following
DCE rebuilds them again. When each match replaces only its root, by a value that already exists
or by one new node, a sweep can instead patch a working copy of the graph with ids kept: the
new node takes its root's slot, a root replaced by an existing value stays as a dead
"tombstone" whose readers are rewired. The sweeps then run to their fixed point on that copy,
and the one DCE at the end emits the result once. Matching is the driver's own (`_try_rule`:
claims, safety, checks, trial builds), on the same nodes in the same order, the next sweep looks
at the same roots (`_roots_to_retry`'s rule, tombstones left out), and misses are re-keyed to
the ids the driver's graph would have had: the result, statistics and misses are the driver's.

A match that consumes more than its root, or a replacement of several nodes or of a source,
has no slot to go in: `rewrite_in_place` then returns None and the caller runs the driver."""
from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Sequence

from ...errors import PassError
from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.op import Value
from ...rewrite import Match, MissedFusion, Rule, RuleStats
from ...rewrite.driver import KindsPresent, RewriteContext, _dispatch_for, _try_rule
from ...rewrite.trial import check_provided

__all__ = ["InPlaceResult", "rewrite_in_place"]


@dataclasses.dataclass
class InPlaceResult:
    """The working graph after the sweeps (tombstones included: run DCE on it), whether it
    changed, per-rule stats, misses keyed to the driver's ids, the roots of matches the last
    sweep did not take (working-graph ids), the tombstones, the nodes built or rewired (each
    one's inputs differ from the input graph's node there) and the op kinds of the graph
    without its tombstones."""

    graph: Graph
    changed: bool
    stats: dict[str, RuleStats]
    misses: list[MissedFusion]
    tried: list[int]
    dead: set[int]
    touched: set[int]
    kinds: KindsPresent


class _NoSlot(Exception):
    """A match the in-place sweeps cannot apply (the caller falls back to the driver)."""


def rewrite_in_place(g: Graph, rules: Sequence[Rule], ctx: RewriteContext, *,
                     max_sweeps: int, roots: set[int] | None = None) -> InPlaceResult | None:
    """`rewrite(g, rules, ...)` for root-only rules, on a working copy of `g` (never changed).
    None when some match does not fit in place (the caller runs the driver instead)."""
    try:  # the kinds of `g` (cached per graph): the working copy's are derived from them
        return _Sweeps(g, rules, ctx).run(KindsPresent.of(g), max_sweeps, roots)
    except _NoSlot:
        return None


def _working_copy(g: Graph) -> Graph:
    work = Graph(g.name, record_provenance=False)
    work.nodes = list(g.nodes)
    work._users = [list(u) for u in g._users]
    work._names = dict(g._names)
    work.input_ids = list(g.input_ids)
    work.param_ids = list(g.param_ids)
    work.weights = g.weights.carry()
    work.outputs = list(g.outputs)
    return work


class _Sweeps:
    def __init__(self, g: Graph, rules: Sequence[Rule], ctx: RewriteContext):
        # sweeps only read: the first runs on `g`, the working copy is made for the first patch
        self.work, self.rules, self.ctx = g, tuple(rules), ctx
        self.copied = False
        self.stats = {r.name: RuleStats(r.name, r.source) for r in rules}
        self.dead: set[int] = set()  # tombstones: roots replaced by an existing value
        self.misses: dict[tuple, tuple[MissedFusion, Node]] = {}
        self.touched: set[int] = set()

    def run(self, kinds: KindsPresent, max_sweeps: int, roots: set[int] | None
            ) -> InPlaceResult:
        changed = False
        for _ in range(max_sweeps):
            dispatch = _dispatch_for(kinds, self.rules)
            accepted, tried = self._sweep(dispatch, roots)
            if not accepted:
                return InPlaceResult(self.work, changed, self.stats, self._rekeyed(), tried,
                                     self.dead, self.touched, kinds)
            changed = True
            if not self.copied:
                self.work, self.copied = _working_copy(self.work), True
            claimed = {m.root.id for m in accepted}
            old_nodes = [m.root for m in accepted]
            slots, readers = self._apply(accepted)
            self.touched.update(slots, readers)
            for key in [k for k in self.misses if k[1] in claimed]:
                del self.misses[key]  # the driver drops misses at nodes fused away
            kinds = kinds.copy()
            kinds.add_nodes(old_nodes, -1)
            kinds.add_nodes(self.work.nodes[i] for i in slots)
            rules = _dispatch_for(kinds, self.rules).rules
            roots = self._retry(slots, readers, tried, claimed, rules)
        raise PassError(f"rules {[r.name for r in self.rules]} still matched after "
                        f"{max_sweeps} sweeps: a rule's replacement matches its own pattern")

    # -- one sweep: the driver's matching, nothing rebuilt ------------------------------------
    def _sweep(self, dispatch, roots: set[int] | None) -> tuple[list[Match], list[int]]:
        g, dead, ctx, stats = self.work, self.dead, self.ctx, self.stats
        claimed: dict[int, Match] = {}
        accepted: list[Match] = []
        near: list[tuple[int, MissedFusion, Node]] = []
        tried: list[int] = []
        outputs = set(g.outputs)
        if not dispatch.rules:
            order = ()
        elif roots is None:
            order = reversed(g.nodes)
        else:
            order = [g.nodes[i] for i in sorted(roots, reverse=True)]
        candidates = dispatch.candidates
        for node in order:
            if node.op.source or node.id in dead:
                continue
            for rule in candidates(node.op):
                st = stats[rule.name]
                t0, attempts = time.perf_counter(), st.attempts
                verdict = _try_rule(g, rule, node, ctx, claimed, outputs, st, {})
                st.seconds += time.perf_counter() - t0
                if isinstance(verdict, Match):
                    if verdict.consumed != (node.id,) or len(node.outputs) != 1:
                        raise _NoSlot
                    st.matches += 1
                    accepted.append(verdict)
                    claimed[node.id] = verdict
                    break
                if st.attempts != attempts:
                    tried.append(node.id)
                if isinstance(verdict, tuple):
                    st.near_misses += 1  # root-only: no larger near match covers this node
                    near.append((verdict[0], verdict[1], node))
        for nid, miss, node in near:
            if nid not in claimed:
                self.misses.setdefault((miss.pattern, nid, miss.reason), (miss, node))
        return accepted, tried

    # -- applying a sweep's matches in place ----------------------------------------------------
    def _apply(self, accepted: list[Match]) -> tuple[list[int], set[int]]:
        """Build every replacement (in root order: a later one may read an earlier one's
        value), then patch the graph. Returns the slots that got a new node and the readers
        rewired from tombstones."""
        g = self.work
        sub: dict[Value, Value] = {}
        slotted: list[tuple[Node, Node]] = []
        outputs = set(g.outputs)
        for m in sorted(accepted, key=lambda m: m.root.id):
            new = self._build(m, sub, outputs)
            if isinstance(new, Value):
                sub[m.root.values[0]] = new
            else:
                slotted.append((m.root, new))
        users = g._users
        for old, new in slotted:
            g.nodes[old.id] = new
            for v in old.inputs:
                users[v.node] = [u for u in users[v.node] if u[0] != old.id]
            for v in new.inputs:
                if (old.id, v.index) not in users[v.node]:
                    users[v.node].append((old.id, v.index))
            if old.name is not None and g._names.get(old.name) == old.id:
                del g._names[old.name]
        readers: set[int] = set()
        claimed = {m.root.id for m in accepted}
        for v in sub:
            self.dead.add(v.node)
            for uid, _ in users[v.node]:
                if uid not in claimed and uid not in self.dead:
                    readers.add(uid)
        for uid in sorted(readers):
            u = g.nodes[uid]
            ins = tuple(sub.get(v, v) for v in u.inputs)
            g.nodes[uid] = Node(uid, u.op, ins, u.outputs, u.name, u.provenance)
            for v in ins:
                if (uid, v.index) not in users[v.node]:
                    users[v.node].append((uid, v.index))
        for v in sub:
            users[v.node] = [u for u in users[v.node] if u[0] in self.dead]
        g.outputs = [sub.get(v, v) for v in g.outputs]
        return [old.id for old, _ in slotted], readers

    def _build(self, m: Match, sub: dict[Value, Value], outputs: set[Value]) -> Value | Node:
        """`m`'s replacement: an existing value, or its one new node (the root's id, inputs
        and provenance from the root when it has none). It is built at the end of the working
        graph and taken off again."""
        g, root = self.work, m.root
        start = len(g.nodes)
        m._resolve = lambda v: sub.get(v, v)
        try:
            result = m.rule.rewrite(g, m)
            problem = check_provided(m, result, g, outputs)
        finally:
            m._resolve = None
            made = g.nodes[start:]
            del g.nodes[start:]
            del g._users[start:]
            for n in made:
                for v in n.inputs:
                    if v.node < start:
                        g._users[v.node] = [u for u in g._users[v.node] if u[0] < start]
                if n.name is not None:
                    g._names.pop(n.name, None)
        if problem is not None:  # the trial build passed with the same input types
            raise PassError(f"rule {m.rule.name} at {m.describe()}: its replacement differs "
                            f"from its trial build: {problem.detail}")
        value = result if isinstance(result, Value) else None
        if value is not None and value.node < start:
            return value
        if value is None or len(made) != 1 or made[0].op.source:
            raise _NoSlot
        n = made[0]
        prov = n.provenance if n.provenance is not None else root.provenance
        return Node(root.id, n.op, n.inputs, n.outputs, None, prov)

    def _retry(self, slots: list[int], readers: set[int], tried: list[int],
               claimed: set[int], rules: Sequence[Rule]) -> set[int] | None:
        """The driver's roots for the next sweep (`_roots_to_retry`): new nodes, readers of
        replaced roots, what lies up to the largest depth below them, and the roots of matches
        not taken."""
        depths = [r.depth for r in rules]
        if None in depths:
            return None
        g, dead = self.work, self.dead
        frontier = set(slots) | readers
        for nid in slots:
            frontier.update(u for u, _ in g._users[nid] if u not in dead)
        roots = set(frontier)
        for _ in range(max(depths, default=0)):
            frontier = {u for nid in frontier for u, _ in g._users[nid] if u not in dead}
            frontier -= roots
            if not frontier:
                break
            roots |= frontier
        roots.update(i for i in tried if i not in claimed)
        return roots

    def _rekeyed(self) -> list[MissedFusion]:
        """The misses with the ids the driver's graph gives their nodes (tombstones are not in
        it: each one before a node moves it up by one)."""
        if not self.dead:
            return [m for m, _ in self.misses.values()]
        dead = sorted(self.dead)
        out = []
        for (_, nid, _), (m, _) in self.misses.items():
            node = self.work.nodes[nid]
            shown = dataclasses.replace(node, id=nid - bisect.bisect_left(dead, nid))
            out.append(dataclasses.replace(m, node_id=shown.id, node=shown.name or f"%{shown.id}",
                                           context=shown.describe()))
        return out
