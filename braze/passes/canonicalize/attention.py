"""Recognize scaled-dot-product attention written in primitives and rewrite it to braze's
`attention` op, whatever way the exporter wrote it:

  out = softmax(mask(softcap(q' @ k' * scale)), axis=-1) @ v

- the scale may sit on q, on k, on both (sdpa exports put sqrt(scale) on each) or on the
  scores, as mul or div by constants; their product is the op's `scale` (None when 1/sqrt(D));
- k' is any value of shape [B, H, D, Sk]: the key is transpose(k', last two axes), and the
  layout rules (layout.py) fold that transpose into the head split that made k';
- masks: additive terms added anywhere after the scores (a term added before a later scale is
  scaled with it), masked fills where(c, s, -big) / where(c, -big, s), softcap c*tanh(s/c),
  softmax in f32 with casts around it, and the sdpa export guard where(isnan(p), 0, p) (exact:
  braze's softmax is safe). All additive terms become one CUSTOM mask input (BIAS when it is
  computed from learned params: relative position biases, ALiBi slopes);
- `FoldRepeatKV` then folds GQA's repeat_kv (reshape -> expand -> reshape of k and v) into the
  attention's kv-head count.

Causal masks are recognized by attention_mask.py. A near match that cannot be expressed
(softmax over another axis, a scale that is not a constant, a mask before a softcap, a masked
fill with a value that is not far below any score, ...) is a miss with the reason."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...ir.ops.attention import Attention, MaskKind
from ...ir.ops.elementwise import Binary, BinaryFn, Cast, IsNan, Unary, UnaryFn, Where
from ...ir.ops.io import Constant, Input, Param
from ...ir.ops.linalg import MatMul
from ...ir.ops.reduce import Softmax
from ...ir.ops.shape import Expand, Reshape
from ...rewrite import Match, MissReason, Rule, fail
from ...rewrite.miss import Miss

__all__ = ["CANONICALIZE_ATTENTION", "FOLD_REPEAT_KV", "ATTENTION_RULES", "MASK_FLOOR"]

MASK_FLOOR = -1e30  # a masked fill at or below this is exactly "-inf" for float32 scores


def _const_scalar(g, v) -> float | None:
    n = g.nodes[v.node]
    if isinstance(n.op, Constant) and n.op.value.size == 1 and n.op.value.dtype.kind == "f":
        return float(n.op.value.reshape(-1)[0])
    return None


@dataclass
class _Parse:
    """What the walk back from the output matmul found."""

    consumed: list[int] = field(default_factory=list)
    scale: float = 1.0
    masks: list = field(default_factory=list)      # (kind, value(s), scale applied after it)
    softcap: float | None = None
    softmax: object = None
    out_cast: object = None
    q: object = None
    kt: object = None
    miss: Miss | None = None


def _peel_scales(g, v, parse: _Parse):
    """Strip mul / div by scalar constants and float casts; returns the remaining value."""
    while True:
        n = g.nodes[v.node]
        if isinstance(n.op, Binary) and n.op.fn in (BinaryFn.MUL, BinaryFn.DIV):
            a, b = n.inputs
            cb, ca = _const_scalar(g, b), _const_scalar(g, a)
            if cb is not None:
                parse.scale *= cb if n.op.fn is BinaryFn.MUL else 1.0 / cb
                v = a
            elif ca is not None and n.op.fn is BinaryFn.MUL:
                parse.scale *= ca
                v = b
            else:
                return v
        elif isinstance(n.op, Cast) and n.op.dtype.is_float:
            v = n.inputs[0]
        else:
            return v
        parse.consumed.append(n.id)


def _walk_probs(g, v, parse: _Parse):
    """From the probabilities back to the softmax input (casts and the isnan guard peeled)."""
    while True:
        n = g.nodes[v.node]
        if isinstance(n.op, Cast):
            parse.out_cast = parse.out_cast or n.op.dtype
        elif isinstance(n.op, Where) and _is_nan_guard(g, n):
            parse.consumed.append(n.inputs[0].node)  # the isnan reads the softmax too
        elif isinstance(n.op, Softmax):
            parse.consumed.append(n.id)
            parse.softmax = n
            return n.inputs[0]
        else:
            return None
        parse.consumed.append(n.id)
        v = n.inputs[2] if isinstance(n.op, Where) else n.inputs[0]


def _is_nan_guard(g, n) -> bool:
    """where(isnan(p), 0, p)."""
    c, zero, p = n.inputs
    cn = g.nodes[c.node]
    z = _const_scalar(g, zero)
    return isinstance(cn.op, IsNan) and cn.inputs[0] == p and z == 0.0


def _softcap(g, n) -> tuple[float, object, list[int]] | None:
    """mul(tanh(s / c), c) -> (c, s, interior node ids)."""
    if not (isinstance(n.op, Binary) and n.op.fn is BinaryFn.MUL):
        return None
    for t_v, c_v in (n.inputs, n.inputs[::-1]):
        c = _const_scalar(g, c_v)
        t = g.nodes[t_v.node]
        if c is None or not (isinstance(t.op, Unary) and t.op.fn is UnaryFn.TANH):
            continue
        d = g.nodes[t.inputs[0].node]
        if isinstance(d.op, Binary) and d.op.fn in (BinaryFn.DIV, BinaryFn.MUL):
            k = _const_scalar(g, d.inputs[1])
            inner = k if d.op.fn is BinaryFn.DIV else (1.0 / k if k else None)
            if inner is not None and math.isclose(inner, c, rel_tol=1e-6):
                return c, d.inputs[0], [t.id, d.id]
    return None


def _walk_scores(g, v, parse: _Parse, post: float = 1.0, capped: bool = False):
    """Back from the softmax input to the q @ k' matmul, collecting scale, masks, softcap.
    Returns True when it reached the matmul (parse.q / parse.kt set)."""
    n = g.nodes[v.node]
    op = n.op
    if isinstance(op, MatMul):
        a, b = n.inputs
        if g.shape_of(a).rank != 4 or g.shape_of(b).rank != 4:
            parse.miss = fail(MissReason.SHAPE_MISMATCH,
                              detail="the scores matmul is not [B, H, Sq, D] @ [B, H, D, Sk]")
            return False
        parse.consumed.append(n.id)
        parse.q = _peel_scales(g, a, parse)
        parse.kt = _peel_scales(g, b, parse)
        return True
    if isinstance(op, Cast) and op.dtype.is_float:
        parse.consumed.append(n.id)
        return _walk_scores(g, n.inputs[0], parse, post, capped)
    if isinstance(op, Binary) and op.fn in (BinaryFn.MUL, BinaryFn.DIV):
        cap = _softcap(g, n) if op.fn is BinaryFn.MUL else None
        if cap is not None:
            if post != 1.0 or capped:
                parse.miss = fail(MissReason.PATTERN_MISMATCH,
                                  detail="the scores are scaled after the softcap")
                return False
            c, inner, ids = cap
            parse.softcap = c
            parse.consumed += [n.id, *ids]
            return _walk_scores(g, inner, parse, post, True)
        a, b = n.inputs
        cb, ca = _const_scalar(g, b), _const_scalar(g, a)
        if cb is None and (ca is None or op.fn is BinaryFn.DIV):
            parse.miss = fail(MissReason.PATTERN_MISMATCH,
                              detail="the scores are scaled by a value that is not a constant")
            return False
        c = cb if cb is not None else ca
        factor = c if op.fn is BinaryFn.MUL else 1.0 / c
        parse.scale *= factor
        parse.consumed.append(n.id)
        return _walk_scores(g, a if cb is not None else b, parse, post * factor, capped)
    if isinstance(op, Binary) and op.fn is BinaryFn.ADD:
        if capped:
            parse.miss = fail(MissReason.PATTERN_MISMATCH,
                              detail="a mask is added before the softcap")
            return False
        for s_v, m_v in (n.inputs, n.inputs[::-1]):
            trial = _Parse(list(parse.consumed) + [n.id], parse.scale,
                           parse.masks + [("add", m_v, post)], parse.softcap)
            if _walk_scores(g, s_v, trial, post, capped):
                _copy(trial, parse)
                return True
            if trial.miss is not None and parse.miss is None:
                parse.miss = trial.miss
        return False
    if isinstance(op, Where):
        c, a, b = n.inputs
        fa, fb = _const_scalar(g, a), _const_scalar(g, b)
        fill, s_v, keep_when = (fb, a, True) if fb is not None else (fa, b, False)
        if fill is None:
            return False
        if fill > MASK_FLOOR:
            parse.miss = fail(MissReason.PATTERN_MISMATCH,
                              detail=f"masked fill value {fill:g} is not far enough below the "
                                     "scores to act as -inf",
                              hint="fill masked scores with -inf or the dtype's minimum")
            return False
        parse.masks.append(("fill", (c, fill, keep_when), post))
        parse.consumed.append(n.id)
        return _walk_scores(g, s_v, parse, post, capped)
    return False


def _copy(src: _Parse, dst: _Parse) -> None:
    for f in ("consumed", "scale", "masks", "softcap", "q", "kt", "miss"):
        setattr(dst, f, getattr(src, f))


def _attention_matcher(g, node, ctx):
    p_v, v_v = node.inputs
    if g.shape_of(p_v).rank != 4 or g.shape_of(v_v).rank != 4:
        return
    parse = _Parse([node.id])
    s_v = _walk_probs(g, p_v, parse)
    if s_v is None:
        return
    data = {"parse": parse}
    m = Match(CANONICALIZE_ATTENTION, g, node, {"root": node, "softmax": parse.softmax},
              {"v": v_v}, (), data=data)
    sm = parse.softmax
    if sm.op.axis != g.shape_of(sm.value).rank - 1:
        m.data["reject"] = fail(MissReason.AXIS_MISMATCH,
                                detail=f"softmax over axis {sm.op.axis}, not the key axis")
        m.consumed = tuple(parse.consumed)
        yield m
        return
    if not _walk_scores(g, s_v, parse):
        if parse.miss is None:
            return  # not attention: a softmax-weighted matmul of something else
        m.data["reject"] = parse.miss
        m.consumed = tuple(dict.fromkeys(parse.consumed))
        yield m
        return
    m.values.update(q=parse.q, kt=parse.kt)
    for i, (kind, val, _) in enumerate(parse.masks):
        if kind == "add":
            m.values[f"mask{i}"] = val
        else:
            m.values[f"cond{i}"] = val[0]
    m.consumed = tuple(dict.fromkeys(parse.consumed))
    yield m


def accepted_shape(m, ctx) -> Miss | None:
    """q [B, H, Sq, D], k' [B, Hk, D, Sk], v [B, Hk, Sk, Dv]; masks broadcast onto the scores."""
    if "reject" in m.data:
        return m.data["reject"]
    q, kt, v = m.shape("q"), m.shape("kt"), m.shape("v")
    if q.dims[-1] != kt.dims[-2] or kt.dims[-1] != v.dims[-2] or kt.dims[1] != v.dims[1]:
        return fail(MissReason.SHAPE_MISMATCH,
                    detail=f"q {q}, k' {kt}, v {v} are not [B,H,Sq,D], [B,H,D,Sk], [B,H,Sk,Dv]")
    scores = m.graph.shape_of(m.nodes["softmax"].value)
    for name in m.values:
        if name.startswith(("mask", "cond")):
            s = m.shape(name)
            if s.rank > 4 or _broadcast(s.dims, scores.dims) != scores.dims:
                return fail(MissReason.SHAPE_MISMATCH,
                            detail=f"mask {s} does not broadcast onto the scores {scores}")
    return None


def _broadcast(a, b):
    from ...ir.shapes import broadcast_dims

    try:
        return broadcast_dims(a, b)
    except Exception:  # noqa: BLE001
        return None


def _uses_params(g, v) -> bool:
    """Whether value v is computed from a learned param (a bias rather than a mask)."""
    stack, seen = [v.node], set()
    while stack:
        nid = stack.pop()
        if nid in seen:
            continue
        seen.add(nid)
        n = g.nodes[nid]
        if isinstance(n.op, Param):
            return True
        if isinstance(n.op, Input):
            continue
        stack.extend(u.node for u in n.inputs)
    return False


def _build(b, m):
    parse = m.data["parse"]
    q, v = m.v("q"), m.v("v")
    k = b.transpose(m.v("kt"), (0, 1, 3, 2))
    dt = b.shape_of(q).dtype
    mask = None
    bias = False
    for i, (kind, val, post) in enumerate(parse.masks):
        if kind == "add":
            term = m.v(f"mask{i}")
            bias = bias or _uses_params(m.graph, m.values[f"mask{i}"])
        else:
            _, fill, keep_when = val
            zero = b.constant(np.zeros((), dt.np))
            big = b.constant(np.asarray(fill, dt.np))
            cond = m.v(f"cond{i}")
            term = b.where(cond, zero, big) if keep_when else b.where(cond, big, zero)
        if b.shape_of(term).dtype != dt:
            term = b.cast(term, dt)
        if post != 1.0:
            term = b.mul(term, b.constant(np.asarray(post, dt.np)))
        mask = term if mask is None else b.add(mask, term)
    d = b.shape_of(q).dims[-1]
    scale = parse.scale
    if isinstance(d, int) and math.isclose(scale, 1.0 / math.sqrt(d), rel_tol=1e-6):
        scale = None
    kind = None if mask is None else (MaskKind.BIAS if bias else MaskKind.CUSTOM)
    out = b.attention(q, k, v, mask, kind=kind, scale=scale, softcap=parse.softcap)
    want = m.root.outputs[0].dtype
    return out if b.shape_of(out).dtype == want else b.cast(out, want)


CANONICALIZE_ATTENTION = Rule(
    "CanonicalizeAttention", _build, matcher=_attention_matcher, checks=(accepted_shape,),
    root_test=lambda op: isinstance(op, MatMul), produces="attention")


# -- GQA: repeat_kv folds into the kv-head count --------------------------------------------------
def _repeated(g, v):
    """k0 when v = reshape(expand(reshape(k0, [B, H, 1, S, D]), [B, H, r, S, D]),
    [B, H*r, S, D]); else None. Returns (k0, r, [interior node ids])."""
    outer = g.nodes[v.node]
    if not isinstance(outer.op, Reshape):
        return None
    ex = g.nodes[outer.inputs[0].node]
    if not isinstance(ex.op, Expand):
        return None
    inner = g.nodes[ex.inputs[0].node]
    if not isinstance(inner.op, Reshape):
        return None
    k0 = inner.inputs[0]
    kd = g.shape_of(k0).dims
    if len(kd) != 4:
        return None
    b, h, s, d = kd
    ed = ex.outputs[0].dims
    if inner.outputs[0].dims != (b, h, 1, s, d) or len(ed) != 5 or ed[:2] != (b, h) or \
            ed[3:] != (s, d) or not isinstance(ed[2], int) or not isinstance(h, int):
        return None
    if outer.outputs[0].dims != (b, h * ed[2], s, d):
        return None
    return k0, ed[2], [outer.id, ex.id, inner.id]


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
    op = m.root.op
    mask = m.v("mask") if "mask" in m.values else None
    return b.add_node(op, [m.v("q"), m.v("k"), m.v("v")] + ([mask] if mask is not None
                                                            else []))[0]


FOLD_REPEAT_KV = Rule("FoldRepeatKV", _build_fold, matcher=_repeat_kv_matcher,
                      root_test=lambda op: isinstance(op, Attention))

ATTENTION_RULES = (CANONICALIZE_ATTENTION,)
