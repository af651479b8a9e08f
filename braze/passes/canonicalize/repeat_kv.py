"""GQA's repeat_kv: k and v repeated per query head (reshape -> expand -> reshape, the
[B, Hkv, S, D] heads with a unit axis added, expanded to [B, Hkv, r, S, D] and merged to
[B, Hkv*r, S, D]) fold into the attention op's kv-head count. `FoldRepeatKV` folds them under
an attention op; CanonicalizeAttention's build folds sdpa's grouped keys (`grouped_keys`) and
the values with them itself (`unrepeated_kv`), a sweep before FoldRepeatKV could."""
from __future__ import annotations

from ...ir.ops.attention import Attention
from ...ir.ops.shape import Expand, Reshape, Transpose
from ...rewrite import Match, Rule

__all__ = ["FOLD_REPEAT_KV", "grouped_keys", "unrepeated_kv"]


def _repeated(g, v):
    """(y, r) when v = reshape(expand(y, [B, H, r, S, D]), [B, H*r, S, D]) with y [B, H, 1, S, D]
    (however y was made: a reshape of k, or a transpose that moved a unit axis of a grouped
    fused-QKV layout there); else None."""
    outer = g.nodes[v.node]
    if not isinstance(outer.op, Reshape):
        return None
    return _expanded(g, outer.inputs[0], outer.outputs[0].dims)


def _expanded(g, e, dims):
    """(y, r) when e = expand(y, [B, H, r, S, D]) with y [B, H, 1, S, D] and `dims` are
    [B, H*r, S, D] (e reshaped to them is a repeat_kv); else None."""
    ex = g.nodes[e.node]
    if not isinstance(ex.op, Expand):
        return None
    y = ex.inputs[0]
    ed = ex.outputs[0].dims
    if len(ed) != 5 or not all(isinstance(n, int) for n in ed[1:3]):
        return None
    b, h, r, s, d = ed
    if g.shape_of(y).dims != (b, h, 1, s, d) or tuple(dims) != (b, h * r, s, d):
        return None
    return y, r


def grouped_keys(g, kt_node):
    """e when kt = reshape(transpose(e, (0, 1, 2, 4, 3)), [B, G*R, D, S]) with e [B, G, R, S, D]
    (sdpa's GQA keys, repeated per group and transposed for the scores): then k is reshape(e,
    [B, G*R, S, D]), what TransposeBeforeMerge and ComposeTransposes make of it; else None."""
    if not isinstance(kt_node.op, Reshape):
        return None
    t = g.nodes[kt_node.inputs[0].node]
    if not isinstance(t.op, Transpose) or t.op.perm != (0, 1, 2, 4, 3):
        return None
    e = t.inputs[0]
    dims = g.shape_of(e).dims
    if len(dims) != 5 or not all(isinstance(n, int) for n in dims[1:3]):
        return None
    bb, groups, r, s, d = dims
    return e if kt_node.outputs[0].dims == (bb, groups * r, d, s) else None


def unrepeated_kv(b, m, kt, v):
    """k and v of `m`'s replacement with repeat_kv folded away (what FoldRepeatKV would build)
    when the scores' kt (an old value) holds grouped keys and v is the same repeat; else None."""
    g = m.graph
    src = g.nodes[kt.node]
    e = grouped_keys(g, src)
    if e is None:
        return None
    bb, h, d, s = src.outputs[0].dims
    rk, rv = _expanded(g, e, (bb, h, s, d)), _repeated(g, v)
    if rk is None or rv is None or rk[1] != rv[1]:
        return None
    return _without_repeat_axis(b, m, rk[0]), _without_repeat_axis(b, m, rv[0])


def _repeat_kv_matcher(g, node, ctx):
    k, v = node.inputs[1], node.inputs[2]
    rk, rv = _repeated(g, k), _repeated(g, v)
    if rk is None or rv is None or rk[1] != rv[1]:
        return
    values = {"q": node.inputs[0], "k": rk[0], "v": rv[0]}
    if len(node.inputs) > 3:
        values["mask"] = node.inputs[3]
    yield Match(FOLD_REPEAT_KV, g, node, {"root": node}, values, (node.id,))


def _build_fold(b, m):
    """k and v as [B, Hkv, S, D]: their unit repeat axis dropped."""
    op = m.root.op
    k, v = (_without_repeat_axis(b, m, m.values[r]) for r in "kv")
    mask = m.v("mask") if "mask" in m.values else None
    return b.add_node(op, [m.v("q"), k, v] + ([mask] if mask is not None else []))[0]


def _without_repeat_axis(b, m, y):
    """`y` [B, H, 1, S, D] reshaped to [B, H, S, D]. When a reshape made `y` (repeat_kv's
    unsqueeze), the two compose here: its input itself when that has the dims, else one
    reshape of it - what ComposeReshapes makes of reshape(reshape(x)) a sweep later."""
    dims = _without_unit_axis(m.graph.shape_of(y).dims)
    src = m.graph.nodes[y.node]
    if isinstance(src.op, Reshape):
        y = src.inputs[0]
    x = m.new(y)
    return x if b.shape_of(x).dims == dims else b.reshape(x, dims)


def _without_unit_axis(dims):
    return tuple(dims[:2]) + tuple(dims[3:])


FOLD_REPEAT_KV = Rule("FoldRepeatKV", _build_fold, matcher=_repeat_kv_matcher,
                      root_test=lambda op: isinstance(op, Attention),
                      depth=3,  # attention <- reshape <- expand <- y's type
                      requires=frozenset({(Attention,), (Expand,)}))
