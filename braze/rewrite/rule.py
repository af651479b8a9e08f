"""A rewrite rule: a pattern (or a custom matcher for multi-root shapes), named checks that
return a reason when they reject, and a replacement builder. Rules record where they were
defined so match statistics can name the file and line."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import PassError
from ..ir.graph_core import GraphCore
from ..ir.node import Node
from ..ir.op import Value
from ..ir.shapes import Shape
from .miss import Miss
from .pattern import Pattern

if TYPE_CHECKING:
    from .driver import RewriteContext

Check = Callable[["Match", "RewriteContext"], Miss | None]


class CaptureInsideMatch(PassError):
    """A replacement asked for a value that its own match computes (e.g. `add(mm, mm)` matched
    as product + bias: the bias is the product). The driver's trial build turns this into a
    CAPTURE_INSIDE_MATCH miss; `detail` says which value."""

    def __init__(self, m: Match, old: Value):
        node = m.graph.nodes[old.node]
        names = [k for k, v in m.values.items() if v == old]
        captured = f" (captured as {names[0]!r})" if names else ""
        which = node.label if len(node.outputs) == 1 else f"output {old.index} of {node.label}"
        self.detail = f"the replacement reads {which}{captured}, which the match itself computes"
        super().__init__(f"rule {m.rule.name} at {m.describe()}: {self.detail}")


class Match:
    """One structural match in the graph being rewritten.

    `nodes` maps capture names to matched nodes, `values` maps Var names to captured values,
    `consumed` lists every node the match replaces, `provides` names the captures whose outputs the
    replacement builds (the root always). While the replacement runs, `v(name)` gives the new
    graph's value for a captured external value."""

    def __init__(self, rule: Rule, graph: GraphCore, root: Node, nodes: dict[str, Node],
                 values: dict[str, Value], consumed: Sequence[int],
                 provides: Iterable[str] = (), data: dict[str, Any] | None = None):
        self.rule = rule
        self.graph = graph
        self.root = root
        self.nodes = dict(nodes)
        self.nodes.setdefault("root", root)
        self.values = dict(values)
        self.consumed = tuple(consumed)
        self.provides = frozenset(provides) | {"root"}
        self.data = dict(data or {})
        self._escaping: frozenset[str] = frozenset()
        self._resolve: Callable[[Value], Value] | None = None
        self._memo: dict[Any, Any] = {}
        self.trial: Any = None  # the replacement built on trial, once it passed (trial.Trial)

    # -- reading the old graph ------------------------------------------------------------------
    def node(self, name: str) -> Node:
        return self.nodes[name]

    def shape(self, name: str) -> Shape:
        """Type of a captured value, or of a captured node's first output."""
        if name in self.values:
            return self.graph.shape_of(self.values[name])
        return self.nodes[name].outputs[0]

    def op(self, name: str):
        return self.nodes[name].op

    def escapes(self, name: str) -> bool:
        """Whether the captured node's outputs are used outside the match (or are outputs)."""
        return name in self._escaping

    # -- during the replacement ----------------------------------------------------------------
    def v(self, name: str) -> Value:
        """The new graph's value for captured external value `name`."""
        return self.new(self.values[name])

    def new(self, old: Value) -> Value:
        """The new graph's value for an old value outside the match."""
        if self._resolve is None:
            raise PassError(f"rule {self.rule.name}: Match.new is only valid while the "
                            "replacement is being built")
        if old.node in self.consumed:
            raise CaptureInsideMatch(self, old)
        return self._resolve(old)

    def memo(self, key: Any, compute: Callable[[], Any]) -> Any:
        """`compute()`, once per match and `key`: work that depends only on the old graph -
        joining stored weights, say - done once even when the driver builds the replacement
        twice (on trial, then for real when replaying the trial is not possible, see
        `trial.replay`). The result must not refer to either new graph."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def describe(self) -> str:
        return self.root.describe()


@dataclass(eq=False)
class Rule:
    """`pattern` + `checks` + `rewrite`.

    rewrite(b, m) builds the replacement into graph `b` and returns the new value(s) for the
    root, or a dict capture-name -> value(s) for several provided captures. `may_expose` names
    interior captures whose outputs the replacement can provide when something outside the match
    reads them (e.g. a residual sum); any other escaping interior value blocks the match with a
    MULTI_CONSUMER / GRAPH_OUTPUT miss. `matcher(g, node, ctx)` replaces the pattern for shapes
    a tree cannot express (several roots); it yields Matches. `explain(g, node, ctx)` diagnoses
    unmatched `anchor` nodes (e.g. a matmul whose consumer is not an add).

    `root_kinds` (set from the pattern when the rule has no matcher of its own) names the op
    labels / kinds / classes the root can have; the driver tries the rule only on such nodes,
    then `root_test` decides. A matcher assigned after construction must match the pattern at
    the root (as `pattern.match_node` does) or reset `root_kinds` to None. `requires` (from the
    pattern likewise; a matcher rule may declare it) lists what any match needs in the graph
    (`Pattern.required_kinds`: tuples of op labels or classes, one of each tuple present): the
    driver skips the rule on a graph where some requirement holds for no node.

    `depth` bounds how far above the root (in edges) finding a match reads the graph: ops,
    attributes, inputs and types (`Pattern.height` for a pattern; a matcher may declare one).
    It reads who else reads a node only when `reads_users` says how far: for the nodes up to
    `depth` above the root, a matcher may look at their readers (and whether they are graph
    outputs), and at what lies up to `reads_users` edges below them (ops, inputs, types,
    readers). After a sweep changed the graph, the driver tries a rule with a depth again only
    at roots that far from a changed node (see `dispatch.roots_to_retry`), and at roots where it
    found a match it did not take; a rule without one (None, a matcher's default) is tried
    everywhere again. Checks may read anything: they run only on matches. A matcher assigned
    after construction must honour the pattern's depth or reset `depth` to None.

    `retry(g, changed)` replaces that reach for a matcher whose walks have no length bound
    (chains of casts and layouts): given the rebuilt graph and the ids of its changed nodes
    (built, rewired, or with readers added or removed), it returns every root where what the
    matcher reads may include one of them. The driver tries the rule there (and at the roots
    of matches it did not take) and nowhere else."""

    name: str
    rewrite: Callable[[GraphCore, Match], Any]
    pattern: Pattern | None = None
    checks: tuple[Check, ...] = ()
    may_expose: frozenset[str] = frozenset()
    matcher: Callable[[GraphCore, Node, RewriteContext], Iterable[Match]] | None = None
    root_test: Callable[[Any], bool] | None = None
    anchor: Callable[[Any], bool] | None = None
    explain: Callable[[GraphCore, Node, RewriteContext], Miss | None] | None = None
    produces: str | None = None
    source: str = field(default="")
    depth: int | None = None
    reads_users: int = 0
    retry: Callable[[GraphCore, set[int]], Iterable[int]] | None = None
    root_kinds: frozenset | None = field(default=None, init=False)
    requires: frozenset[tuple] | None = None

    def __post_init__(self):
        if self.pattern is None and self.matcher is None:
            raise TypeError(f"rule {self.name} needs a pattern or a matcher")
        # what the root of a pattern-matched rule can be (None: anything; root_test decides)
        self.root_kinds = self.pattern.root_kinds() if self.matcher is None else None
        self.requires = self.pattern.required_kinds() if self.matcher is None else \
            frozenset(self.requires or ())
        if self.matcher is None:
            self.depth = self.pattern.height()
        if self.root_test is None:
            self.root_test = self.pattern.root_test() if self.pattern else (lambda op: True)
        self.may_expose = frozenset(self.may_expose)
        if not self.source:
            f = sys._getframe(2)
            self.source = f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"

    def matches_at(self, g: GraphCore, node: Node, ctx: RewriteContext) -> Iterable[Match]:
        """Structural matches rooted at `node` (checks not yet applied)."""
        if self.matcher is not None:
            yield from self.matcher(g, node, ctx)
            return
        for b, consumed in self.pattern.match_node(g, node, {}, ()):
            nodes = {k: x for k, x in b.items() if isinstance(x, Node)}
            values = {k: x for k, x in b.items() if isinstance(x, Value)}
            yield Match(self, g, node, nodes, values, consumed, self.may_expose)
