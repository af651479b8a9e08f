"""Activations written in primitives become one unary op: GELU (erf form), GELU's tanh forms
(`gelu_new`, `gelu_pytorch_tanh`, `gelu_fast`: the same function written differently),
quick_gelu (x * sigmoid(1.702 x)), SiLU (x * sigmoid(x)), sigmoid and ReLU written as max(x, 0).

Recognition is semantic, not syntactic: a cone of smooth elementwise ops (add, sub, mul, div,
pow by a constant, neg, exp, tanh, erf, sigmoid, sqrt, reciprocal, max with 0) over one input x
and scalar constants is a function of x alone; braze evaluates that function in float64 on a
fixed set of probe points (dense on [-10, 10], plus large magnitudes) and compares it with each
known activation at the probes as the cone's dtype holds them. A match within 2e-7 relative
(for f16 / bf16 cones, whose constants are rounded to the dtype, an eighth of its epsilon; a
cone holding a max, exactly: max(x, 1e-8) is no relu), and within half its magnitude where it
is small (sigmoid(x) + 1e-8 is no sigmoid), is that activation (a cone that computes a
different function - a wrong constant, a missing factor, an epsilon - is not). So every way
of writing gelu_new an exporter emits is recognized, and nothing else is."""
from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

from ...interpret import interpret
from ...ir.graph import Graph
from ...ir.ops.elementwise import Binary, BinaryFn, Unary, UnaryFn
from ...ir.ops.io import Constant
from ...rewrite import Match, MissReason, Rule, fail
from .graph_memo import per_graph

__all__ = ["CANONICALIZE_ACTIVATION", "identify_activation", "PROBES"]

_SMOOTH_UNARY = frozenset({UnaryFn.NEG, UnaryFn.EXP, UnaryFn.TANH, UnaryFn.ERF, UnaryFn.SIGMOID,
                           UnaryFn.SQRT, UnaryFn.RECIPROCAL, UnaryFn.SQUARE, UnaryFn.RSQRT})
_BINARY = frozenset({BinaryFn.ADD, BinaryFn.SUB, BinaryFn.MUL, BinaryFn.DIV, BinaryFn.POW,
                     BinaryFn.MAX})
_TARGETS = (UnaryFn.GELU, UnaryFn.GELU_APPROX, UnaryFn.QUICK_GELU, UnaryFn.SILU,
            UnaryFn.SIGMOID, UnaryFn.RELU)
PROBES = np.concatenate([np.linspace(-10.0, 10.0, 401), [-60.0, -25.0, 25.0, 60.0],
                         [-700.0, -300.0, -150.0, 150.0, 300.0, 700.0],
                         [-0.0]])  # max(0, x) gives -0.0 there (the second of equal zeros)
# where a kink or a term far from zero shows (gelu(x) + relu(x - 100) is no gelu): every
# probe must give a finite value (up to |x| 700, exp stays finite in float64)
FAR_PROBES = np.array([-1e6, -1e4, 1e4, 1e6])
# beyond that, compared where the cone's value is finite (x * exp(x) / (1 + exp(x)) is SiLU
# but overflows there); probes past the dtype's range (float16) are left out
MAX_CONE = 24
_TRANSCENDENTAL = frozenset({UnaryFn.ERF, UnaryFn.TANH, UnaryFn.SIGMOID, UnaryFn.EXP})
TOLERANCE = 2e-7
SMALL_VALUE_NOISE = 1e-13  # see _keeps_small_values


def _scalar_const(g, v) -> bool:
    n = g.nodes[v.node]
    return isinstance(n.op, Constant) and n.op.value.size == 1


_MEMBER_UNARY = _SMOOTH_UNARY | frozenset(_TARGETS)  # one set: one (Python-level) enum hash


def _member(n) -> bool:
    op = n.op
    if isinstance(op, Unary):
        return op.fn in _MEMBER_UNARY
    return isinstance(op, Binary) and op.fn in _BINARY


def _is_max(n) -> bool:
    return isinstance(n.op, Binary) and n.op.fn is BinaryFn.MAX


def _region(g, root) -> tuple[set[int], bool, list, dict]:
    """One walk up from root over the smooth elementwise nodes of its shape, up to MAX_CONE of
    them: (their ids, whether one is transcendental, the inputs of members a cone cannot walk
    through (another shape, a producer outside the smooth ops, not a scalar constant) with the
    member reading each, and which member first read each member: see `_stops`)."""
    members, stack = set(), [root.id]
    reader = {root.id: -1}  # member id -> the member that first read it (the path back)
    out, nodes = root.outputs[0], g.nodes
    transcendental = False
    blocked = []  # (input the cone walk cannot pass, the member reading it)
    while stack and len(members) < MAX_CONE:
        nid = stack.pop()
        if nid in members:
            continue
        members.add(nid)
        n = nodes[nid]
        op = n.op
        if isinstance(op, Unary) and op.fn in _TRANSCENDENTAL:
            transcendental = True
        for v in n.inputs:  # cheapest tests first; a member again would be skipped
            if v.node in members:
                continue
            p = nodes[v.node]
            if v.index == 0 and _member(p) and p.outputs[0] == out:
                stack.append(p.id)
                reader.setdefault(p.id, nid)
            elif not _scalar_const(g, v):
                blocked.append((v, nid))
    return members, transcendental, blocked, reader


def _stops(nodes, blocked, reader) -> set | None:
    """The values a cone of the root can stop at (None: any). The walk `_cone_to` makes stops
    only at x and scalar constants, so each blocked input (`_region`) must be x or lie beyond
    x: x is on every path from the root to it, in particular on the one the region walk took
    (back through `reader`). Those paths share the members from their last common one up to
    the root, and a blocked input itself when all are one value; any other x gives no cone."""
    if not blocked:
        return None
    first, nid = blocked[0]
    chain = []  # members from the first blocked input's reader up to the root
    while nid != -1:
        chain.append(nid)
        nid = reader[nid]
    at = {m: i for i, m in enumerate(chain)}
    start = 0  # the members all paths share: chain[start:]
    one_value = True
    for v, nid in blocked[1:]:
        one_value = one_value and v == first
        while nid not in at:
            nid = reader[nid]
        start = max(start, at[nid])
    allowed = {nodes[m].value for m in chain[start:]}
    if one_value:
        allowed.add(first)
    return allowed


def _cone_to(g, root, x) -> set[int] | None:
    """The nodes on paths from x to root, if every other input along them is a scalar
    constant (a function of x alone)."""
    members, stack = set(), [root.id]
    while stack:
        nid = stack.pop()
        if nid in members:
            continue
        members.add(nid)
        if len(members) > MAX_CONE:
            return None
        n = g.nodes[nid]
        if not _member(n):
            return None
        for v in n.inputs:
            if v == x or _scalar_const(g, v):
                continue
            if g.nodes[v.node].outputs[0] != root.outputs[0] or v.index != 0:
                return None
            stack.append(v.node)
    return members


def _has_transcendental(g, members: set[int]) -> bool:
    ops = [g.nodes[i].op for i in members]
    return any(isinstance(op, Unary) and op.fn in _TRANSCENDENTAL for op in ops)


def _worth_probing(g, members: set[int], root) -> bool:
    return _has_transcendental(g, members) or (len(members) == 1 and _is_max(root))


def _cones(g, root):
    """Candidate (members, x) cones under root, the largest first: x is an input of the
    smooth region (farthest first) such that the cone is a function of x alone."""
    region, transcendental, blocked, reader = _region(g, root)
    if len(region) < MAX_CONE and not _is_max(root) and not transcendental:
        return  # the whole region is seen: no cone in it is worth probing
    allowed = _stops(g.nodes, blocked, reader)
    for x in _candidates(g, root, region, allowed):
        if g.shape_of(x) != root.outputs[0]:
            continue
        members = _cone_to(g, root, x)
        if members is not None and _worth_probing(g, members, root):
            yield members, x


def _candidates(g, root, region: set[int], allowed: set | None) -> list:
    """The stops to try, in order: the region's inputs (by member, then input order), then its
    members' values (by id), root excluded; only those in `allowed` (see `_stops`) when it is
    given. Those are members on the paths to the blocked inputs, and at most one input: the
    blocked one (a blocked input's node never joins the region)."""
    if allowed is not None:
        outside = [x for x in allowed if x.node not in region]
        return outside + sorted((x for x in allowed if x.node in region and x.node != root.id),
                                key=lambda x: x.node)
    leaves = []
    for nid in sorted(region):
        for v in g.nodes[nid].inputs:
            if v.node not in region and not _scalar_const(g, v) and v not in leaves:
                leaves.append(v)
    return leaves + [g.nodes[i].value for i in sorted(region) if i != root.id]


def identify_activation(g, members: set[int], x, root) -> UnaryFn | None:
    """The activation the cone computes, by probing (module docstring), or None."""
    fn, _ = probe_cone(g, members, x, root)
    return fn


NEAR_MISS = 1e-2  # a cone within this of an activation is reported as a near miss


def probe_cone(g, members: set[int], x, root) -> tuple[UnaryFn | None, tuple | None]:
    """(the activation the cone computes or None, (closest activation, max relative error)).
    Cones written alike (same ops, wiring and constants: one per layer of a model) are probed
    once; the answer is a function of that structure alone."""
    key = _cone_key(g, members, x, root)
    try:  # the one hash of the key (an op that cannot be hashed: probed, never kept)
        hit = _PROBED.get(key) if key is not None else None
    except TypeError:
        key = hit = None
    if hit is None:
        hit = _probe(g, members, x, root)
        if key is not None:
            if len(_PROBED) >= _PROBED_LIMIT:
                _PROBED.clear()
            _PROBED[key] = hit
    return hit


_PROBED: dict[tuple, tuple] = {}
_PROBED_LIMIT = 4096
_CONSTANT_KEYS: dict[int, tuple] = {}  # id(Constant op) -> (the op, its part of a cone key)


def _constant_key(g, v) -> tuple:
    """A scalar constant's part of a cone key: its value's dtype and bytes (and the dtype of
    the value it gives), kept per Constant op: one per layer is read again in every sweep."""
    op = g.nodes[v.node].op
    hit = _CONSTANT_KEYS.get(id(op))
    if hit is None or hit[0] is not op:
        if len(_CONSTANT_KEYS) >= _PROBED_LIMIT:
            _CONSTANT_KEYS.clear()
        c = np.asarray(op.value)
        hit = _CONSTANT_KEYS[id(op)] = (op, (g.shape_of(v).dtype.name, c.dtype.str, c.tobytes()))
    return hit[1]


def _cone_key(g, members: set[int], x, root) -> tuple:
    """What the probe's result depends on: x's dtype and, per member in node order, its op
    and where each input comes from (x, an earlier member, or a constant's dtype and bytes).
    Hashing it raises TypeError when an op cannot be hashed (`probe_cone` then probes)."""
    order = sorted(members)
    pos = {nid: i for i, nid in enumerate(order)}
    items = []
    nodes = g.nodes
    for nid in order:
        n = nodes[nid]
        ins = []
        for v in n.inputs:
            if v == x:
                ins.append(-1)
            elif v.node in pos:
                ins.append(pos[v.node])
            else:
                ins.append(_constant_key(g, v))
        items.append((n.op, tuple(ins)))
    return (g.shape_of(x).dtype.name, pos[root.id], tuple(items))


def _probe(g, members: set[int], x, root) -> tuple[UnaryFn | None, tuple | None]:
    sub = Graph("cone", record_provenance=False)
    dt = g.shape_of(x).dtype.np
    keep = np.abs(FAR_PROBES) < float(ml_dtypes.finfo(dt).max) / 16  # bf16 too
    probes = np.concatenate([PROBES, FAR_PROBES[keep]])
    vmap = {x: sub.input("x", g.shape_of(x).with_dims((len(probes),)))}
    for nid in sorted(members):
        n = g.nodes[nid]
        ins = []
        for v in n.inputs:
            if v not in vmap:
                c = g.nodes[v.node].op.value
                vmap[v] = sub.constant(np.asarray(c).reshape(()), g.shape_of(v).dtype)
            ins.append(vmap[v])
        vmap[n.value] = sub.add_node(n.op, ins)[0]
    sub.set_outputs([vmap[root.value]])
    feeds = {"x": probes.astype(dt)}
    try:
        with np.errstate(all="ignore"):
            (got,) = interpret(sub, feeds, float64=True)
    except Exception:  # noqa: BLE001 - a cone that cannot run on the probes is no activation
        return None, None
    got = np.asarray(got, np.float64)
    if not np.isfinite(got[:len(PROBES)]).all():
        return None, None
    judged = np.concatenate([np.ones(len(PROBES), bool), np.isfinite(got[len(PROBES):])])
    has_max = any(_is_max(g.nodes[i]) for i in members)
    closest, tails = None, None
    for fn in _TARGETS:
        want = np.concatenate([_on_probes(fn, dt), _on_far(fn, dt)[keep]])[judged]
        diff = np.abs(got[judged] - want)
        err = float(np.max(diff / np.maximum(1.0, np.abs(want))))
        if closest is None or err < closest[1]:
            closest, tails = (fn, err), _keeps_small_values(diff, want) and (
                not has_max or np.array_equal(np.signbit(got[judged]), np.signbit(want)))
    if closest[1] <= _tolerance(dt, has_max) and tails:
        return closest[0], closest
    return None, closest


def _keeps_small_values(diff: np.ndarray, want: np.ndarray) -> bool:
    """Whether the cone follows the activation where the activation is small: the tolerance
    is absolute there (relative to 1), so sigmoid(x) + 1e-8 (an epsilon before a log) passed
    for sigmoid, and log of it gave -100 where the graph gives -18.4. Allowed: half the
    activation's magnitude, or SMALL_VALUE_NOISE (what float64 cancellation in a tail leaves:
    1 + tanh(z) is 0 in one form of tanh-GELU and 1e-21 in another)."""
    return bool(np.all(diff <= np.maximum(SMALL_VALUE_NOISE, 0.5 * np.abs(want))))


def _tolerance(dt, has_max: bool = False) -> float:
    """TOLERANCE, or for a half-precision cone (whose constants hold only the dtype's nearest
    value: f16's sqrt(2) is 1.4140625) an eighth of the dtype's epsilon: what that rounding
    moves GELU by. In f16 a constant one step off moves it more and is refused; in bf16 the
    span (~1e-3) also holds functions that differ by less than bf16 resolves (tanh-GELU with
    0.8 for sqrt(2 / pi) is taken as GELU), a difference under the dtype's own rounding.
    A cone holding a max must match exactly, zeros' signs included: max(x, 1e-8) (a clamp
    before a log or a division) is within any tolerance of relu, yet gives 0 where the graph
    gives 1e-8, and max(x, -0.0) gives -0.0 where relu gives 0.0."""
    if has_max:
        return 0.0
    if dt.itemsize >= 4:
        return TOLERANCE
    return float(ml_dtypes.finfo(dt).eps) / 8


@functools.cache
def _on_probes(fn: UnaryFn, dt) -> np.ndarray:
    """The activation's reference values on PROBES as fed in `dt` (rounded: f16 holds no
    -9.95), computed once per dtype: each probe compares with every target, and the erf of
    GELU is costly in NumPy."""
    want = Unary(fn).reference(PROBES.astype(dt).astype(np.float64))
    want.setflags(write=False)
    return want


@functools.cache
def _on_far(fn: UnaryFn, dt) -> np.ndarray:
    """The activation's reference values on FAR_PROBES as fed in `dt`."""
    with np.errstate(all="ignore"):
        want = Unary(fn).reference(FAR_PROBES.astype(dt).astype(np.float64))
    want.setflags(write=False)
    return want


def _root_test(op) -> bool:
    """A smooth elementwise op that is not already a canonical activation."""
    if op.elementwise is False:
        return False
    if isinstance(op, Unary):
        return op.fn in _SMOOTH_UNARY and op.fn not in _TARGETS
    return isinstance(op, Binary) and op.fn in _BINARY


@per_graph
def _below_a_transcendental(g) -> frozenset[int]:
    """The nodes at most MAX_CONE smooth ops of one type below a transcendental op: only
    there (or at a max) can a cone worth probing end, since a cone is at most MAX_CONE smooth
    ops of its root's type, connected, and holds a transcendental op unless it is one max.
    Found once per graph (`per_graph`: again when it grew or was patched), so the matcher
    skips every other root without walking its region."""
    depth = {n.id: 0 for n in g.nodes
             if isinstance(n.op, Unary) and n.op.fn in _TRANSCENDENTAL}
    todo = list(depth)
    while todo:
        nid = todo.pop()
        d, out = depth[nid] + 1, g.nodes[nid].outputs[0]
        if d > MAX_CONE:
            continue
        for u in g.users(nid):
            if d < depth.get(u.id, MAX_CONE + 1) and _member(u) and u.outputs[0] == out:
                depth[u.id] = d
                todo.append(u.id)
    return frozenset(depth)


def _matcher(g, node, ctx):
    if not _root_test(node.op):
        return
    if not node.outputs[0].dtype.is_float:
        return
    if not _is_max(node) and node.id not in _below_a_transcendental(g):
        return
    near = None
    for members, x in _cones(g, node):
        fn, closest = probe_cone(g, members, x, node)
        if fn is not None:
            yield Match(CANONICALIZE_ACTIVATION, g, node, {"root": node}, {"x": x},
                        tuple(sorted(members)), data={"fn": fn})
            return
        if near is None and closest is not None and closest[1] < NEAR_MISS:
            near = (members, x, closest)
    if near is not None:
        members, x, (fn, err) = near
        yield Match(CANONICALIZE_ACTIVATION, g, node, {"root": node}, {"x": x},
                    tuple(sorted(members)), data={"miss": fail(
                        MissReason.PATTERN_MISMATCH,
                        detail=f"this elementwise expression is close to {fn.value} but not "
                               f"equal (max relative error {err:.1e} on the probes)",
                        hint="check the constants: a mistyped constant changes the function")})


def recognized(m, ctx):
    """The cone computes a known activation."""
    return m.data.get("miss")


CANONICALIZE_ACTIVATION = Rule(
    "CanonicalizeActivation", lambda b, m: b.activation(m.v("x"), m.data["fn"]),
    matcher=_matcher, checks=(recognized,), root_test=_root_test,
    produces="activation",
    # a cone worth probing holds a transcendental op or is a max: a graph without one has no
    # match and no near miss, and the driver skips the rule there
    requires=frozenset({tuple(sorted(f.value for f in _TRANSCENDENTAL)) +
                        (BinaryFn.MAX.value,)}))
