"""FuseSharedInputMatMul: matmuls reading one x with rank-2 weights [K, N_i] (Q/K/V, gate/up)
become one matmul over the weights concatenated on the last axis plus a `narrow` per result; when
every branch adds a [N_i] bias, the biases are concatenated too (see `concat_weights`)."""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from ...ir.node import Node
from ...ir.op import Value
from ...ir.ops.elementwise import Binary, BinaryFn
from ...ir.ops.io import Constant, Param
from ...ir.shapes import Shape
from ...ir.weights import DeferredWeight, joined_weight
from ...rewrite import Match, MissReason, Rule, fail
from ..naming import fresh_name
from .checks import target_claims

__all__ = ["FUSE_SHARED_INPUT_MATMUL", "RULES", "concat_weights"]


# -- weight concatenation (shared with the SwiGLU rules) ----------------------------------------
def concat_weights(b, m: Match, olds: Sequence[Value]) -> Value:
    """The old values `olds` side by side on their last axis, as a value of the new graph `b`.

    All known (params with stored values, constants): constants are concatenated into a new
    constant; otherwise a new param named by joining the sources' names with "|"
    ("q.weight|k.weight|v.weight") gets the joined value in `b.weights`, deferred
    (`braze.ir.weights.joined_weight`): it is computed when first read - by the interpreter,
    the exporter, the executor - not while fusing. This bakes in the stored values: re-fuse
    after changing them. Otherwise (params fed at run time): a `concat` node over the params;
    constant folding or the executor hoists it out of the run loop, so it runs once per weight
    update, not per call. Other rules (SwiGLU, attention block) reuse this."""
    g = m.graph
    arrays = [_stored_value(g, v) for v in olds]
    if any(a is None for a in arrays):
        return b.concat([m.new(v) for v in olds], axis=-1)
    dtype = g.shape_of(olds[0]).dtype
    key = ("concat_weights", tuple(olds))  # the trial build and the real one share the join
    if all(isinstance(g.nodes[v.node].op, Constant) for v in olds):
        joined = m.memo(key, lambda: np.concatenate(arrays, axis=-1))
        return b.add_node(Constant(joined.astype(dtype.np, copy=False)), ())[0]
    name = fresh_name(g, b, "|".join(_source_name(g, v) for v in olds))
    joined = m.memo(key, lambda: joined_weight(arrays, -1, dtype.np, what=f"join {name!r}"))
    return b.param(name, Shape(joined.shape, dtype), joined)


def _stored_value(g, v: Value) -> np.ndarray | DeferredWeight | None:
    op = g.nodes[v.node].op
    if isinstance(op, Constant):
        return op.value
    if isinstance(op, Param):
        return g.weights.raw(op.name)
    return None


def _source_name(g, v: Value) -> str:
    op = g.nodes[v.node].op
    return op.name if isinstance(op, Param) else f"const{v.node}"


# -- matching -----------------------------------------------------------------------------------
def _lhs_matmuls(g, x: Value) -> list[Node]:
    """Matmuls reading `x` as their left operand, in node order."""
    return [u for u in g.users(x) if u.op.kind == "matmul" and u.inputs[0] == x]


def _is_matrix(g, mm: Node) -> bool:
    return g.shape_of(mm.inputs[1]).rank == 2


def _bias_of(g, mm: Node) -> tuple[Node, Value] | None:
    """(add node, bias) when the matmul's only consumer adds a [N] bias to it."""
    users = g.users(mm.value)
    if len(users) != 1 or g.is_output(mm.value):
        return None
    (add,) = users
    if not (isinstance(add.op, Binary) and add.op.fn is BinaryFn.ADD):
        return None
    a, c = add.inputs
    bias = c if a == mm.value else a
    if bias == mm.value:
        return None
    n = g.shape_of(mm.inputs[1]).dims[-1]
    bs = g.shape_of(bias)
    if bs.dims != (n,) or add.outputs[0] != mm.outputs[0]:
        return None
    return add, bias


def _depends_on(g, v: Value, ids: set[int], lo: int) -> bool:
    """Whether value `v` is computed from any node in `ids` (all of which are >= `lo`)."""
    stack, seen = [v.node], set()
    while stack:
        n = stack.pop()
        if n in ids:
            return True
        if n in seen or n < lo:
            continue
        seen.add(n)
        stack.extend(i.node for i in g.nodes[n].inputs)
    return False


def _acyclic(g, group: list[Node]) -> list[Node]:
    """The members whose weight (and bias) is not computed from another member."""
    ids = {n.id for n in group}
    lo = min(ids)
    keep = []
    for mm in group:
        bias = _bias_of(g, mm)
        ins = [mm.inputs[1]] + ([bias[1]] if bias else [])
        if not any(_depends_on(g, v, ids - {mm.id}, lo) for v in ins):
            keep.append(mm)
    return keep


def _group_match(rule: Rule, g, x: Value, group: list[Node]) -> Match:
    """One Match over `group`; the bias adds join it when every member has one."""
    biases = [_bias_of(g, mm) if _is_matrix(g, mm) else None for mm in group]
    folded = all(bi is not None for bi in biases)
    nodes: dict[str, Node] = {}
    values: dict[str, Value] = {"x": x}
    consumed: list[int] = []
    provides = []
    for i, mm in enumerate(group):
        nodes[f"mm{i}"] = mm
        values[f"w{i}"] = mm.inputs[1]
        consumed.append(mm.id)
        if folded:
            add, bias = biases[i]
            nodes[f"add{i}"] = add
            values[f"b{i}"] = bias
            consumed.append(add.id)
        provides.append(f"add{i}" if folded else f"mm{i}")
    root = nodes[provides[0]]
    return Match(rule, g, root, nodes, values, consumed, provides,
                 data={"n": len(group), "folded": folded, "outs": tuple(provides)})


def _match_shared(g, node: Node, ctx) -> Iterator[Match]:
    """Anchored at the first matmul reading x as its left operand, so each group is found once:
    the rank-2-weight matmuls on x (then, if that would form a cycle, those whose weights are
    not computed from the group); or, when fewer than two have rank-2 weights, all of them, for
    the shape check to explain."""
    if node.op.kind != "matmul":
        return
    x = node.inputs[0]
    group = _lhs_matmuls(g, x)
    if len(group) < 2 or group[0].id != node.id:
        return
    matrices = [mm for mm in group if _is_matrix(g, mm)]
    if len(matrices) < 2:
        yield _group_match(FUSE_SHARED_INPUT_MATMUL, g, x, group)
        return
    yield _group_match(FUSE_SHARED_INPUT_MATMUL, g, x, matrices)
    safe = _acyclic(g, matrices)
    if 2 <= len(safe) < len(matrices):
        yield _group_match(FUSE_SHARED_INPUT_MATMUL, g, x, safe)


def _explain_lone(g, node: Node, ctx):
    """A matmul alone on its input while other matmuls read that input incompatibly (as their
    right operand, i.e. contracting a different dim)."""
    x = node.inputs[0]
    if len(_lhs_matmuls(g, x)) != 1:
        return None
    others = [u for u in g.users(x) if u.op.kind == "matmul" and u.id != node.id]
    if not others:
        return None
    why = ", ".join(u.label for u in others)
    return fail(MissReason.SHARED_MATMUL_COUNT,
                detail=f"only {node.label} reads {g.node(x).label} as its left operand; {why} "
                       "read it as the right operand (a different contracted dim)")


# -- checks -------------------------------------------------------------------------------------
def _weights(m: Match) -> list[str]:
    return [f"w{i}" for i in range(m.data["n"])]


def weights_are_matrices(m: Match, ctx):
    """Every weight is a rank-2 [K, N_i] matrix with the same K."""
    shapes = [m.shape(w) for w in _weights(m)]
    bad = [s for s in shapes if s.rank != 2]
    if bad:
        return fail(MissReason.SHAPE_MISMATCH,
                    detail=f"weight {bad[0]} is not a [K, N] matrix; weights are "
                           + ", ".join(str(s) for s in shapes))
    if len({s.dims[0] for s in shapes}) > 1:
        return fail(MissReason.SHAPE_MISMATCH,
                    detail="weights differ in K: " + ", ".join(str(s) for s in shapes))
    return None


def static_widths(m: Match, ctx):
    """Every N_i is a static int (the narrows need fixed offsets)."""
    dyn = [m.shape(w) for w in _weights(m) if not isinstance(m.shape(w).dims[-1], int)]
    if dyn:
        return fail(MissReason.DYNAMIC_SHAPE, detail=f"weight {dyn[0]} has a symbolic width")
    return None


def one_dtype(m: Match, ctx):
    """x, the weights and the biases share one dtype."""
    dts = {m.shape(k).dtype for k in m.values}
    if len(dts) > 1:
        return fail(MissReason.DTYPE_MISMATCH, detail=", ".join(sorted(str(d) for d in dts)))
    return None


# -- replacement --------------------------------------------------------------------------------
def _build(b, m: Match):
    n = m.data["n"]
    h = b.matmul(m.v("x"), concat_weights(b, m, [m.values[f"w{i}"] for i in range(n)]))
    if m.data["folded"]:
        h = b.add(h, concat_weights(b, m, [m.values[f"b{i}"] for i in range(n)]))
    out, start = {}, 0
    for i, name in enumerate(m.data["outs"]):
        width = m.shape(f"w{i}").dims[-1]
        out[name] = b.narrow(h, -1, start, width)
        start += width
    return out


FUSE_SHARED_INPUT_MATMUL = Rule(
    "FuseSharedInputMatMul",
    _build,
    matcher=_match_shared,
    checks=(target_claims("shared_matmul"), weights_are_matrices, static_widths, one_dtype),
    root_test=lambda op: op.kind == "matmul",
    anchor=lambda op: op.kind == "matmul",
    explain=_explain_lone,
    produces="shared_matmul",
)
RULES = (FUSE_SHARED_INPUT_MATMUL,)
