"""A fused QKV projection laid out per head (GPT-NeoX, BLOOM, Falcon: [B, S, H, 3D] with each
head's q, k and v side by side) becomes one projection per block:

  narrow(transpose(reshape(x @ w + b, [B, S, H, n*D]), (0, 2, 1, 3)), -1, j*D, D)
    -> transpose(reshape(x @ w_j + b_j, [B, S, H, D]), (0, 2, 1, 3))

where w_j / b_j hold block j's columns of every head (made once: a new param when w has a
stored value, else a gather of w's columns that only reads params, i.e. weight preparation).
The attention-block fusion then sees the usual separate q, k, v projections of one input and
joins them again in its own [q | k | v] layout."""
from __future__ import annotations

import numpy as np

from ...ir.ops.elementwise import Binary, BinaryFn
from ...ir.ops.io import Param
from ...ir.ops.linalg import MatMul
from ...ir.ops.shape import Narrow, Reshape, Transpose
from ...rewrite import Match, Rule

__all__ = ["SPLIT_PER_HEAD_QKV"]


def _projection(g, v):
    """(x, w, b or None) when v = x @ w (+ b) with a 2-D w and a 1-D b."""
    n = g.nodes[v.node]
    b = None
    if isinstance(n.op, Binary) and n.op.fn is BinaryFn.ADD:
        for mm_v, b_v in (n.inputs, n.inputs[::-1]):
            mm = g.nodes[mm_v.node]
            if isinstance(mm.op, MatMul) and g.shape_of(b_v).rank == 1:
                n, b = mm, b_v
                break
        else:
            return None
    if not isinstance(n.op, MatMul) or g.shape_of(n.inputs[1]).rank != 2:
        return None
    return n.inputs[0], n.inputs[1], b


def _matcher(g, node, ctx):
    t = g.nodes[node.inputs[0].node]
    if not isinstance(t.op, Transpose) or t.op.perm != (0, 2, 1, 3):
        return
    r = g.nodes[t.inputs[0].node]
    if not isinstance(r.op, Reshape):
        return
    dims = r.outputs[0].dims
    if len(dims) != 4 or node.op.axis != 3:
        return
    b_, s_, h, nd = dims
    length, start = node.op.length, node.op.start
    if not all(isinstance(d, int) for d in (h, nd, length)) or length == 0 or \
            start % length or nd % length or nd == length:
        return
    src = r.inputs[0]
    if g.shape_of(src).dims != (b_, s_, h * nd):
        return
    proj = _projection(g, src)
    if proj is None:
        return
    x, w, bias = proj
    values = {"x": x, "w": w}
    if bias is not None:
        values["b"] = bias
    yield Match(SPLIT_PER_HEAD_QKV, g, node, {"root": node}, values, (node.id,),
                data={"heads": h, "width": nd, "start": start, "length": length,
                      "lead": (b_, s_)})


def _columns(d) -> np.ndarray:
    h, nd, start, length = d["heads"], d["width"], d["start"], d["length"]
    return np.asarray([i * nd + start + k for i in range(h) for k in range(length)], np.int64)


def _select(b, m, name: str, cols: np.ndarray, axis: int):
    """The chosen columns of weight `name`: a new stored param, or a gather (weight prep)."""
    old = m.values[name]
    node = m.graph.nodes[old.node]
    tag = f"{m.data['start'] // m.data['length']}of{m.data['width'] // m.data['length']}"
    if isinstance(node.op, Param) and node.op.name in m.graph.weights:
        pname = f"{node.op.name}.block{tag}"
        try:
            return b.node_by_name(pname).value
        except Exception:  # noqa: BLE001 - not made yet
            value = np.take(m.graph.weights[node.op.name], cols, axis=axis)
            return b.param(pname, node.op.shape.with_dims(value.shape), value=value)
    return b.gather(m.v(name), b.constant(cols), axis)


def _build(b, m):
    d = m.data
    cols = _columns(d)
    y = b.matmul(m.v("x"), _select(b, m, "w", cols, 1))
    if "b" in m.values:
        y = b.add(y, _select(b, m, "b", cols, 0))
    heads = b.reshape(y, d["lead"] + (d["heads"], d["length"]))
    return b.transpose(heads, (0, 2, 1, 3))


SPLIT_PER_HEAD_QKV = Rule("SplitPerHeadQKV", _build, matcher=_matcher,
                          root_test=lambda op: isinstance(op, Narrow))
