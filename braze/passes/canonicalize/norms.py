"""LayerNorm and RMSNorm written in primitives become the layer_norm / rms_norm ops:

  LayerNorm: d = x - mean(x); d / sqrt(mean(d^2) + eps)   (or d * rsqrt(...)) * gamma + beta
  RMSNorm:   x / sqrt(mean(x^2) + eps)                    (or x * rsqrt(...))  * gamma (+ beta)

over the trailing axes (kept as the op's axis), where x^2 is pow(x, 2) or x * x, the inverse
square root is rsqrt, reciprocal(sqrt), 1 / sqrt or pow(., -0.5), eps a constant (or absent:
eps 0), gamma and beta any values shaped like the normalized dims (Gemma's (1 + w) is just a
computed gamma: it reads only a param, so it is weight preparation), in either operand order,
with float casts around the statistics (f32 compute) peeled when they are identities for the
graph's dtype."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...ir.ops.elementwise import Binary, BinaryFn, Cast, Unary, UnaryFn
from ...ir.ops.io import Constant
from ...ir.ops.reduce import Reduce, ReduceFn
from ...rewrite import Match, MissReason, Rule, fail
from .graph_memo import per_graph

__all__ = ["CANONICALIZE_NORM"]


def _const(g, v) -> float | None:
    n = g.nodes[v.node]
    if isinstance(n.op, Constant) and n.op.value.size == 1 and g.shape_of(v).dtype.is_float:
        return float(n.op.value.reshape(-1)[0])
    return None


def _is(n, cls, fn=None) -> bool:
    return isinstance(n.op, cls) and (fn is None or n.op.fn is fn)


@dataclass
class _Norm:
    x: object = None
    eps: float = 0.0
    rms: bool = False
    axis: int = -1
    gamma: object = None
    beta: object = None
    nodes: list[int] = field(default_factory=list)


def _exact_cast(src, dst) -> bool:
    """A float cast from `src` to `dst` keeps every value: the same type, or a wider float
    (f16 / bf16 -> f32 -> f64; f16 <-> bf16, of one size, each loses values of the other)."""
    return src == dst or dst.itemsize > src.itemsize


def _strip_casts(g, v, nodes, narrowing: bool = False):
    """Peel float casts above v. Only casts that keep every value (widening: f16 -> f32) are
    identities a norm's statistics may drop; a narrowing one (f32 -> f16) rounds, so the walk
    stops there unless `narrowing` (the output side: `_with_gamma` checks those casts against
    the norm input's dtype)."""
    while _is(g.nodes[v.node], Cast) and g.nodes[v.node].op.dtype.is_float:
        src = g.shape_of(g.nodes[v.node].inputs[0]).dtype
        if not src.is_float or not (narrowing or _exact_cast(src, g.nodes[v.node].op.dtype)):
            break
        nodes.append(v.node)
        v = g.nodes[v.node].inputs[0]
    return v


def _square_of(g, v, nodes):
    """t when v = t * t or pow(t, 2)."""
    n = g.nodes[v.node]
    if _is(n, Binary, BinaryFn.MUL) and n.inputs[0] == n.inputs[1]:
        nodes.append(n.id)
        return n.inputs[0]
    if _is(n, Binary, BinaryFn.POW) and _const(g, n.inputs[1]) == 2.0:
        nodes.append(n.id)
        return n.inputs[0]
    if _is(n, Unary, UnaryFn.SQUARE):
        nodes.append(n.id)
        return n.inputs[0]
    return None


_NEAR: list[str] = []  # why the last parse that looked like a norm failed (one matcher call)


def _mean_of(g, v, nodes):
    """(t, axis) when v = mean(t) over trailing axes with keepdims."""
    n = g.nodes[v.node]
    if not _is(n, Reduce, ReduceFn.MEAN):
        return None
    rank = g.shape_of(n.inputs[0]).rank
    axes = n.op.axes
    if not n.op.keepdims or axes != tuple(range(axes[0], rank)):
        _NEAR.append(f"the statistic is a mean over axes {axes} (keepdims={n.op.keepdims}); a "
                     f"norm reduces the trailing axes of its rank-{rank} input with keepdims")
        return None
    nodes.append(n.id)
    return n.inputs[0], axes[0]


def _variance_plus_eps(g, v, nodes):
    """(statistic input u, eps) for v = u + eps with eps a constant."""
    n = g.nodes[v.node]
    if not _is(n, Binary, BinaryFn.ADD):
        return None
    for u, e in (n.inputs, n.inputs[::-1]):
        eps = _const(g, e)
        if eps is not None:
            nodes.append(n.id)
            return u, eps
    return None


def _inv_sqrt_of(g, v, nodes):
    """u when v is 1 / sqrt(u) written any common way."""
    n = g.nodes[v.node]
    if _is(n, Unary, UnaryFn.RSQRT):
        nodes.append(n.id)
        return n.inputs[0]
    if _is(n, Binary, BinaryFn.POW) and _const(g, n.inputs[1]) == -0.5:
        nodes.append(n.id)
        return n.inputs[0]
    inner = None
    if _is(n, Unary, UnaryFn.RECIPROCAL):
        inner = n.inputs[0]
    elif _is(n, Binary, BinaryFn.DIV) and _const(g, n.inputs[0]) == 1.0:
        inner = n.inputs[1]
    if inner is not None and _is(g.nodes[inner.node], Unary, UnaryFn.SQRT):
        nodes += [n.id, inner.node]
        return g.nodes[inner.node].inputs[0]
    return None


def _same_value(g, a, b) -> bool:
    """a is b, or both are one pure elementwise op on the same inputs (an unmerged copy)."""
    if a == b:
        return True
    na, nb = g.nodes[a.node], g.nodes[b.node]
    return (a.index == b.index == 0 and isinstance(na.op, (Binary, Unary, Cast))
            and na.op == nb.op and na.inputs == nb.inputs)


def _core(g, v) -> _Norm | None:
    """The normalization without affine terms: x * inv_sqrt(stat + eps) or x / sqrt(...)."""
    n = g.nodes[v.node]
    cands = []
    if _is(n, Binary, BinaryFn.MUL):
        for a, b in (n.inputs, n.inputs[::-1]):
            sub: list[int] = [n.id]
            u = _inv_sqrt_of(g, b, sub)
            if u is not None:
                cands.append((a, u, sub))
    elif _is(n, Binary, BinaryFn.DIV) and _is(g.nodes[n.inputs[1].node], Unary, UnaryFn.SQRT):
        sq = g.nodes[n.inputs[1].node]
        cands.append((n.inputs[0], sq.inputs[0], [n.id, sq.id]))
    for top, u, sub in cands:
        nodes = list(sub)
        stat_in = _strip_casts(g, u, nodes)
        # no eps at all is eps 0 (IBert's dynamo export drops its `1e-12 + var` in float32)
        stat, eps = _variance_plus_eps(g, stat_in, nodes) or (stat_in, 0.0)
        m = _mean_of(g, _strip_casts(g, stat, nodes), nodes)
        if m is None:
            continue
        sq_in, axis = m
        t = _square_of(g, _strip_casts(g, sq_in, nodes), nodes)
        if t is None:
            continue
        top_s = _strip_casts(g, top, nodes)
        t_s = _strip_casts(g, t, nodes)
        if not _same_value(g, t_s, top_s):
            continue
        if t_s != top_s:  # a duplicate of x - mean (torch.export does not merge them)
            nodes.append(t_s.node)
        d = g.nodes[top_s.node]
        if _is(d, Binary, BinaryFn.SUB):  # LayerNorm: the statistic is over d = x - mean(x)
            probe: list[int] = []
            mean = _mean_of(g, d.inputs[1], probe)
            if mean is not None and mean[0] == d.inputs[0] and mean[1] == axis:
                return _Norm(d.inputs[0], eps, False, axis, nodes=nodes + probe + [d.id])
        return _Norm(top_s, eps, True, axis, nodes=nodes)  # RMSNorm: over x itself
    return None


def _affine_operand(g, v, x_shape, axis) -> bool:
    s = g.shape_of(v)
    want = x_shape.dims[axis:]
    return s.dtype == x_shape.dtype and tuple(s.dims) == tuple(want)


def _parse(g, root) -> _Norm | None:
    """Affine terms (a beta add around a gamma mul) around a normalization core."""
    if _is(root, Binary, BinaryFn.ADD):
        for inner, b in (root.inputs, root.inputs[::-1]):
            core = _with_gamma(g, inner)
            if core is not None and _affine_operand(g, b, g.shape_of(core.x), core.axis):
                core.beta = b
                core.nodes.append(root.id)
                return core
    return _with_gamma(g, root.value)


def _with_gamma(g, v) -> _Norm | None:
    n = g.nodes[v.node]
    if _is(n, Binary, BinaryFn.MUL):
        for inner, w in (n.inputs, n.inputs[::-1]):
            casts = _casts_between(g, inner)
            core = _core(g, _strip_casts(g, inner, [], narrowing=True))
            if core is None:
                continue
            xdt = g.shape_of(core.x).dtype  # a cast below x's own type would round the result
            if any(not _exact_cast(xdt, g.nodes[c].op.dtype) for c in casts):
                continue
            if _affine_operand(g, w, g.shape_of(core.x), core.axis):
                core.nodes += casts + [n.id]
                core.gamma = w
                return core
    return _core(g, v)


def _casts_between(g, v) -> list[int]:
    out: list[int] = []
    _strip_casts(g, v, out, narrowing=True)
    return out


_INV_SQRT_PARTS = frozenset({UnaryFn.RSQRT, UnaryFn.RECIPROCAL, BinaryFn.POW, BinaryFn.DIV})


def _core_shaped(g, n) -> bool:
    """Whether `_core` can start at n: a mul with an operand made by an op an inverse square
    root is written with (rsqrt, reciprocal, pow, div), or a div by a sqrt."""
    op = n.op
    if not isinstance(op, Binary):
        return False
    if op.fn is BinaryFn.MUL:
        for v in n.inputs:
            p = g.nodes[v.node].op
            if isinstance(p, (Unary, Binary)) and p.fn in _INV_SQRT_PARTS:
                return True
        return False
    return op.fn is BinaryFn.DIV and len(n.inputs) == 2 and \
        _is(g.nodes[n.inputs[1].node], Unary, UnaryFn.SQRT)


@per_graph
def _roots_near_a_core(g) -> frozenset[int]:
    """The nodes `_parse` can find a norm (or a near miss) at: a core (`_core_shaped`), or at
    most two ops below one (the gamma mul and the beta add; casts between are free). Found once
    per graph by one scan (`per_graph`: again when it grew or was patched), so the matcher
    skips every other add, mul and div of the graph without parsing it."""
    depth = {n.id: 0 for n in g.nodes if _core_shaped(g, n)}
    todo = list(depth)
    while todo:
        nid = todo.pop()
        for u in g.users(nid):
            d = depth[nid] + (not isinstance(u.op, Cast))
            if d <= 2 and d < depth.get(u.id, 3):
                depth[u.id] = d
                todo.append(u.id)
    return frozenset(depth)


def _matcher(g, node, ctx):
    if node.id not in _roots_near_a_core(g):
        return
    _NEAR.clear()
    found = _parse(g, node)
    if found is None and _NEAR and _is(node, Binary, BinaryFn.MUL):
        yield Match(CANONICALIZE_NORM, g, node, {"root": node}, {}, (node.id,),
                    data={"miss": fail(MissReason.AXIS_MISMATCH, detail=_NEAR[0])})
        return
    if found is None or not g.shape_of(found.x).dtype.is_float:
        return
    if g.shape_of(found.x) != node.outputs[0]:
        return
    values = {"x": found.x}
    if found.gamma is not None:
        values["gamma"] = found.gamma
    if found.beta is not None:
        values["beta"] = found.beta
    nodes = tuple(sorted(set(found.nodes) | {node.id}))
    yield Match(CANONICALIZE_NORM, g, node, {"root": node}, values, nodes,
                data={"eps": found.eps, "rms": found.rms, "axis": found.axis})


def _build(b, m):
    d = m.data
    build = b.rms_norm if d["rms"] else b.layer_norm
    gamma = m.v("gamma") if "gamma" in m.values else None
    beta = m.v("beta") if "beta" in m.values else None
    return build(m.v("x"), gamma, beta, eps=d["eps"], axis=d["axis"])


def recognized(m, ctx):
    """The expression is a norm over the trailing axes."""
    return m.data.get("miss")


def _root_test(op) -> bool:
    """What `_parse` can start from: a beta add, a gamma mul, or the core's mul or div (any
    other root, a cast included, parses to nothing and reports no near miss)."""
    return isinstance(op, Binary) and op.fn in _ROOT_FNS


_ROOT_FNS = frozenset({BinaryFn.ADD, BinaryFn.MUL, BinaryFn.DIV})

CANONICALIZE_NORM = Rule(
    "CanonicalizeNorm", _build, matcher=_matcher, checks=(recognized,),
    root_test=_root_test, produces="norm",
    # every norm (and every near miss) reduces with a mean: a graph without one has no match,
    # and the driver skips the rule there
    requires=frozenset({(Reduce(ReduceFn.MEAN, (0,)).label,)}))
