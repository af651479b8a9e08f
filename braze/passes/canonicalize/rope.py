"""Rotary position embeddings written in primitives become braze's `rope` op:

  rotate-half (NeoX, LLaMA): x * cos + cat(-x[..., h:], x[..., :h]) * sin
  interleaved (GPT-J):       x * cos + flatten(stack(-x[..., 1::2], x[..., ::2])) * sin
  partial (n_rot < D):       cat(rope(x[..., :n_rot]), x[..., n_rot:])

The exported cos / sin tables are full width (D): the rope op takes the half tables, which
braze reads off them (first half, or the even entries for interleaved) after checking the full
table really repeats its half - structurally (cos(cat(f, f)), any scaling, reshape or gather of
that) or, for tables computed only from dims, params and constants, by evaluating them. A
table that cannot be shown to repeat is a miss with the reason, never an assumption."""
from __future__ import annotations

import numpy as np

from ...errors import BrazeError
from ...interpret import interpret
from ...ir.graph import Graph
from ...ir.ops.attention import Rope
from ...ir.ops.elementwise import Binary, BinaryFn, Cast, Unary, UnaryFn
from ...ir.ops.indexing import Slice
from ...ir.ops.io import Constant, Input
from ...ir.ops.shape import Concat, Expand, Gather, Narrow, Reshape
from ...rewrite import Match, MissReason, Rule, fail

__all__ = ["CANONICALIZE_ROPE", "MERGE_PARTIAL_ROPE", "ROPE_RULES"]

PROBE_LENGTHS = (3, 7)


def _node(g, v):
    return g.nodes[v.node]


def _mul_operands(g, v):
    n = _node(g, v)
    if isinstance(n.op, Binary) and n.op.fn is BinaryFn.MUL:
        return n
    return None


# -- rotate_half / rotate_every_two ---------------------------------------------------------------
def _rotate_half_source(g, v, ids):
    """x when v = cat(-x[..., h:], x[..., :h]) on the last axis (ids collects the nodes)."""
    c = _node(g, v)
    if not isinstance(c.op, Concat) or len(c.inputs) != 2:
        return None
    rank = g.shape_of(v).rank
    if c.op.axis != rank - 1:
        return None
    neg, first = _node(g, c.inputs[0]), _node(g, c.inputs[1])
    if not (isinstance(neg.op, Unary) and neg.op.fn is UnaryFn.NEG):
        return None
    second = _node(g, neg.inputs[0])
    if not (isinstance(first.op, Narrow) and isinstance(second.op, Narrow)):
        return None
    x = first.inputs[0]
    d = g.shape_of(x).dims[-1]
    if second.inputs[0] != x or not isinstance(d, int) or d % 2:
        return None
    h = d // 2
    if (first.op.axis, first.op.start, first.op.length) != (rank - 1, 0, h) or \
            (second.op.axis, second.op.start, second.op.length) != (rank - 1, h, h):
        return None
    ids += [c.id, neg.id, first.id, second.id]
    return x


def _rotate_every_two_source(g, v, ids):
    """x when v = flatten(stack(-x[..., 1::2], x[..., ::2], axis=-1))."""
    flat = _node(g, v)
    if not isinstance(flat.op, Reshape):
        return None
    c = _node(g, flat.inputs[0])
    if not isinstance(c.op, Concat) or len(c.inputs) != 2:
        return None
    parts = []
    for u in c.inputs:
        r = _node(g, u)
        if not isinstance(r.op, Reshape) or r.outputs[0].dims[-1] != 1:
            return None
        parts.append(r)
    neg = _node(g, parts[0].inputs[0])
    if not (isinstance(neg.op, Unary) and neg.op.fn is UnaryFn.NEG):
        return None
    odd, even = _node(g, neg.inputs[0]), _node(g, parts[1].inputs[0])
    if not (isinstance(odd.op, Slice) and isinstance(even.op, Slice)):
        return None
    x = even.inputs[0]
    rank = g.shape_of(x).rank
    d = g.shape_of(x).dims[-1]
    if odd.inputs[0] != x or not isinstance(d, int) or flat.outputs[0].dims != g.shape_of(x).dims:
        return None
    if (even.op.axis, even.op.start, even.op.step) != (rank - 1, 0, 2) or \
            (odd.op.axis, odd.op.start, odd.op.step) != (rank - 1, 1, 2):
        return None
    ids += [flat.id, c.id, parts[0].id, parts[1].id, neg.id, odd.id, even.id]
    return x


# -- the tables repeat their half -----------------------------------------------------------------
def _structurally_repeats(g, v, interleaved: bool) -> bool:
    """cos / sin (scaled, cast, reshaped, expanded or gathered) of cat(f, f) (rotate-half) or
    of a table whose entries repeat in pairs (interleaved: not decided structurally)."""
    for _ in range(16):
        n = _node(g, v)
        op = n.op
        if isinstance(op, (Cast, Reshape, Expand)):
            last = g.shape_of(n.inputs[0]).dims[-1]
            if isinstance(op, Reshape) and n.outputs[0].dims[-1] != last:
                return False
            v = n.inputs[0]
        elif isinstance(op, Binary) and op.fn is BinaryFn.MUL:
            sizes = [g.shape_of(u).dims[-1] if g.shape_of(u).rank else 1 for u in n.inputs]
            if sizes[1] == 1:
                v = n.inputs[0]
            elif sizes[0] == 1:
                v = n.inputs[1]
            else:
                return False
        elif isinstance(op, Gather) and op.axis != g.shape_of(n.inputs[0]).rank - 1:
            v = n.inputs[0]
        elif isinstance(op, Unary) and op.fn in (UnaryFn.COS, UnaryFn.SIN):
            v = n.inputs[0]
        elif isinstance(op, Concat) and not interleaved:
            rank = n.outputs[0].rank
            return op.axis == rank - 1 and len(n.inputs) == 2 and n.inputs[0] == n.inputs[1]
        else:
            return False
    return False


def _evaluates_to_repeat(g, v, interleaved: bool) -> bool:
    """For a table computed from dims, params and constants only: evaluate it and compare."""
    ids, stack = set(), [v.node]
    while stack:
        nid = stack.pop()
        if nid in ids:
            continue
        if isinstance(g.nodes[nid].op, Input):
            return False
        ids.add(nid)
        stack.extend(u.node for u in g.nodes[nid].inputs)
    sub = Graph("table", record_provenance=False)
    vmap, names = {}, set()
    for nid in sorted(ids):
        n = g.nodes[nid]
        if n.op.source and not isinstance(n.op, Constant):
            name = n.op.name
            vmap[n.value] = sub.param(name, n.outputs[0])
            continue
        vmap.update(zip(n.values, sub.clone_node(n, [vmap[u] for u in n.inputs], g)))
        for s in n.outputs:
            names |= s.symbol_names
    sub.set_outputs([vmap[v]])
    for n in PROBE_LENGTHS:
        try:
            (t,) = interpret(sub, {}, g.weights, symbols={s: n for s in names})
        except (BrazeError, KeyError):
            return False
        d = t.shape[-1]
        if interleaved:
            ok = np.array_equal(t[..., 0::2], t[..., 1::2])
        else:
            ok = d % 2 == 0 and np.array_equal(t[..., :d // 2], t[..., d // 2:])
        if not ok:
            return False
    return True


def _repeats(g, v, interleaved: bool) -> bool:
    return _structurally_repeats(g, v, interleaved) or _evaluates_to_repeat(g, v, interleaved)


# -- the rule -------------------------------------------------------------------------------------
def _rope_matcher(g, node, ctx):
    if not (isinstance(node.op, Binary) and node.op.fn is BinaryFn.ADD):
        return
    for a_v, b_v in (node.inputs, node.inputs[::-1]):
        ma, mb = _mul_operands(g, a_v), _mul_operands(g, b_v)
        if ma is None or mb is None:
            continue
        for r_v, s_v in (mb.inputs, mb.inputs[::-1]):
            for interleaved, source in ((False, _rotate_half_source),
                                        (True, _rotate_every_two_source)):
                ids: list[int] = [node.id, ma.id, mb.id]
                x = source(g, r_v, ids)
                if x is None or x not in ma.inputs:
                    continue
                c_v = ma.inputs[1] if ma.inputs[0] == x else ma.inputs[0]
                m = Match(CANONICALIZE_ROPE, g, node, {"root": node},
                          {"x": x, "cos": c_v, "sin": s_v}, tuple(ids),
                          data={"interleaved": interleaved})
                yield m
                return


def tables_repeat(m, ctx):
    """The full-width cos / sin tables repeat their half, so the rope op's half tables are
    read off them exactly."""
    inter = m.data["interleaved"]
    g = m.graph
    d = m.shape("x").dims[-1]
    for t in ("cos", "sin"):
        s = m.shape(t)
        if s.rank == 0 or s.dims[-1] != d:
            return fail(MissReason.SHAPE_MISMATCH, detail=f"{t} table {s} is not full width {d}")
        if not _repeats(g, m.values[t], inter):
            return fail(MissReason.PATTERN_MISMATCH,
                        detail=f"the {t} table cannot be shown to repeat its "
                               f"{'pairs' if inter else 'half'}",
                        hint="compute cos/sin as cos(cat(freqs, freqs)) so braze can see the "
                             "rope op's half table")
    return None


def _half(b, t, d: int, interleaved: bool):
    if interleaved:
        return b.slice(t, -1, 0, d, 2)
    return b.narrow(t, -1, 0, d // 2)


def _build(b, m):
    d = m.shape("x").dims[-1]
    inter = m.data["interleaved"]
    cos = _half(b, m.v("cos"), d, inter)
    sin = _half(b, m.v("sin"), d, inter)
    return b.rope(m.v("x"), cos, sin, interleaved=inter)


CANONICALIZE_ROPE = Rule("CanonicalizeRope", _build, matcher=_rope_matcher,
                         checks=(tables_repeat,), root_test=lambda op: isinstance(op, Binary),
                         produces="rope")


# -- partial rotation -----------------------------------------------------------------------------
def _partial_matcher(g, node, ctx):
    if not isinstance(node.op, Concat) or len(node.inputs) != 2:
        return
    rank = node.outputs[0].rank
    if node.op.axis != rank - 1:
        return
    r, p = _node(g, node.inputs[0]), _node(g, node.inputs[1])
    if not (isinstance(r.op, Rope) and r.op.n_rot is None and isinstance(p.op, Narrow)):
        return
    xr = _node(g, r.inputs[0])
    if not isinstance(xr.op, Narrow):
        return
    x = xr.inputs[0]
    d = g.shape_of(x).dims[-1]
    n = xr.op.length
    if p.inputs[0] != x or (xr.op.axis, xr.op.start) != (rank - 1, 0) or \
            (p.op.axis, p.op.start, p.op.length) != (rank - 1, n, d - n if isinstance(d, int)
                                                      else None):
        return
    yield Match(MERGE_PARTIAL_ROPE, g, node, {"root": node},
                {"x": x, "cos": r.inputs[1], "sin": r.inputs[2]}, (node.id, r.id, p.id, xr.id),
                data={"n_rot": n, "interleaved": r.op.interleaved})


MERGE_PARTIAL_ROPE = Rule(
    "MergePartialRope",
    lambda b, m: b.rope(m.v("x"), m.v("cos"), m.v("sin"), interleaved=m.data["interleaved"],
                        n_rot=m.data["n_rot"]),
    matcher=_partial_matcher, root_test=lambda op: isinstance(op, Concat), produces="rope")

ROPE_RULES = (CANONICALIZE_ROPE,)
