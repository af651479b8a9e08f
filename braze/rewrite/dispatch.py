"""Which rules the rewrite driver tries where: `RootDispatch` (the rules worth trying at a
node, by its op), `KindsPresent` (the op kinds a graph holds, to skip rules whose required
kinds are absent; `dispatch_for`) and, after a sweep changed the graph, the roots worth
trying again (`roots_to_retry`, a `Retry` per rule). All of it only narrows the search: a
rule left out could not have matched there."""
from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..ir.graph import Graph
from ..ir.graph_core import GraphCore
from .rule import Rule

if TYPE_CHECKING:
    from .driver import RewriteResult

__all__ = ["KindsPresent", "Retry", "RootDispatch", "dispatch_for", "roots_to_retry"]

_DISPATCHES: dict[tuple[Rule, ...], RootDispatch] = {}
_MAX_CACHED = 256  # dispatch tables and graphs' kinds kept between calls
_MAX_OPS_SEEN = 1 << 12  # ops a dispatch table remembers by identity (compute ops only)


def roots_to_retry(old: Graph, res: RewriteResult, rules: Sequence[Rule]) -> Retry | None:
    """Per rule, the nodes of `res.graph` (rebuilt from `old`) where the next sweep can find
    what the last did not (see `Rule.depth` and `Rule.reads_users`), or None (every node, for
    every rule) when no rule has a depth.

    A node differs from the one the last sweep saw when a replacement built it or rewired it
    (it reads a replaced node), or, for a rule that reads readers, when its readers changed:
    a replaced node read it, or a new node reads it. A rule with depth h that reads readers
    k levels down is retried at every node up to h edges below a node that is up to k edges
    above a changed one: elsewhere all it reads is what the last sweep saw, and it found no
    match there. A rule with a `retry` hook is retried where the hook says. Every rule is also
    retried at the roots of matches not taken (their checks and safety may read anything). A
    rule that reads more than `_MAX_WALK` edges above its root is retried everywhere: walking
    that far costs more than it saves."""
    reaches = {(r.depth, r.reads_users) for r in rules if _bounded(r) and r.retry is None}
    hooked = [r for r in rules if r.retry is not None]
    if not reaches and not hooked:
        return None
    new, node_map = res.graph, res.node_map
    copies = set(node_map.values())
    made = [i for i in res.made if i not in copies]
    claimed = set(res.claimed)
    rebuilt = set(made)  # built, or rewired to read what a replacement built
    for nid in claimed:
        for user in old.users(nid):
            if user.id not in claimed:
                rebuilt.add(node_map[user.id])
    tried = {node_map[i] for i in res.tried if i in node_map}
    changed = rebuilt
    if hooked or any(k for _, k in reaches):  # and nodes whose readers changed
        changed = set(rebuilt)
        for nid in claimed:
            changed.update(node_map[v.node] for v in old.nodes[nid].inputs
                           if v.node not in claimed and v.node in node_map)
        nodes = new.nodes
        for nid in made:
            changed.update(v.node for v in nodes[nid].inputs)
    by_reach: dict[tuple[int, int], set[int]] = {}
    for reads_users in {k for _, k in reaches}:  # one walk per seed set, to its deepest rule
        seeds = set().union(*_levels(new, changed, reads_users, up=True)) if reads_users \
            else rebuilt
        depths = sorted(d for d, k in reaches if k == reads_users)
        levels = _levels(new, seeds, depths[-1], up=False)
        for depth in depths:
            by_reach[(depth, reads_users)] = set(tried).union(*levels[:depth + 1])
    by_rule: dict[Rule, set[int] | None] = {}
    for r in rules:
        if r.retry is not None:
            by_rule[r] = tried.union(r.retry(new, changed))
        else:
            by_rule[r] = by_reach[(r.depth, r.reads_users)] if _bounded(r) else None
    return Retry(by_rule)


_MAX_WALK = 16  # a rule reading further above its root is retried everywhere (cheaper)


def _bounded(rule: Rule) -> bool:
    return rule.depth is not None and rule.depth <= _MAX_WALK


def _levels(g: GraphCore, start: set[int], steps: int, *, up: bool) -> list[set[int]]:
    """`start`, then the nodes 1, 2, ... `steps` edges above it (`up`: producers) or below it
    (readers) that are not nearer."""
    seen = set(start)
    frontier = seen
    out = [seen]
    nodes = g.nodes
    for _ in range(steps):
        if up:
            frontier = {v.node for nid in frontier for v in nodes[nid].inputs} - seen
        else:
            frontier = g.reader_ids(frontier) - seen
        if not frontier:
            break
        seen = seen | frontier
        out.append(frontier)
    return out


class Retry:
    """Where a sweep after the first tries each rule: a set of node ids per rule (None: every
    node), from `roots_to_retry`."""

    def __init__(self, by_rule: dict[Rule, set[int] | None]):
        self.by_rule = by_rule
        sets = list(by_rule.values())
        self.union: set[int] | None = None if None in sets else set().union(*sets)
        # when every rule has the same set, the sweep needs no per-rule test
        self.uniform = all(x is sets[0] for x in sets)


def dispatch_for(present: KindsPresent, rules: Sequence[Rule]) -> RootDispatch:
    """The RootDispatch of the rules that can match in a graph holding `present` (see
    `Rule.requires`); a rule left out could not have matched anything there, so its stats and
    misses are the same. Tables are kept per rule tuple (rules are long-lived; the key holds
    them, so an id is never reused for other rules)."""
    active = tuple(r for r in rules if present.meets(r.requires))
    hit = _DISPATCHES.get(active)
    if hit is None:
        if len(_DISPATCHES) >= _MAX_CACHED:
            _DISPATCHES.clear()
        hit = _DISPATCHES[active] = RootDispatch(active)
    return hit


class KindsPresent:
    """The op kinds a graph holds (how many nodes of each op class and label, and one op of
    each), to test `Rule.requires`. `of(g)` keeps the answer per graph (passes that change
    nothing hand the same graph on; nodes appended since are counted in, a graph patched in
    place since (`GraphCore.edits`) is counted again), and
    the rewrite driver derives a rebuilt graph's from its source's and the nodes it replaced
    and made."""

    _by_graph: dict[int, tuple[weakref.ref, int, int, KindsPresent]] = {}

    def __init__(self, g: GraphCore | None = None):
        self._count: dict[tuple, int] = {}
        self._ops: dict[tuple, object] = {}
        self._memo: dict[tuple, bool] = {}
        if g is not None:
            self.add_nodes(g.nodes)

    @classmethod
    def of(cls, g: GraphCore) -> KindsPresent:
        seen = cls._by_graph.get(id(g))
        if seen is not None and seen[0]() is g and seen[2] == g.edits:
            kinds = seen[3]
            if seen[1] != len(g.nodes):
                kinds = kinds.copy()
                kinds.add_nodes(g.nodes[seen[1]:])
                cls.remember(g, kinds)
            return kinds
        kinds = cls(g)
        cls.remember(g, kinds)
        return kinds

    @classmethod
    def remember(cls, g: GraphCore, kinds: KindsPresent) -> None:
        if len(cls._by_graph) >= _MAX_CACHED:
            cls._by_graph.clear()
        cls._by_graph[id(g)] = (weakref.ref(g), len(g.nodes), g.edits, kinds)

    def copy(self) -> KindsPresent:
        out = KindsPresent()
        out._count = dict(self._count)
        out._ops = dict(self._ops)
        out._memo = dict(self._memo)
        return out

    def add_nodes(self, nodes, sign: int = 1) -> None:
        """Count `nodes` in (or, with sign -1, out)."""
        count, ops = self._count, self._ops
        for n in nodes:
            op = n.op
            key = (type(op), op.label)
            c = count.get(key, 0) + sign
            if c > 0:
                count[key] = c
                if key not in ops:
                    ops[key] = op
                    self._memo.clear()
            else:
                del count[key]
                del ops[key]
                self._memo.clear()

    def after_rewrite(self, old: GraphCore, res: RewriteResult) -> KindsPresent:
        """The kinds of `res.graph`, rebuilt from `old`: the nodes its matches claimed are gone
        (every other node is copied), the nodes their replacements built are new."""
        out = self.copy()
        copies = set(res.node_map.values())
        out.add_nodes((old.nodes[i] for i in res.claimed), -1)
        out.add_nodes(res.graph.nodes[i] for i in res.made if i not in copies)
        return out

    def meets(self, requires: frozenset[tuple]) -> bool:
        """Whether, for each requirement, some op of the graph is one of its kinds."""
        for kinds in requires:
            hit = self._memo.get(kinds)
            if hit is None:
                hit = self._memo[kinds] = any(_admits(kinds, op) for op in self._ops.values())
            if not hit:
                return False
        return True


class RootDispatch:
    """The rules worth trying at a node, in rule order: those whose `root_kinds` admit the
    node's op class and label (or that have none), memoized per (op class, label), and whose
    `root_test` accepts the op, memoized per op object (a root test reads only the op, and ops
    are immutable and shared by rebuilt graphs), so a sweep runs no rule's root test again on
    an op it has seen."""

    def __init__(self, rules: Sequence[Rule]):
        self.rules = tuple(rules)
        self._memo: dict[tuple[type, str], tuple[Rule, ...]] = {}
        # per op object too (`by_op`, id -> (op, rules); the sweep reads it inline): rebuilt
        # graphs share their ops, and an op's label may be computed
        self.by_op: dict[int, tuple[object, tuple[Rule, ...]]] = {}

    def candidates(self, op) -> tuple[Rule, ...]:
        seen = self.by_op.get(id(op))
        if seen is not None and seen[0] is op:
            return seen[1]
        key = (type(op), op.label)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = tuple(r for r in self.rules if _admits(r.root_kinds, op))
        hit = tuple(r for r in hit if r.root_test(op))
        if len(self.by_op) >= _MAX_OPS_SEEN:  # the table outlives graphs: do not hoard ops
            self.by_op.clear()
        self.by_op[id(op)] = (op, hit)
        return hit


def _admits(kinds: frozenset | None, op) -> bool:
    if kinds is None:
        return True
    return any(op.label == k or op.kind == k if isinstance(k, str) else isinstance(op, k)
               for k in kinds)
