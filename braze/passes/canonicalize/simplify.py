"""AlgebraicSimplify: identities that keep a value's meaning, shape and dtype, written as a table
of one-line rules (tinygrad style) with the identity beside each rule. A rule replaces only its
root: an interior value something else reads stays for that reader, a dead one goes in DCE, so a
shared operand never blocks a rule. The rewrite driver's per-rule statistics name each rule's
file and line.

A rule whose result would change the root's broadcast shape or dtype does not fire (a reported
miss, SHAPE_MISMATCH / DTYPE_MISMATCH). Zeros keep signed zeros (IEEE, as LLVM without
fast-math): `x + (-0.0)` and `x - 0.0` fold, `x + 0.0` and `x - (-0.0)` only where x cannot be
-0.0 (an integer, a cast from one, exp, sigmoid), since -0.0 + 0.0 is +0.0. `x - x -> 0` holds
for integers only (a float x - x is
NaN where x is inf or NaN); `where(isnan(p), 0, p) -> p` holds when p is a softmax output
(braze's softmax is safe: a fully masked row gives zeros, never NaN); `cast(cast(x))` folds only
when the middle cast holds every value of x exactly (f32 -> f64 -> t, never f32 -> f16 -> t).
The transpose / reshape chains and identity transpose / reshape / expand / cast come from
canonicalize/layout.py (the same rules, reused).

`simplify(g)` (`bz.simplify`) runs the rules, constant folding (const_fold.py), CSE and DCE to a
fixed point; every round is one linear sweep of each, and the rounds are bounded (more means a
runaway rule: PassError). Inside `bz.fuse` only constants fold (see `AlgebraicSimplify`)."""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ...errors import PassError
from ...ir.dtypes import DType
from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.op import Value, op_class
from ...ir.ops.elementwise import Binary, BinaryFn, Cast, Unary, UnaryFn
from ...ir.ops.io import Constant
from ...ir.ops.reduce import Softmax
from ...ir.ops.shape import Concat
from ...ir.shapes import normalize_axis
from ...rewrite import Match, MissReason, P, Rule, RuleStats, V, fail, rewrite
from ...rewrite.dispatch import KindsPresent
from ...rewrite.driver import RewriteContext
from ...rewrite.in_place import rewrite_in_place
from ..base import PassResult
from ..cleanup import common_subexpression_elimination, eliminate_dead_code
from ..const_fold import DEFAULT_MAX_ELEMENTS, ConstantFolding, known_source, may_fold
from .layout import COMPOSE_RESHAPES, COMPOSE_TRANSPOSES, DROP_IDENTITY

__all__ = ["SIMPLIFY_RULES", "WHERE_SAME", "AlgebraicSimplify", "simplify",
           "simplify_with_stats", "exact_cast"]


# -- what the patterns capture ----------------------------------------------------------------
def _constant_where(test: Callable[[np.ndarray], np.ndarray]):
    """A Var predicate: the value is a non-empty constant whose every element passes `test`.
    The answer is kept per Constant op (rebuilt graphs share their ops), so a large constant
    is scanned once, not once per sweep."""
    seen: dict[int, tuple[Constant, bool]] = {}

    def where(g, v) -> bool:
        op = g.nodes[v.node].op
        if not isinstance(op, Constant):
            return False
        hit = seen.get(id(op))
        if hit is None or hit[0] is not op:
            if len(seen) >= 4096:
                seen.clear()
            hit = seen[id(op)] = (op, op.value.size > 0 and bool(np.all(test(op.value))))
        return hit[1]
    where.constant_only = True  # `_rule` skips roots that read no constant at all
    return where


X = V("x")
Y = V("y")
ONE = V("one", _constant_where(lambda a: a == 1))
ZERO = V("zero", _constant_where(lambda a: a == 0))


def _signed_zero(negative: bool):
    """Zeros that are an exact identity: integer zeros, and float zeros of the given sign
    (IEEE: x + (-0.0) and x - (+0.0) are x for every x, -0.0 included; x + (+0.0) is +0.0 at
    x = -0.0). Complex zeros are left alone."""
    def test(a: np.ndarray):
        if a.dtype.kind in "iub":
            return a == 0
        if a.dtype.kind == "c":
            return np.zeros(a.shape, bool)
        return (a == 0) & (np.signbit(a.astype(np.float32)) == negative)
    return test


NEG_ZERO = V("zero", _constant_where(_signed_zero(negative=True)))
POS_ZERO = V("zero", _constant_where(_signed_zero(negative=False)))
TRUE = V("cond", _constant_where(lambda a: a.dtype == np.bool_ and a))
FALSE = V("cond", _constant_where(lambda a: a.dtype == np.bool_ and ~a))


def _unary(fn: UnaryFn, x):
    return P.of(Unary, x, fn=fn)


def _binary(fn: BinaryFn, a, b):
    return P.of(Binary, a, b, fn=fn)


# -- checks (a rejected match is a reported miss with its reason) -----------------------------
def _keeps_type(name: str):
    """The root may become capture `name` only if that has the root's dims and dtype."""
    def check(m: Match, ctx) -> object:
        want, got = m.root.outputs[0], m.shape(name)
        if got == want:
            return None
        reason = MissReason.SHAPE_MISMATCH if got.dtype == want.dtype else MissReason.DTYPE_MISMATCH
        return fail(reason, detail=f"{m.rule.name} would turn {want} into {name}'s {got}",
                    hint="the other operand broadcasts (or converts) the result, so the identity "
                    "does not hold for its shape; braze keeps the op")
    return check


def _integer(m: Match, ctx):
    dt = m.shape("x").dtype
    if dt.is_int:
        return None
    return fail(MissReason.DTYPE_MISMATCH, detail=f"x - x on {dt} is NaN, not 0, where x is "
                "inf or NaN", hint="braze folds x - x to zeros for integers only")


def _softmax_output(m: Match, ctx):
    """p must be a softmax output (through float casts): then it is never NaN."""
    g, v = m.graph, m.values["p"]
    while isinstance(g.nodes[v.node].op, Cast) and g.nodes[v.node].op.dtype.is_float:
        v = g.nodes[v.node].inputs[0]
    n = g.nodes[v.node]
    if isinstance(n.op, Softmax):
        return None
    return fail(MissReason.PATTERN_MISMATCH, detail=f"p comes from {n.label}, not a softmax, "
                "so where(isnan(p), 0, p) may replace NaNs",
                hint="only a softmax output is known to be NaN-free; braze keeps the guard")


# dtype -> the dtypes that hold every one of its values exactly
_EXACT_INTO: dict[str, frozenset[str]] = {
    "bool": frozenset({"i8", "i16", "i32", "i64", "u8", "u32", "f16", "bf16", "f32", "f64"}),
    "i8": frozenset({"i16", "i32", "i64", "f16", "bf16", "f32", "f64"}),
    "u8": frozenset({"i16", "i32", "i64", "u32", "f16", "bf16", "f32", "f64"}),
    "i16": frozenset({"i32", "i64", "f32", "f64"}),
    "i32": frozenset({"i64", "f64"}),
    "u32": frozenset({"i64", "f64"}),
    "f16": frozenset({"f32", "f64"}),
    "bf16": frozenset({"f32", "f64"}),
    "f32": frozenset({"f64"}),
}


def exact_cast(src: DType, dst: DType) -> bool:
    """Whether casting `src` to `dst` keeps every value exactly (so casting back is the identity
    and any further cast sees the same numbers)."""
    return src == dst or dst.name in _EXACT_INTO.get(src.name, frozenset())


def _exact_middle(m: Match, ctx):
    src, mid = m.shape("x").dtype, m.op("mid").dtype
    if exact_cast(src, mid):
        return None
    return fail(MissReason.DTYPE_MISMATCH, detail=f"the middle cast {src} -> {mid} rounds "
                "values, so cast(cast(x)) is not one cast",
                hint="the round trip through the narrower type changes values; braze keeps it")


# -- structural conditions (a node that fails one is simply not the pattern) ------------------
_NEVER_NEG_ZERO = frozenset({UnaryFn.EXP, UnaryFn.SIGMOID})  # +0.0 where they underflow


def _never_negative_zero(g, node, b) -> bool:
    """x cannot be -0.0 (so x + 0.0 and x - (-0.0) are x): an integer or bool, a cast from
    one, or an exp / sigmoid. Anything else may be -0.0, and braze keeps the add."""
    x = g.nodes[b["x"].node]
    if not g.shape_of(b["x"]).dtype.is_float:
        return True
    if isinstance(x.op, Cast):
        return not g.shape_of(x.inputs[0]).dtype.is_float
    return isinstance(x.op, Unary) and x.op.fn in _NEVER_NEG_ZERO


def _full_narrow(g, node, b) -> bool:
    op = node.op
    dims = g.shape_of(b["x"]).dims
    return op.start == 0 and dims[normalize_axis(op.axis, len(dims))] == op.length


def _full_slice(g, node, b) -> bool:
    op = node.op
    dims = g.shape_of(b["x"]).dims
    d = dims[normalize_axis(op.axis, len(dims))]
    return isinstance(d, int) and slice(op.start, op.stop, op.step).indices(d) == (0, d, 1)


# -- replacements -----------------------------------------------------------------------------
def _zeros(b, m):
    """Zeros of the root's dtype, broadcast to its dims (symbolic dims stay symbolic)."""
    out = m.root.outputs[0]
    z = b.constant(np.zeros((), out.dtype.np))
    return b.expand(z, out.dims) if out.rank else z


def _fold_casts(b, m):
    x, dt = m.v("x"), m.root.op.dtype
    return x if m.shape("x").dtype == dt else b.cast(x, dt)


def _root_test(pattern) -> Callable:
    """A cheap test of the root op (kind, and `fn` when the pattern fixes it): the driver runs
    every rule's root test on every node."""
    kind = pattern.op if isinstance(pattern.op, str) else pattern.op.kind
    op_class(kind)  # a label that is not a kind would never match
    fn = pattern.attrs.get("fn")
    if set(pattern.attrs) - {"fn"}:
        return pattern.root_test()
    if fn is None:
        return lambda op: op.kind == kind
    return lambda op: op.kind == kind and op.fn is fn


# -- the table --------------------------------------------------------------------------------
def _rule(name: str, pattern, result: str | Callable, *checks, when=None) -> Rule:
    """One table row. `result` names the capture the root becomes (a check that it has the
    root's type is added) or builds the replacement `fn(b, m)`; `when(g, node, bindings)`
    filters structurally (no miss); `checks` reject with a reason. Only the root is replaced."""
    f = sys._getframe(1)
    source = f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"
    if isinstance(result, str):
        checks = checks + (_keeps_type(result),)
        build = (lambda b, m, k=result: m.v(k))
    else:
        build = result
    rule = Rule(name, build, pattern=pattern, checks=tuple(checks), source=source,
                root_test=_root_test(pattern))

    tests = _constant_operand_tests(pattern)
    shaped = _operand_shape_test(pattern)

    def root_only(g, node, ctx) -> list[Match]:  # a list: most roots have none, built fast
        if shaped is not None and not shaped(g.nodes, node):
            return []
        if tests:
            nodes = g.nodes
            for v in node.inputs:
                if isinstance(nodes[v.node].op, Constant) and any(t(g, v) for t in tests):
                    break
            else:
                return []
        found = []
        for bound, _ in pattern.match_node(g, node, {}, ()):
            if when is not None and not when(g, node, bound):
                continue
            nodes = {k: x for k, x in bound.items() if isinstance(x, Node)}
            values = {k: x for k, x in bound.items() if isinstance(x, Value)}
            found.append(Match(rule, g, node, nodes, values, (node.id,)))
        return found

    rule.matcher = root_only
    return rule


def _constant_operand_tests(pattern) -> tuple[Callable, ...]:
    """The tests of the root's operands that are captured only when a constant passes them
    (ONE, ZERO, TRUE, FALSE): a root none of whose inputs passes one cannot match, and most
    nodes are such roots (each constant's answer is kept, see `_constant_where`)."""
    return tuple(p.where for p in getattr(pattern, "inputs", None) or ()
                 if isinstance(p, V) and getattr(p.where, "constant_only", False))


def _operand_shape_test(pattern) -> Callable | None:
    """A necessary condition on the root's operands, tested before the pattern: the operands
    the pattern binds to one Var are one value (x - x, where(c, x, x)), and an operand the
    pattern reads through an op has a producer of that op's kind (-(-x), cast(cast(x)), the
    isnan of the sdpa guard). None when the pattern fixes neither. Where the operands may be
    swapped (a commutative binary) only the first holds for either order, so only it is
    tested; a root of another arity is left to the pattern."""
    subs = getattr(pattern, "inputs", None)
    if not subs:
        return None
    first_at: dict[str, int] = {}
    same, kinds = [], []
    for i, p in enumerate(subs):
        if isinstance(p, V):
            if p.name in first_at:
                same.append((first_at[p.name], i))
            first_at.setdefault(p.name, i)
        elif hasattr(p, "op_matches"):
            kinds.append((i, p.root_test()))
    if not same and not kinds:
        return None
    arity, may_swap = len(subs), pattern._is_commutative

    def test(nodes, node) -> bool:
        ins = node.inputs
        if len(ins) != arity:
            return True
        for i, j in same:
            if ins[i] != ins[j]:
                return False
        if kinds and not (arity == 2 and may_swap(node.op)):
            for i, op_test in kinds:
                if not op_test(nodes[ins[i].node].op):
                    return False
        return True
    return test


def _empty_along_axis(g, node) -> list[bool]:
    axis = node.op.axis % node.outputs[0].rank
    return [g.shape_of(v).dims[axis] == 0 for v in node.inputs]


def _has_empty_operand(g, node, bound) -> bool:
    """Some but not all operands are statically empty along the axis (a rope's pass-through
    part when all of the head is rotated: Phi-3 through TorchScript and torch.export)."""
    empty = _empty_along_axis(g, node)
    return any(empty) and not all(empty)


def _drop_empty_operands(b, m):
    root = m.root
    kept = [m.new(v) for v, e in zip(root.inputs, _empty_along_axis(m.graph, root)) if not e]
    return kept[0] if len(kept) == 1 else b.concat(kept, root.op.axis)


_F, _U = BinaryFn, UnaryFn
_NAN_GUARD = P.where(P.isnan(V("p")), ZERO, V("p"))
_CAST_CAST = P.cast(P.cast(X, name="mid"))  # the middle cast holds every value of x (f32 -> f64)
ALGEBRAIC_RULES = (
    _rule("MulOne", _binary(_F.MUL, X, ONE), "x"),                  # x*1 -> x, 1*x -> x
    _rule("AddZero", _binary(_F.ADD, X, NEG_ZERO), "x"),            # x+(-0.) -> x, int x+0 -> x
    _rule("SubZero", _binary(_F.SUB, X, POS_ZERO), "x"),            # x-(+0.) -> x, int x-0 -> x
    _rule("AddPosZero", _binary(_F.ADD, X, POS_ZERO), "x",          # x+0. -> x where x is
          when=_never_negative_zero),                                #   never -0.
    _rule("SubNegZero", _binary(_F.SUB, X, NEG_ZERO), "x",          # x-(-0.) -> x where x is
          when=_never_negative_zero),                                #   never -0.
    _rule("DivOne", _binary(_F.DIV, X, ONE), "x"),                  # x/1 -> x
    _rule("PowOne", _binary(_F.POW, X, ONE), "x"),                  # x**1 -> x
    _rule("SubSelf", _binary(_F.SUB, X, X), _zeros, _integer),      # x-x -> 0 (integers)
    _rule("MaxSelf", _binary(_F.MAX, X, X), "x"),                   # max(x, x) -> x
    _rule("MinSelf", _binary(_F.MIN, X, X), "x"),                   # min(x, x) -> x
    _rule("AndSelf", _binary(_F.AND, X, X), "x"),                   # x and x -> x
    _rule("OrSelf", _binary(_F.OR, X, X), "x"),                     # x or x -> x
    _rule("NegNeg", _unary(_U.NEG, _unary(_U.NEG, X)), "x"),        # -(-x) -> x
    _rule("NotNot", _unary(_U.NOT, _unary(_U.NOT, X)), "x"),        # not(not x) -> x
    WHERE_SAME := _rule("WhereSame", P.where(V("cond"), X, X), "x"),  # where(c, x, x) -> x
    _rule("WhereTrue", P.where(TRUE, X, Y), "x"),                   # where(True, x, y) -> x
    _rule("WhereFalse", P.where(FALSE, Y, X), "x"),                 # where(False, y, x) -> x
    _rule("SoftmaxNanGuard", _NAN_GUARD, "p", _softmax_output),     # where(isnan(p),0,p) -> p
    _rule("CastCast", _CAST_CAST, _fold_casts, _exact_middle),      # cast(cast(x, f64)) -> cast(x)
    _rule("FullNarrow", P.narrow(X), "x", when=_full_narrow),       # x[0:n] of n rows -> x
    _rule("FullSlice", P.slice(X), "x", when=_full_slice),          # x[0:n:1] of n rows -> x
    _rule("ConcatOne", P.of(Concat, X), "x"),                       # concat([x]) -> x
    _rule("ConcatEmpty", P.any_inputs(Concat), _drop_empty_operands,  # concat([x, x[n:]])
          when=_has_empty_operand),                                  #   of n rows -> x
)
# transpose(transpose(x)) -> one transpose, reshape(reshape(x)) -> one reshape, and identity
# transpose / reshape / expand / cast -> x: layout.py's rules, one definition
SIMPLIFY_RULES = ALGEBRAIC_RULES + (COMPOSE_TRANSPOSES, COMPOSE_RESHAPES, DROP_IDENTITY)


# -- the pass and bz.simplify -----------------------------------------------------------------
def _fold_constants_only() -> ConstantFolding:
    return ConstantFolding(fold_weights=False)


@dataclass
class AlgebraicSimplify:
    """SIMPLIFY_RULES, constant folding (`fold`; None turns it off), then DCE (and CSE with
    `cse=True`), to a fixed point. Rule statistics add up over the rounds; the misses are those
    of the last round (still present in the result). The canonicalization stage runs it
    without CSE: merging equal values would give pattern interiors extra readers that block
    later recognizers. By default only constants fold: `bz.fuse` keeps computations on stored
    weights as weight preparation, which the executor recomputes when weights are updated
    (`bz.simplify` folds stored weights too)."""

    name: str = "AlgebraicSimplify"
    cse: bool = False
    max_rounds: int = 8
    fold: ConstantFolding | None = field(default_factory=_fold_constants_only)

    def run(self, g: Graph, ctx: RewriteContext | None = None) -> PassResult:
        t0 = time.perf_counter()
        ctx = ctx or RewriteContext()
        stats = {r.name: RuleStats(r.name, r.source) for r in SIMPLIFY_RULES}
        cur, changed = g, False
        if self.cse:
            cur, changed = common_subexpression_elimination(cur)
        roots = None  # where this round's rewrite looks (None: everywhere)
        settled = False  # the last fold found nothing to try, and no rewrite made anything new
        for _ in range(self.max_rounds):
            fold_misses, folded_any = [], False
            if self.fold is not None and not settled:
                if may_fold(cur, self.fold.fold_weights):
                    folded = self.fold.run(cur, ctx)
                else:  # nothing to try: the (zero) statistics of a run, without its scan
                    folded = self.fold.run(_NO_NODES, ctx)
                    folded.graph = cur
                cur, changed = folded.graph, changed or folded.changed
                fold_misses, folded_any = folded.misses, folded.changed
                tried_none = not folded.stats["ConstantFolding"].attempts
                for k, s in folded.stats.items():
                    stats.setdefault(k, RuleStats(s.rule, s.source)).merge(s)
                    stats[k].near_misses = s.near_misses  # what is still over the cap
            # the sweeps run to their own fixed point (a chain of n reshapes or transposes
            # halves per sweep); only a fold or a CSE merge can expose a new match after that
            look = None if folded_any else roots
            if look is not None and not look:  # nowhere to look, and `cur` had its DCE
                return PassResult(self.name, cur, changed, stats, fold_misses,
                                  time.perf_counter() - t0)
            res = _rewrite_round(cur, ctx, look)
            for k, s in res.stats.items():
                stats[k].merge(s)
            cur, new_id = _dead_code_eliminated(res)
            dropped = cur is not res.graph
            changed = changed or res.changed or dropped
            merged = False
            if self.cse and (res.changed or folded_any):
                cur, merged = common_subexpression_elimination(cur)
            # a rule's result may be known where its root was not (where(True, c, x) -> c)
            if not merged and not (self.fold is not None and res.changed):
                return PassResult(self.name, cur, changed, stats, fold_misses + res.misses,
                                  time.perf_counter() - t0)
            # the rules read only above their root (`Rule.depth`) and DCE keeps what is above
            # every live node: unless a fold or a CSE merge changes the graph, only the roots
            # of matches the last sweep did not take (checks may read anything) can match now
            roots = None if merged or not _ALL_BOUNDED else {
                new_id[i] for i in res.tried if new_id[i] is not None}
            settled = self.fold is not None and not merged and tried_none and \
                not _may_fold(res, self.fold.fold_weights)
        busy = [k for k, s in stats.items() if s.matches]
        raise PassError(f"{self.name} found no fixed point in {self.max_rounds} rounds on graph "
                        f"{g.name!r}; rules still matching: {busy}")


_MAX_SWEEPS = 32


_NO_NODES = Graph("no nodes", record_provenance=False)


def _may_fold(res, fold_weights: bool) -> bool:
    """Whether constant folding may find something to try after `res` (an in-place rewrite),
    when it found nothing before: only a node the rewrite built or rewired can have come to
    read known values alone (the first such node in the graph reads only known sources; any
    other node reads what it read before). Always True after the driver's rewrite."""
    touched = getattr(res, "touched", None)
    if touched is None:
        return res.changed
    g = res.graph
    nodes = g.nodes
    return any(all(known_source(g, nodes[v.node].op, fold_weights) for v in nodes[nid].inputs)
               for nid in touched)


def _dead_code_eliminated(res) -> tuple[Graph, list[int | None]]:
    """DCE of the rewrite's graph, keeping the op kinds an in-place rewrite tracked for the
    result (the next rule pass then does not count them again)."""
    out, new_id = eliminate_dead_code(res.graph)
    kinds = getattr(res, "kinds", None)
    if kinds is not None and out is not res.graph:
        dead = res.dead
        kinds = kinds.copy()
        kinds.add_nodes((n for n, i in zip(res.graph.nodes, new_id)
                         if i is None and n.id not in dead), -1)
        KindsPresent.remember(out, kinds)
    return out, new_id


def _rewrite_round(g: Graph, ctx: RewriteContext, roots: set[int] | None):
    """The rewrite of one round: SIMPLIFY_RULES replace only their roots, so the sweeps patch
    one working copy (braze/rewrite/in_place.py) and only the DCE after them emits a new graph; the
    driver (a rebuild per sweep) where a match does not fit in place. The result's graph
    still holds the dead nodes and `tried` its ids, as the driver's."""
    res = rewrite_in_place(g, SIMPLIFY_RULES, ctx, max_sweeps=_MAX_SWEEPS, roots=roots)
    if res is None:
        return rewrite(g, SIMPLIFY_RULES, ctx, max_sweeps=_MAX_SWEEPS, roots=roots)
    return res
_ALL_BOUNDED = all(r.depth is not None for r in SIMPLIFY_RULES)


def simplify_with_stats(g: Graph, *, max_elements: int = DEFAULT_MAX_ELEMENTS
                        ) -> tuple[Graph, dict[str, RuleStats]]:
    """`simplify`, also returning each rule's statistics (matches, attempts, misses, time,
    and the rule's `source` file:line; "ConstantFolding" counts folded values and, as near
    misses, results left computed because they exceed `max_elements`)."""
    res = AlgebraicSimplify(cse=True, fold=ConstantFolding(max_elements=max_elements)).run(g)
    return res.graph, res.stats


def simplify(g: Graph, *, max_elements: int = DEFAULT_MAX_ELEMENTS) -> Graph:
    """Algebraic identities, constant folding (constants and stored weights; results of at
    most `max_elements` elements), CSE and DCE to a fixed point (`bz.simplify`). Returns a new
    graph computing the same outputs with the same shapes and dtypes; `g` is not changed."""
    return simplify_with_stats(g, max_elements=max_elements)[0]
