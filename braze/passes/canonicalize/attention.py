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
- `FoldRepeatKV` (repeat_kv.py) then folds GQA's repeat_kv (reshape -> expand -> reshape of k
  and v) into the attention's kv-head count (the build folds sdpa's grouped keys itself);
- `FoldAttentionInputScale` (attention_input_scale.py) folds constant scales of q or k into an
  attention op a frontend made directly.

Causal masks are recognized by attention_mask.py. A near match that cannot be expressed
(softmax over another axis, a scale that is not a constant, a mask before a softcap, a masked
fill with a value that is not far below any score, ...) is a miss with the reason."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...ir.ops.attention import MaskKind, Rope
from ...ir.ops.elementwise import Binary, BinaryFn, Cast, IsNan, Unary, UnaryFn, Where
from ...ir.ops.io import Constant, Input, Param
from ...ir.ops.linalg import MatMul
from ...ir.ops.reduce import Softmax
from ...ir.ops.shape import Reshape, Transpose
from ...ir.symbolic import SymDim
from ...rewrite import Match, MissReason, Rule, fail
from ...rewrite.miss import Miss
from .graph_memo import per_graph
from .repeat_kv import FOLD_REPEAT_KV, grouped_keys, unrepeated_kv

__all__ = ["CANONICALIZE_ATTENTION", "FOLD_REPEAT_KV", "ATTENTION_RULES", "MASK_FLOOR"]

MASK_FLOOR = -1e30  # a masked fill at or below this is exactly "-inf" for float32 scores


def _const_scalar(g, v) -> float | None:
    """A float scalar fixed in the graph: a constant, or a stored scalar param (torch.export
    lifts `torch.tensor(torch.finfo(dtype).min)`, GPT-Neo's masked-fill value, into one)."""
    n = g.nodes[v.node]
    if isinstance(n.op, Constant) and n.op.value.size == 1 and g.shape_of(v).dtype.is_float:
        return float(n.op.value.reshape(-1)[0])
    if isinstance(n.op, Param) and g.shape_of(v).rank == 0 and g.shape_of(v).dtype.is_float:
        val = g.weights.get(n.op.name)
        if val is not None:
            return float(np.asarray(val).reshape(-1)[0])
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
    q_layout: tuple = ()     # reshapes / transposes a peeled scale sat under (q side)
    kt_layout: tuple = ()
    frame: tuple | None = None  # (B, H) when written on [B*H, S, D] (bmm / baddbmm exports)
    stop: object = None      # the node where the walk back left the attention pattern
    flat: bool = False       # the output matmul is 3-D
    miss: Miss | None = None


def _single_use(g, n) -> bool:
    return len(g.users(n.value)) == 1 and not g.is_output(n.value)


def _peel_scales(g, v, parse: _Parse, side: str, through_rope: bool = False):
    """Strip mul / div by scalar constants and float casts, also where they sit under the head
    split (OPT, BART: the projection is scaled before its reshape / transpose) or, with
    `through_rope`, under a rotary embedding (linear in x: ESM scales q before rotating it);
    returns the remaining value, and records the ops to replay on it in `parse.{side}_layout`
    (a rope as (op, (cos, sin))). Only single-use nodes are peeled (a scaled q read elsewhere
    keeps its scale); a cast is not peeled from under a rope (the tables keep their dtype)."""
    base, layout, pending, passed = v, [], [], []
    while True:
        n = g.nodes[v.node]
        op = n.op
        if isinstance(op, (Reshape, Transpose)) or (through_rope and isinstance(op, Rope)):
            pending.append(n)  # peeled only with a scale or cast above it
            v = n.inputs[0]
            continue
        factor = None
        if isinstance(op, Binary) and op.fn in (BinaryFn.MUL, BinaryFn.DIV):
            a, b = n.inputs
            cb, ca = _const_scalar(g, b), _const_scalar(g, a)
            if cb is not None:
                factor, up = (cb if op.fn is BinaryFn.MUL else 1.0 / cb), a
            elif ca is not None and op.fn is BinaryFn.MUL:
                factor, up = ca, b
            else:
                break
        elif isinstance(op, Cast) and op.dtype.is_float and \
                not any(isinstance(p.op, Rope) for p in pending):
            up = n.inputs[0]
        else:
            break
        # the readers are asked only here, where a segment would be peeled: every node of it
        # but the one making `base` must have one reader
        if not all(_single_use(g, m) for m in (*pending, n) if m.id != base.node):
            break
        if factor is not None:
            parse.scale *= factor
        v = up
        passed += [p.id for p in pending] + [n.id]
        layout += [(p.op, tuple(p.inputs[1:])) if isinstance(p.op, Rope) else p.op
                   for p in pending]
        pending = []
        base = v
    parse.consumed += passed
    setattr(parse, f"{side}_layout", tuple(layout))
    return base


def _replay(b, v, ops):
    """Apply the layout ops recorded by _peel_scales (outermost first) to v."""
    for op in reversed(ops):
        op, extra = op if isinstance(op, tuple) else (op, ())
        v = b.add_node(op, [v, *extra])[0]
    return v


def _head_merge(g, n) -> tuple | None:
    """(B, H) when n is a reshape between [B, H, X, Y] and [B*H, X, Y] (either way)."""
    if not isinstance(n.op, Reshape):
        return None
    a, o = g.shape_of(n.inputs[0]).dims, n.outputs[0].dims
    four, three = (a, o) if len(a) == 4 else (o, a)
    if len(four) != 4 or len(three) != 3 or four[2:] != three[1:]:
        return None
    if SymDim.of(four[0]) * SymDim.of(four[1]) != SymDim.of(three[0]):
        return None
    return four[0], four[1]


def _set_frame(parse: _Parse, frame) -> bool:
    if frame is None:
        return True
    if parse.frame is not None and parse.frame != frame:
        parse.miss = fail(MissReason.SHAPE_MISMATCH,
                          detail=f"batch and heads are merged as {parse.frame} and as {frame}")
        return False
    parse.frame = frame
    return True


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
        elif _head_merge(g, n) is not None:
            if not _set_frame(parse, _head_merge(g, n)):
                return None
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
        ra, rb = g.shape_of(a).rank, g.shape_of(b).rank
        if not (ra == rb == 4 or (ra == rb == 3 and (parse.frame is not None or parse.flat))):
            parse.miss = fail(MissReason.SHAPE_MISMATCH,
                              detail="the scores matmul is not [B, H, Sq, D] @ [B, H, D, Sk] "
                                     "(or [B*H, Sq, D] @ [B*H, D, Sk])")
            return False
        parse.consumed.append(n.id)
        parse.q = _peel_scales(g, a, parse, "q")
        parse.kt = _peel_scales(g, b, parse, "kt")
        return True
    if _head_merge(g, n) is not None:
        if not _set_frame(parse, _head_merge(g, n)):
            return False
        parse.consumed.append(n.id)
        return _walk_scores(g, n.inputs[0], parse, post, capped)
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
                           parse.masks + [("add", m_v, post, n.outputs[0].rank)],
                           parse.softcap, frame=parse.frame, flat=parse.flat)
            if _walk_scores(g, s_v, trial, post, capped):
                _copy(trial, parse)
                return True
            if trial.miss is not None and parse.miss is None:
                parse.miss = trial.miss
            parse.stop = parse.stop or trial.stop
        return False
    if isinstance(op, Where):
        c, a, b = n.inputs
        fa, fb = _const_scalar(g, a), _const_scalar(g, b)
        fill, s_v, keep_when = (fb, a, True) if fb is not None else (fa, b, False)
        if fill is None:
            parse.stop = n
            return False
        if fill > MASK_FLOOR:
            parse.miss = fail(MissReason.PATTERN_MISMATCH,
                              detail=f"masked fill value {fill:g} is not far enough below the "
                                     "scores to act as -inf",
                              hint="fill masked scores with -inf or the dtype's minimum")
            return False
        parse.masks.append(("fill", (c, fill, keep_when), post, n.outputs[0].rank))
        parse.consumed.append(n.id)
        return _walk_scores(g, s_v, parse, post, capped)
    parse.stop = n
    return False


def _copy(src: _Parse, dst: _Parse) -> None:
    for f in ("consumed", "scale", "masks", "softcap", "q", "kt", "q_layout", "kt_layout",
              "frame", "stop", "miss"):
        setattr(dst, f, getattr(src, f))


def _attention_matcher(g, node, ctx):
    p_v, v_v = node.inputs
    rank = g.shape_of(p_v).rank
    if rank not in (3, 4) or g.shape_of(v_v).rank != rank:
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
    parse.flat = rank == 3
    if rank == 3 and not _set_frame(parse, _v_frame(g, v_v, parse)):
        m.data["reject"] = parse.miss
        m.consumed = tuple(parse.consumed)
        yield m
        return
    if not _walk_scores(g, s_v, parse):
        if parse.miss is None:
            stop = parse.stop.label if parse.stop is not None else "?"
            parse.miss = fail(MissReason.PATTERN_MISMATCH,
                              detail=f"softmax(s) @ v, but s is not q @ k' under constant "
                                     f"scales, additive masks, masked fills or a softcap: "
                                     f"the walk back from the softmax stopped at {stop}")
        m.data["reject"] = parse.miss
        m.consumed = tuple(dict.fromkeys(parse.consumed))
        yield m
        return
    if parse.flat and parse.frame is None:
        parse.frame = (g.shape_of(v_v).dims[0], 1)  # plain 3-D attention: one head
    m.values.update(q=parse.q, kt=parse.kt)
    for i, (kind, val, _, _) in enumerate(parse.masks):
        if kind == "add":
            m.values[f"mask{i}"] = val
        else:
            m.values[f"cond{i}"] = val[0]
    m.consumed = tuple(dict.fromkeys(parse.consumed))
    yield m


def _v_frame(g, v, parse: _Parse) -> tuple | None:
    """(B, H) of a [B*H, Sk, D] value from v's own head merge (None: decided by a reshape the
    walk passes, else one head per batch entry)."""
    n = g.nodes[v.node]
    if n.inputs and g.shape_of(n.inputs[0]).rank == 4:
        return _head_merge(g, n)
    return None


def _split_heads_dims(dims, frame) -> tuple | None:
    """dims of a 3-D value in a [B*H, ...] frame as 4-D [B, H, ...] (a leading 1 stays 1)."""
    b, h = frame
    if dims[0] == 1:
        return (1, 1) + tuple(dims[1:])
    if SymDim.of(dims[0]) == SymDim.of(b) * SymDim.of(h):
        return (b, h) + tuple(dims[1:])
    return None


def accepted_shape(m, ctx) -> Miss | None:
    """q [B, H, Sq, D], k' [B, Hk, D, Sk], v [B, Hk, Sk, Dv] (or all three [B*H, ...]); masks
    broadcast onto the scores."""
    if "reject" in m.data:
        return m.data["reject"]
    parse = m.data["parse"]
    q, kt, v = m.shape("q"), m.shape("kt"), m.shape("v")
    q_d, kt_d = _layout_dims(q.dims, parse.q_layout), _layout_dims(kt.dims, parse.kt_layout)
    lead = (lambda d: d[:1]) if parse.frame else (lambda d: d[1:2])
    if q_d[-1] != kt_d[-2] or kt_d[-1] != v.dims[-2] or lead(kt_d) != lead(v.dims):
        return fail(MissReason.SHAPE_MISMATCH,
                    detail=f"q {q_d}, k' {kt_d}, v {v.dims} are not [B,H,Sq,D], [B,H,D,Sk], "
                           "[B,H,Sk,Dv]")
    scores = m.graph.shape_of(m.nodes["softmax"].value)
    for i, (_, _, _, rank) in enumerate(parse.masks):
        name = f"mask{i}" if f"mask{i}" in m.values else f"cond{i}"
        s = m.shape(name)
        dims = s.dims
        if parse.frame is not None and rank == 3 and s.rank == 3:
            dims = _split_heads_dims(dims, parse.frame)
        frame_scores = scores.dims
        if parse.frame is not None and len(frame_scores) == 3:
            frame_scores = _split_heads_dims(frame_scores, parse.frame)
        if dims is None or len(dims) > 4 or _broadcast(dims, frame_scores) != frame_scores:
            return fail(MissReason.SHAPE_MISMATCH,
                        detail=f"mask {s} does not broadcast onto the scores {scores}")
    return None


def _layout_dims(dims, ops):
    for op in reversed(ops):
        dims = op.dims if isinstance(op, Reshape) else tuple(dims[i] for i in op.perm)
    return tuple(dims)


def _broadcast(a, b):
    from ...ir.shapes import broadcast_dims

    try:
        return broadcast_dims(a, b)
    except Exception:  # noqa: BLE001
        return None


def _uses_params(g, v) -> bool:
    """Whether value v is computed from a learned param (a bias rather than a mask). Nodes
    found free of params are remembered per graph (`_param_free`): the layers of a model
    read one mask, or masks made from the same inputs."""
    free = _param_free(g)
    stack, seen = [v.node], set()
    while stack:
        nid = stack.pop()
        if nid in seen or nid in free:
            continue
        seen.add(nid)
        n = g.nodes[nid]
        if isinstance(n.op, Param):
            return True
        if isinstance(n.op, Input):
            continue
        stack.extend(u.node for u in n.inputs)
    free.update(seen)  # nothing above any of them is a param
    return False


@per_graph
def _param_free(g) -> set[int]:
    """The ids of g's nodes known to have no param among them and their ancestors (filled by
    `_uses_params`; a new set when g has grown or was patched in place)."""
    return set()


def _to_heads(b, v, frame):
    """A [B*H, ...] value as [B, H, ...] (identity outside a merged frame)."""
    if frame is None:
        return v
    dims = b.shape_of(v).dims
    return b.reshape(v, _split_heads_dims(dims, frame)) if len(dims) == 3 else v


def _keys(b, m, parse):
    """k [B, H, S, D] from the scores' kt [B, H, D, S]. A kt read as it is composes with the
    transpose back, as the layout rules would compose them in the next pass: kt made by a
    transpose gives that transpose's input or one transpose of it, grouped GQA keys
    (`repeat_kv.grouped_keys`) one reshape."""
    src = m.graph.nodes[m.values["kt"].node]
    if not parse.kt_layout and parse.frame is None:
        if isinstance(src.op, Transpose):
            perm = tuple(src.op.perm[i] for i in (0, 1, 3, 2))
            x = m.new(src.inputs[0])
            return x if perm == tuple(range(4)) else b.transpose(x, perm)
        grouped = grouped_keys(m.graph, src)
        if grouped is not None:
            bb, h, d, s = src.outputs[0].dims
            return b.reshape(m.new(grouped), (bb, h, s, d))
    kt = _to_heads(b, _replay(b, m.v("kt"), parse.kt_layout), parse.frame)
    return b.transpose(kt, (0, 1, 3, 2))


def _build(b, m):
    parse = m.data["parse"]
    frame = parse.frame
    q = _to_heads(b, _replay(b, m.v("q"), parse.q_layout), frame)
    kv = None
    if not parse.kt_layout and frame is None:
        kv = unrepeated_kv(b, m, m.values["kt"], m.values["v"])
    if kv is None:
        kv = _keys(b, m, parse), _to_heads(b, m.v("v"), frame)
    k, v = kv
    dt = b.shape_of(q).dtype
    mask = None
    bias = False
    for i, (kind, val, post, rank) in enumerate(parse.masks):
        if kind == "add":
            term = m.v(f"mask{i}")
            bias = bias or m.memo(("uses_params", i),  # the trial build asked already
                                  lambda i=i: _uses_params(m.graph, m.values[f"mask{i}"]))
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
        if rank == 3:
            term = _to_heads(b, term, frame)
        mask = term if mask is None else b.add(mask, term)
    d = b.shape_of(q).dims[-1]
    scale = parse.scale
    if isinstance(d, int) and math.isclose(scale, 1.0 / math.sqrt(d), rel_tol=1e-6):
        scale = None
    kind = None if mask is None else (MaskKind.BIAS if bias else MaskKind.CUSTOM)
    out = b.attention(q, k, v, mask, kind=kind, scale=scale, softcap=parse.softcap)
    if frame is not None:
        out = b.reshape(out, m.root.outputs[0].dims)
    want = m.root.outputs[0].dtype
    return out if b.shape_of(out).dtype == want else b.cast(out, want)


def _walked_through(op) -> bool:
    """The ops the walk back from a root passes (besides one scores matmul): probabilities'
    casts, guards and head merges, the softmax, scales, masks, softcaps, and q's / k's
    scales, casts and layouts."""
    if isinstance(op, Binary):
        return op.fn in (BinaryFn.MUL, BinaryFn.DIV, BinaryFn.ADD)
    if isinstance(op, Unary):
        return op.fn is UnaryFn.TANH
    return isinstance(op, (Cast, Where, Softmax, Reshape, Transpose))


def _matmuls_reading(g, changed: set[int]) -> set[int]:
    """The CanonicalizeAttention retry hook: the matmuls whose walk back may read a changed
    node. From a root the matcher walks up through `_walked_through` ops and at most one
    other matmul (the scores; then q's and k's chains), reading the ops, types and producers
    of the inputs of what it passes, and the readers of q's and k's chain nodes (changed
    covers nodes whose readers changed). So a root reads a changed node X only when it is
    below X or one of X's readers through such ops and at most one matmul before it: the
    walk down from there finds it."""
    nodes = g.nodes
    roots: set[int] = set()
    stack = []
    for nid in set(changed) | g.reader_ids(changed):
        # a walk may stop at one of these (read, not passed: its readers go on whatever
        # its op, and a matmul here need not be the one a walk passes)
        if isinstance(nodes[nid].op, MatMul):
            roots.add(nid)
        stack.extend((c, 0) for c in g.reader_ids((nid,)))
    seen: set[tuple[int, int]] = set()
    while stack:
        nid, k = stack.pop()
        if (nid, k) in seen:
            continue
        seen.add((nid, k))
        op = nodes[nid].op
        if isinstance(op, MatMul):
            roots.add(nid)
            if k:
                continue  # a walk passes one matmul before its root at most
            k = 1
        elif not _walked_through(op):
            continue
        stack.extend((c, k) for c in g.reader_ids((nid,)))
    return roots


CANONICALIZE_ATTENTION = Rule(
    "CanonicalizeAttention", _build, matcher=_attention_matcher, checks=(accepted_shape,),
    root_test=lambda op: isinstance(op, MatMul), produces="attention",
    retry=_matmuls_reading,
    # every match (and near miss) walks back from its root to a softmax: a graph without one
    # is skipped whole (the sweep after the last softmax is canonicalized, too)
    requires=frozenset({(Softmax,)}))


ATTENTION_RULES = (CANONICALIZE_ATTENTION,)
