"""The pattern language: trees of op patterns over captured values, written like the code they
match. `P.add(P.matmul(V("x"), V("w")).named("mm"), V("b"))` matches `x @ w + b` in either
operand order (add is commutative); `|` gives alternatives; a Var name used twice must bind the
same value (that is how shared inputs are expressed)."""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..ir.graph_core import GraphCore
from ..ir.node import Node
from ..ir.op import Op, Value
from ..ir.ops.elementwise import Binary, Compare

Bindings = dict[str, Any]


class Pattern:
    """Base of pattern nodes. `a | b` tries `a`, then `b`."""

    def __or__(self, other: Pattern) -> Alt:
        left = self.options if isinstance(self, Alt) else (self,)
        right = other.options if isinstance(other, Alt) else (other,)
        return Alt(left + right)

    def match_value(self, g: GraphCore, v: Value, b: Bindings, consumed: tuple[int, ...]
                    ) -> Iterator[tuple[Bindings, tuple[int, ...]]]:
        raise NotImplementedError

    def root_test(self) -> Callable[[Op], bool]:
        """A cheap test on an op: can this pattern's root be that op?"""
        return lambda op: True

    def root_kinds(self) -> frozenset | None:
        """The op labels / kinds (str) and Op classes the root can match (as `Pat.op`
        names them), or None when any op may be the root. The rewrite driver tries a rule only
        on nodes of these kinds."""
        return None

    def required_kinds(self) -> frozenset[tuple]:
        """What any match needs in the graph: a set of requirements, each a tuple of op
        labels / kinds / classes (as `Pat.op` names them) of which some node must have one.
        A rule whose requirement no node of a graph meets cannot match there."""
        return frozenset()

    def height(self) -> int:
        """How far above the root (in edges) matching reads: the deepest op pattern's inputs
        are read (a captured value's producer, for a `where` test), nothing above them."""
        return 0


@dataclass(frozen=True)
class Var(Pattern):
    """Captures any value as `name` (optionally only values whose type passes `where`)."""

    name: str
    where: Callable[[GraphCore, Value], bool] | None = None

    def match_value(self, g, v, b, consumed):
        if self.name in b:
            if b[self.name] == v:
                yield b, consumed
            return
        if self.where is not None and not self.where(g, v):
            return
        yield {**b, self.name: v}, consumed


@dataclass(frozen=True, eq=False)
class Pat(Pattern):
    """Matches a node whose op is `op` (an Op class, or a label such as "add", "gelu",
    "matmul"), whose attributes satisfy `attrs` (a value to compare or a predicate on the attr),
    and whose inputs match `inputs` (None: inputs are not looked at). `out` is the output index a
    parent reads (None: any). Named patterns capture the node."""

    op: type[Op] | str | tuple
    inputs: tuple[Pattern, ...] | None = ()
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str | None = None
    commutative: bool | None = None
    out: int | None = 0

    def __post_init__(self):
        kinds = self.op if isinstance(self.op, tuple) else (self.op,)
        # what op_matches tests: labels / kinds (str) and Op classes, split once
        object.__setattr__(self, "_labels", frozenset(k for k in kinds if isinstance(k, str)))
        object.__setattr__(self, "_classes", tuple(k for k in kinds if not isinstance(k, str)))

    def named(self, name: str) -> Pat:
        return Pat(self.op, self.inputs, self.attrs, name, self.commutative, self.out)

    def output(self, index: int | None) -> Pat:
        return Pat(self.op, self.inputs, self.attrs, self.name, self.commutative, index)

    def op_matches(self, op: Op) -> bool:
        labels = self._labels
        if not ((labels and (op.label in labels or op.kind in labels))
                or (self._classes and isinstance(op, self._classes))):
            return False
        for attr, want in self.attrs.items():
            have = getattr(op, attr, _MISSING)
            if have is _MISSING:
                return False
            if callable(want) and not isinstance(want, type):
                if not want(have):
                    return False
            elif have != want:
                return False
        return True

    def root_test(self):
        return self.op_matches

    def root_kinds(self) -> frozenset:
        return frozenset(self.op if isinstance(self.op, tuple) else (self.op,))

    def required_kinds(self) -> frozenset[tuple]:
        return _memo(self, "_required", self._required_kinds)

    def _required_kinds(self) -> frozenset[tuple]:
        own = frozenset({self.op if isinstance(self.op, tuple) else (self.op,)})
        return own.union(*(p.required_kinds() for p in self.inputs or ()))

    def height(self) -> int:
        return _memo(self, "_height", lambda: 1 + max((p.height() for p in self.inputs),
                                                      default=0) if self.inputs else 0)

    def match_value(self, g, v, b, consumed):
        if self.out is not None and v.index != self.out:
            return
        yield from self.match_node(g, g.nodes[v.node], b, consumed)

    def match_node(self, g: GraphCore, node: Node, b: Bindings, consumed: tuple[int, ...]
                   ) -> Iterator[tuple[Bindings, tuple[int, ...]]]:
        if not self.op_matches(node.op):
            return
        if self.name is not None:
            bound = b.get(self.name)
            if bound is not None and bound.id != node.id:
                return
            b = {**b, self.name: node}
        if node.id not in consumed:
            consumed = consumed + (node.id,)
        if self.inputs is None:
            yield b, consumed
            return
        ins = node.inputs
        if len(self.inputs) != len(ins):
            return
        yield from _match_seq(g, self.inputs, ins, b, consumed)
        if len(ins) == 2 and self._is_commutative(node.op):
            yield from _match_seq(g, self.inputs, ins[::-1], b, consumed)

    def _is_commutative(self, op: Op) -> bool:
        if self.commutative is not None:
            return self.commutative
        if isinstance(op, Binary):
            return op.fn.commutative
        return isinstance(op, Compare) and op.fn.value in ("eq", "ne")


def _match_seq(g, pats, vals, b, consumed, i=0):
    """Every binding of `pats[i:]` to `vals[i:]`, in backtracking order. Leading captures
    (a Var yields at most once) bind in a loop, an op pattern is matched at its node directly
    and the last pattern's matches are passed on: fewer generators than one per pattern."""
    n = len(pats)
    while i < n and type(pats[i]) is Var:
        p, v = pats[i], vals[i]
        if p.name in b:
            if b[p.name] != v:
                return
        elif p.where is not None and not p.where(g, v):
            return
        else:
            b = {**b, p.name: v}
        i += 1
    if i == n:
        yield b, consumed
        return
    p, v = pats[i], vals[i]
    if type(p) is Pat:
        if p.out is not None and v.index != p.out:
            return
        found = p.match_node(g, g.nodes[v.node], b, consumed)
    else:
        found = p.match_value(g, v, b, consumed)
    if i == n - 1:
        yield from found
        return
    for b1, c1 in found:
        yield from _match_seq(g, pats, vals, b1, c1, i + 1)


@dataclass(frozen=True)
class Alt(Pattern):
    """Alternatives, tried in order (put the larger pattern first)."""

    options: tuple[Pattern, ...]

    def match_value(self, g, v, b, consumed):
        for p in self.options:
            yield from p.match_value(g, v, b, consumed)

    def match_node(self, g, node, b, consumed):
        for p in self.options:
            yield from p.match_node(g, node, b, consumed)

    def height(self) -> int:
        return _memo(self, "_height", lambda: max(p.height() for p in self.options))

    def root_test(self):
        tests = [p.root_test() for p in self.options]
        return lambda op: any(t(op) for t in tests)

    def root_kinds(self) -> frozenset | None:
        kinds = [p.root_kinds() for p in self.options]
        return None if any(k is None for k in kinds) else frozenset().union(*kinds)

    def required_kinds(self) -> frozenset[tuple]:
        """A match of some option meets one requirement of each option, so it meets their
        union: every such union (when there are few), else the requirements all options
        share."""
        return _memo(self, "_required", self._required_kinds)

    def _required_kinds(self) -> frozenset[tuple]:
        sets = [p.required_kinds() for p in self.options]
        if not all(sets):
            return frozenset()
        if math.prod(len(r) for r in sets) > _MAX_UNIONS:
            return sets[0].intersection(*sets[1:])
        return frozenset(tuple(dict.fromkeys(k for r in choice for k in r))
                         for choice in itertools.product(*sets))


class Guarded(Pattern):
    """`inner`, matched only at nodes that pass `guard(g, node)`: a cheap test every match of
    `inner` passes, so a node that fails it is not walked (e.g. the attention block's root:
    most adds and matmuls of a model read no attention). Everything the driver reads of a
    pattern (root kinds and test, requirements, height) is `inner`'s."""

    def __init__(self, inner: Pattern, guard: Callable[[Any, Any], bool]):
        self.inner, self.guard = inner, guard

    def match_node(self, g, node, b, consumed):
        if self.guard(g, node):
            yield from self.inner.match_node(g, node, b, consumed)

    def match_value(self, g, v, b, consumed):
        if self.guard(g, g.nodes[v.node]):
            yield from self.inner.match_value(g, v, b, consumed)

    def root_test(self):
        return self.inner.root_test()

    def root_kinds(self):
        return self.inner.root_kinds()

    def required_kinds(self):
        return self.inner.required_kinds()

    def height(self) -> int:
        return self.inner.height()


def _memo(pattern: Pattern, attr: str, compute: Callable[[], Any]) -> Any:
    """A pattern's derived fact, computed once: sub-patterns are shared (the same `heads(...)`
    under every alternative), so an uncached walk of a large pattern repeats exponentially."""
    hit = pattern.__dict__.get(attr)
    if hit is None:
        hit = compute()
        object.__setattr__(pattern, attr, hit)  # not a field: eq / hash are unchanged
    return hit


class _PatternBuilder:
    """`P.add(a, b)`, `P.gelu(x)`, `P.matmul(x, w)`: a Pat by label; `P.of(Cls, *ins, **attrs)` by
    class. Keyword `name=` captures the node; other keywords are attribute constraints."""

    def of(self, op, *inputs: Pattern, name: str | None = None, commutative: bool | None = None,
           out: int | None = 0, **attrs) -> Pat:
        return Pat(op, tuple(inputs), dict(attrs), name, commutative, out)

    def any_inputs(self, op, name: str | None = None, **attrs) -> Pat:
        """A node of this op whose inputs are not constrained."""
        return Pat(op, None, dict(attrs), name)

    def __getattr__(self, label: str):
        if label.startswith("_"):
            raise AttributeError(label)

        def build(*inputs: Pattern, name: str | None = None, commutative: bool | None = None,
                  out: int | None = 0, **attrs) -> Pat:
            return Pat(label, tuple(inputs), dict(attrs), name, commutative, out)

        return build


P = _PatternBuilder()
_MISSING = object()
_MAX_UNIONS = 64  # Alt.required_kinds: combinations of the options' requirements listed
