"""The rewrite driver's sweeps for rules that replace only their root (AlgebraicSimplify's
table), without rebuilding the graph after each sweep.

A driver sweep rebuilds every node after the first match (node ids shift), and a following
DCE rebuilds them again. When each match replaces only its root, by a value that already exists
or by one new node, a sweep can instead patch a working copy of the graph with ids kept: the
new node takes its root's slot, a root replaced by an existing value stays as a dead
"tombstone" whose readers are rewired. The sweeps then run to their fixed point on that copy,
and the one DCE at the end emits the result once.

What the driver decides is kept: the same roots in the same order (tombstones left out), the
same candidates (`RootDispatch`), matches and checks, and for a root-only match the driver's
claims, safety and cycle tests cannot refuse it. Its trial build is replaced by building the
replacement once, for real (a replacement depends only on the types of what it reads, which
is what the trial with stand-ins already assumes); a failing one gets the driver's own trial
build for its miss. The next sweep looks where `_roots_to_retry` would, and misses are re-keyed
to the ids the driver's graph would give their nodes. So the result, the matches and the
misses are the driver's (tests/rewrite/test_in_place.py compares them).

A match that consumes more than its root, or a replacement of several nodes or of a source,
has no slot to go in: `rewrite_in_place` then returns None and the caller runs the driver."""
from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Sequence

from ..errors import BrazeError, PassError
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.op import Value
from .dispatch import KindsPresent, dispatch_for
from .driver import RewriteContext, RuleStats, _missed
from .miss import Miss, MissedFusion
from .rule import Match, Rule
from .trial import check_provided, trial_build

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
    None when some match does not fit in place, or a rule reads who reads a node
    (`Rule.reads_users`: tombstones still read their inputs): the caller runs the driver."""
    if any(getattr(r, "reads_users", 0) for r in rules):
        return None
    try:  # the kinds of `g` (cached per graph): the working copy's are derived from them
        return _Sweeps(g, rules, ctx).run(KindsPresent.of(g), max_sweeps, roots)
    except _NoSlot:
        return None


def _same_value(v: Value) -> Value:
    return v


class _Sweeps:
    def __init__(self, g: Graph, rules: Sequence[Rule], ctx: RewriteContext):
        # sweeps only read `work`: the first runs on `g` itself; replacements are built at the
        # end of the working copy (made for the first one) and taken off again
        self.work, self.rules, self.ctx = g, tuple(rules), ctx
        self.copy: Graph | None = None
        self.built: dict[int, Value | Node] = {}  # root id -> its replacement (see _build)
        self.stats = {r.name: RuleStats(r.name, r.source) for r in rules}
        self.dead: set[int] = set()  # tombstones: roots replaced by an existing value
        self.misses: dict[tuple, tuple[MissedFusion, Node]] = {}
        self.touched: set[int] = set()

    def run(self, kinds: KindsPresent, max_sweeps: int, roots: set[int] | None
            ) -> InPlaceResult:
        changed = False
        for _ in range(max_sweeps):
            dispatch = dispatch_for(kinds, self.rules)
            accepted, tried = self._sweep(dispatch, roots)
            if not accepted:
                return InPlaceResult(self.work, changed, self.stats, self._rekeyed(), tried,
                                     self.dead, self.touched, kinds)
            changed = True
            self.work = self.copy
            claimed = {m.root.id for m in accepted}
            old_nodes = [m.root for m in accepted]
            slots, readers = self._apply(accepted)
            self.touched.update(slots, readers)
            for key in [k for k in self.misses if k[1] in claimed]:
                del self.misses[key]  # the driver drops misses at nodes fused away
            kinds = kinds.copy()
            kinds.add_nodes(old_nodes, -1)
            kinds.add_nodes(self.work.nodes[i] for i in slots)
            rules = dispatch_for(kinds, self.rules).rules
            roots = self._retry(slots, readers, tried, claimed, rules)
        raise PassError(f"rules {[r.name for r in self.rules]} still matched after "
                        f"{max_sweeps} sweeps: a rule's replacement matches its own pattern")

    # -- one sweep: the driver's matching, nothing rebuilt ------------------------------------
    def _sweep(self, dispatch, roots: set[int] | None) -> tuple[list[Match], list[int]]:
        g, dead, stats = self.work, self.dead, self.stats
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
                verdict = self._try(rule, node, outputs, st)
                st.seconds += time.perf_counter() - t0
                if isinstance(verdict, Match):
                    st.matches += 1
                    accepted.append(verdict)
                    claimed[node.id] = verdict
                    break
                if st.attempts != attempts:
                    tried.append(node.id)
                if verdict is not None:
                    st.near_misses += 1  # root-only: no larger near match covers this node
                    near.append((node.id, _missed(rule, node, verdict), node))
        for nid, miss, node in near:
            if nid not in claimed:
                self.misses.setdefault((miss.pattern, nid, miss.reason), (miss, node))
        return accepted, tried

    def _try(self, rule: Rule, node: Node, outputs: set[Value], st: RuleStats
             ) -> Match | Miss | None:
        """What the driver's `_try_rule` decides at `node` for a root-only rule (claims, safety
        and cycles cannot refuse a match of its root alone): the first match its checks and
        its replacement pass, else the first one's Miss, else None. The replacement is built
        once, for real (`_build`), instead of on trial and again for real."""
        g, ctx = self.work, self.ctx
        first = None
        matcher = rule.matcher
        for m in (matcher(g, node, ctx) if matcher is not None else rule.matches_at(g, node, ctx)):
            st.attempts += 1
            if m.consumed != (node.id,) or len(node.outputs) != 1:
                raise _NoSlot
            miss = None
            for check in rule.checks:
                miss = check(m, ctx)
                if miss is not None:
                    break
            if miss is None:
                miss = self._build(m, outputs)
            if miss is None:
                return m
            first = first or miss
        return first

    # -- applying a sweep's matches in place ----------------------------------------------------
    def _apply(self, accepted: list[Match]) -> tuple[list[int], set[int]]:
        """Build every replacement (in root order: a later one may read an earlier one's
        value), then patch the graph. Returns the slots that got a new node and the readers
        rewired from tombstones."""
        g = self.work
        sub: dict[Value, Value] = {}
        slotted: list[tuple[Node, Node]] = []
        for m in sorted(accepted, key=lambda m: m.root.id):
            root, new = m.root, self.built.pop(m.root.id)
            if isinstance(new, Value):  # built reading the sweep's graph: read the new values
                sub[root.values[0]] = sub.get(new, new)
            else:
                ins = tuple(sub.get(v, v) for v in new.inputs)
                prov = new.provenance if new.provenance is not None else root.provenance
                slotted.append((root, Node(root.id, new.op, ins, new.outputs, None, prov)))
        self.built.clear()
        for _, new in slotted:
            g.replace_node(new)
        readers: set[int] = set()
        claimed = {m.root.id for m in accepted}
        for v in sub:
            self.dead.add(v.node)
            readers.update(u.id for u in g.users(v.node))
        readers -= claimed | self.dead
        for uid in sorted(readers):
            u = g.nodes[uid]
            ins = tuple(sub.get(v, v) for v in u.inputs)
            g.replace_node(Node(uid, u.op, ins, u.outputs, u.name, u.provenance))
        g.outputs = [sub.get(v, v) for v in g.outputs]
        return [old.id for old, _ in slotted], readers

    def _build(self, m: Match, outputs: set[Value]) -> Miss | None:
        """Build `m`'s replacement at the end of the working copy, reading the values of the
        graph being swept (what it builds depends only on their types, as the driver's trial
        build with stand-ins assumes), and take it off again. Kept for `_apply`: an existing
        value, or the one new node. A replacement that fails is explained by the driver's own
        trial build (its Miss); one of several nodes or a new source has no slot."""
        if self.copy is None:
            self.copy = self.work.detached_copy()
        b = self.copy
        start = len(b.nodes)
        m._resolve = _same_value
        try:
            result = m.rule.rewrite(b, m)
            problem = check_provided(m, result, b, outputs)
        except BrazeError:
            problem = True
        finally:
            m._resolve = None
            made = b.drop_after(start)
        if problem is not None:
            miss = trial_build(m, outputs)
            if miss is None:  # the driver would take it and fail while rebuilding
                raise _NoSlot
            return miss
        if not isinstance(result, Value):
            raise _NoSlot
        if result.node < start:
            self.built[m.root.id] = result
        elif len(made) == 1 and not made[0].op.source and made[0].values == (result,):
            self.built[m.root.id] = made[0]
        else:
            raise _NoSlot
        return None

    def _retry(self, slots: list[int], readers: set[int], tried: list[int],
               claimed: set[int], rules: Sequence[Rule]) -> set[int] | None:
        """Where the next sweep looks (as `_roots_to_retry`, for every rule at once): new
        nodes, readers of replaced roots, what lies up to the largest depth below them, and
        the roots of matches not taken. The driver may look at fewer nodes for a rule of a
        smaller depth; what a rule finds outside its depth is what it found before, so only
        the attempt counts can differ."""
        depths = [r.depth for r in rules]
        if None in depths:
            return None
        g, dead = self.work, self.dead
        frontier = set(slots) | readers | (g.reader_ids(slots) - dead)
        roots = set(frontier)
        for _ in range(max(depths, default=0)):
            frontier = g.reader_ids(frontier) - dead - roots
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
