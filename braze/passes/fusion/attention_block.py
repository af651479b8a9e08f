"""FuseAttentionBlock: QKV projection -> head split (with an optional LayerNorm / RMSNorm of q
and k, per head before or after the head transpose, or over the whole projection) -> optional
rope on q and k -> attention -> head merge -> output projection, into one FusedAttentionBlock.
A decode step whose k and v are concatenated after a KV cache (concat(past, new) on the
sequence axis) fuses with `kv_cache`: the cache is an input, the concatenations (the present
keys / values a decoder returns) are the block's second and third outputs.
The QKV projection is one matmul narrowed three ways (GPT-2 c_attn, shared-input fusion) or
three matmuls: of one input (self-attention), or q of x and k, v of a second input x_kv
(encoder-decoder cross-attention), or q, k of x and v of x_kv (MobileBERT); the projections
of one input are joined into one weight (`QkvInputs`)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...ir.ops.attention import Attention
from ...ir.ops.fused import FusedAttentionBlock, FusedMatMulBiasAct, QkvInputs, RopeMode
from ...ir.ops.norm import LayerNorm, RmsNorm
from ...ir.ops.shape import Concat, Narrow, Reshape, Transpose
from ...rewrite import Guarded, Miss, MissReason, P, Rule, V, fail
from .checks import target_claims
from .shared_matmul import concat_weights

ROLES = ("q", "k", "v")
HEAD_SPLIT = (0, 2, 1, 3)  # [B, S, H, D] <-> [B, H, S, D]; the perm is its own inverse


def _is_vector(g, v) -> bool:
    return g.shape_of(v).rank == 1


def projection(src, role: str, name: str | None = None):
    """`src @ w_{role} (+ b_{role})`, written as primitives or already a bias-only
    FusedMatMulBiasAct. Biases are rank-1 values (a residual add is not a bias)."""
    w, b = V(f"w_{role}"), V(f"b_{role}", _is_vector)
    return (P.add(P.matmul(src, w), b, name=name)
            | P.of(FusedMatMulBiasAct, src, w, b, act=None, name=name)
            | P.matmul(src, w, name=name)
            | P.of(FusedMatMulBiasAct, src, w, act=None, name=name))


_NORMS = (LayerNorm, RmsNorm)


def _is_norm(g, node) -> bool:
    return isinstance(node.op, _NORMS)


def _qk_norm(src, role: str):
    """A LayerNorm / RMSNorm of q or k (with gamma and beta, one of them, or none)."""
    name, kinds = f"norm_{role}", _NORMS
    return Guarded(P.of(kinds, src, V(f"norm_a_{role}"), V(f"norm_b_{role}"), name=name)
                   | P.of(kinds, src, V(f"norm_a_{role}"), name=name)
                   | P.of(kinds, src, name=name), _is_norm)



def heads(src, role: str, rotated: bool):
    """[B, S, H*D] (-> norm) -> reshape [B, S, H, D] (-> norm) -> transpose [B, H, S, D]
    (-> rope); q and k may be normalized (once), v never is, and rope rotates q and k."""
    if not rotated:
        return P.of(Transpose, P.of(Reshape, src, name=f"reshape_{role}"), name=f"split_{role}")
    reshape = P.of(Reshape, _qk_norm(src, role) | src, name=f"reshape_{role}")
    split = P.of(Transpose, _qk_norm(reshape, role) | reshape, name=f"split_{role}")
    split = _qk_norm(split, role) | split  # a per-head norm after the transpose (Gemma 3)
    return P.rope(split, V(f"cos_{role}"), V(f"sin_{role}"), name=f"rope_{role}") | split


def _attention(q, k, v):
    return (P.of(Attention, q, k, v, V("mask"), name="attn")
            | P.of(Attention, q, k, v, name="attn"))


def _q_is_narrowed(g, node) -> bool:
    """A Narrow within the 7 nodes up the first-input chain of the attention's q (rope, norm,
    transpose, norm, reshape, norm, narrow: every op of `heads` reads q's path as its first
    input), as in every match of `_fused_qkv`."""
    v = node.inputs[0] if node.inputs else None
    for _ in range(7):
        if v is None:
            return False
        n = g.nodes[v.node]
        if isinstance(n.op, Narrow):
            return True
        v = n.inputs[0] if n.inputs else None
    return False


def cached(t, role: str):
    """concat(past_{role}, t): a decode step's keys or values after its KV cache."""
    return P.of(Concat, V(f"past_{role}"), t, name=f"cache_{role}")


def _attention_maybe_cached(q, k, v):
    return _attention(q, k, v) | _attention(q, cached(k, "k"), cached(v, "v"))


_qkv = projection(V("x"), "qkv", name="qkv")                       # x @ w_qkv (+ b_qkv)
_fused_qkv = Guarded(_attention_maybe_cached(
    *(heads(P.of(Narrow, _qkv, name=f"narrow_{r}"), r, r != "v") for r in ROLES)),
    _q_is_narrowed)                                              # narrows of one projection
_separate_qkv = _attention_maybe_cached(*(heads(projection(V(f"x_{r}"), r), r, r != "v")
                                          for r in ROLES))       # x_q @ w_q, x_k @ w_k, ...
_merged = P.of(Reshape, P.of(Transpose, _fused_qkv | _separate_qkv, name="merge_t"),
               name="merge_r")                                   # [B, H, S, D] -> [B, S, H*D]
_pattern = projection(_merged, "o")                              # ... @ w_o (+ b_o)


def _merges_heads(g, v) -> bool:
    """v = reshape(transpose(an attention's output)): what `_merged` can match."""
    n = g.nodes[v.node]
    if v.index or not isinstance(n.op, Reshape) or not n.inputs:
        return False
    t = g.nodes[n.inputs[0].node]
    if n.inputs[0].index or not isinstance(t.op, Transpose) or not t.inputs:
        return False
    return t.inputs[0].index == 0 and isinstance(g.nodes[t.inputs[0].node].op, Attention)


def _may_project_merged_heads(g, node) -> bool:
    """A cheap test every root `_pattern` matches passes: it projects merged heads (they are
    its first input), or adds a vector to a product of merged heads (in either order)."""
    ins = node.inputs
    if ins and _merges_heads(g, ins[0]):
        return True
    if len(ins) != 2:
        return False
    for p, bias in (ins, ins[::-1]):
        product = g.nodes[p.node]
        if p.index == 0 and product.inputs and _merges_heads(g, product.inputs[0]) \
                and g.shape_of(bias).rank == 1:
            return True
    return False


# -- checks -------------------------------------------------------------------------------------
def _x_name(m) -> str:
    return "x" if "qkv" in m.nodes else "x_q"


def _source_name(m, role: str) -> str:
    """The capture holding the input `role` projects."""
    return "x" if "qkv" in m.nodes else f"x_{role}"


def _layout(m) -> QkvInputs | None:
    if "qkv" in m.nodes:
        return QkvInputs.SELF
    return QkvInputs.of([m.values[f"x_{r}"] for r in ROLES])


def reads_supported_inputs(m, ctx) -> Miss | None:
    """q, k and v project one input (self-attention), or q one and k, v another
    (cross-attention), or q, k one and v another (MobileBERT); masks and rope fit that layout:
    causal / sliding-window masks and rope need q and k from one input."""
    layout = _layout(m)
    if layout is None:
        xs = [m.values[f"x_{r}"] for r in ROLES]
        return fail(MissReason.NOT_SHARED_INPUT,
                    hint="FusedAttentionBlock reads q from x and k, v each from x or one second "
                         "input x_kv, with k from x whenever v is; this layout stays unfused.",
                    detail="q, k, v read " + ", ".join(repr(x) for x in xs))
    if layout.sources[1] == "x":
        return None
    if m.op("attn").mask.is_causal:
        return fail(MissReason.PATTERN_MISMATCH,
                    hint="a causal mask orders keys by the queries' positions; cross-attention "
                         "keys come from another input.",
                    detail=f"{m.op('attn').mask.value} attention over keys of another input")
    if "rope_q" in m.nodes or "rope_k" in m.nodes:
        return fail(MissReason.PATTERN_MISMATCH,
                    hint="FusedAttentionBlock rotates q and k by positions of one input.",
                    detail="rope on a cross-attention's q or k")
    return None


def kv_cache_fits(m, ctx) -> Miss | None:
    """A KV cache extends the keys and values of the queries' own input along the sequence
    axis: past_k / past_v [B, Hkv, P, D] before the new ones."""
    if "cache_k" not in m.nodes:
        return None
    hint = ("FusedAttentionBlock appends new keys / values of x to a [B, Hkv, P, D] cache "
            "on the sequence axis; this cache stays an attention op with its projections.")
    if _layout(m) is not QkvInputs.SELF:
        return fail(MissReason.PATTERN_MISMATCH, hint=hint,
                    detail="a KV cache on the keys / values of a second input")
    for r in ("k", "v"):
        node = m.nodes[f"cache_{r}"]
        rank = node.outputs[0].rank
        if node.op.axis % rank != 2:
            return fail(MissReason.AXIS_MISMATCH, hint=hint,
                        detail=f"{node.label} joins the cache on axis {node.op.axis}, not the "
                               "sequence axis 2 of [B, H, S, D]")
    pk, pv = m.shape("past_k"), m.shape("past_v")
    if pk.dims != pv.dims or pk.dtype != pv.dtype:
        return fail(MissReason.SHAPE_MISMATCH, hint=hint,
                    detail=f"past keys {pk} and past values {pv} differ")
    return None


def projections_fit(m, ctx) -> Miss | None:
    """Every projection weight is an [E, N] matrix and every bias a [N] vector of its width
    (the fused block concatenates them; a broadcasting [1] bias or a batched weight does not
    fit)."""
    roles = ("qkv", "o") if "qkv" in m.nodes else ROLES + ("o",)
    for r in roles:
        w = m.shape(f"w_{r}")
        if w.rank != 2:
            return fail(MissReason.SHAPE_MISMATCH,
                        detail=f"{r} projection weight {w} is not an [E, N] matrix")
        if f"b_{r}" in m.values and m.shape(f"b_{r}").dims != w.dims[-1:]:
            return fail(MissReason.SHAPE_MISMATCH,
                        hint="write each projection bias as a vector of the projection's width.",
                        detail=f"{r} projection bias {m.shape(f'b_{r}')} is not "
                               f"[{w.dims[-1]}], the width of its weight {w}")
    return None


def head_split_perms(m, ctx) -> Miss | None:
    """Heads are split and merged with the [B, S, H, D] <-> [B, H, S, D] transpose."""
    for name in [f"split_{r}" for r in ROLES] + ["merge_t"]:
        perm = m.op(name).perm
        if perm != HEAD_SPLIT:
            return fail(MissReason.PATTERN_MISMATCH,
                        detail=f"{name} transposes with perm {perm}, not {HEAD_SPLIT}")
    return None


def head_shapes(m, ctx) -> Miss | None:
    """x is [B, S, E] (and x_kv [B, S_kv, E_kv]); q/k/v reshape to [B, S_in, H, D] of the input
    they project, with one D and Hkv dividing Hq; the narrows are consecutive q, k, v slices of
    the whole last axis; the merge gives [B, S, Hq*D]."""
    x = m.shape(_x_name(m))
    if x.rank != 3:
        return fail(MissReason.SHAPE_MISMATCH, detail=f"x must be [B, S, E], got {x}")
    b, s, _ = x.dims
    dims = {r: m.op(f"reshape_{r}").dims for r in ROLES}
    for r, d in dims.items():
        src = m.shape(_source_name(m, r))
        if src.rank != 3 or src.dims[0] != b:
            return fail(MissReason.SHAPE_MISMATCH,
                        detail=f"{r} projects {src}, not [{b}, S, E] like the queries' x")
        if len(d) != 4 or tuple(d[:2]) != src.dims[:2]:
            return fail(MissReason.SHAPE_MISMATCH,
                        detail=f"{r} heads reshape to {d}, not [{b}, {src.dims[1]}, H, D]")
    (hq, d), (hk, dk), (hv, dv) = (dims[r][2:] for r in ROLES)
    if not all(isinstance(n, int) for n in (hq, d, hk, dk, hv, dv)):
        return fail(MissReason.DYNAMIC_SHAPE, detail="head count or head dim is symbolic")
    if d != dk or d != dv or hk != hv or hq % hk:
        return fail(MissReason.SHAPE_MISMATCH,
                    detail=f"q/k/v heads x head_dim are {hq}x{d}, {hk}x{dk}, {hv}x{dv}")
    merged = m.op("merge_r").dims
    if tuple(merged) != (b, s, hq * d):
        return fail(MissReason.SHAPE_MISMATCH,
                    detail=f"merge reshapes to {merged}, not [{b}, {s}, {hq * d}]")
    if "qkv" in m.nodes:
        return _narrows_cover_qkv(m, (hq * d, hk * d, hv * d))
    return None


def _narrows_cover_qkv(m, widths) -> Miss | None:
    qkv = m.shape("qkv")
    start = 0
    for r, width in zip(ROLES, widths):
        op = m.op(f"narrow_{r}")
        if op.axis != qkv.rank - 1 or (op.start, op.length) != (start, width):
            return fail(MissReason.SHAPE_MISMATCH,
                        detail=f"{r} is narrow(axis {op.axis}, start {op.start}, length "
                               f"{op.length}) of {qkv}; expected the last axis at "
                               f"[{start}, {start + width})")
        start += width
    if qkv.dims[-1] != start:
        return fail(MissReason.SHAPE_MISMATCH,
                    detail=f"q, k, v use {start} of the projection's {qkv.dims[-1]} columns")
    return None


def rope_on_q_and_k(m, ctx) -> Miss | None:
    """Rope rotates both q and k or neither, with one op and the same cos/sin tables."""
    rq, rk = m.nodes.get("rope_q"), m.nodes.get("rope_k")
    if rq is None and rk is None:
        return None
    if rq is None or rk is None:
        return fail(MissReason.PATTERN_MISMATCH,
                    detail=f"rope rotates only {'q' if rk is None else 'k'}")
    if rq.op != rk.op:
        return fail(MissReason.PATTERN_MISMATCH, detail=f"q rope {rq.op} differs from k {rk.op}")
    for t in ("cos", "sin"):
        if m.values[f"{t}_q"] != m.values[f"{t}_k"]:
            return fail(MissReason.PATTERN_MISMATCH,
                        detail=f"q and k rotate with different {t} tables")
    return None


def qk_norms_match(m, ctx) -> Miss | None:
    """q and k are normalized alike or not at all: one norm op (kind, eps, gamma / beta), over
    the last axis only, at the same place (per head, or the whole projection slice)."""
    nq, nk = m.nodes.get("norm_q"), m.nodes.get("norm_k")
    if nq is None and nk is None:
        return None
    if nq is None or nk is None:
        return fail(MissReason.PATTERN_MISMATCH,
                    hint="FusedAttentionBlock normalizes q and k alike; a norm of only one "
                         "stays unfused.",
                    detail=f"only {'q' if nk is None else 'k'} is normalized")
    for r, node in (("q", nq), ("k", nk)):
        rank = node.outputs[0].rank
        if node.op.axis % rank != rank - 1:
            return fail(MissReason.AXIS_MISMATCH,
                        hint="FusedAttentionBlock normalizes q and k over their last axis.",
                        detail=f"{r} norm reduces axes from {node.op.axis} of a rank-{rank} "
                               "value, not the last axis alone")
    if replace(nq.op, axis=-1) != replace(nk.op, axis=-1):
        return fail(MissReason.PATTERN_MISMATCH, detail=f"q norm {nq.op} differs from k {nk.op}")
    if _per_head(m, "q") != _per_head(m, "k"):
        return fail(MissReason.PATTERN_MISMATCH,
                    detail="q is normalized per head and k over the whole projection, or the "
                           "reverse")
    return None


def _per_head(m, role: str) -> bool:
    """Whether `role`'s norm reads the heads (before or after their transpose; else the
    projection before the head split)."""
    src = m.nodes[f"norm_{role}"].inputs[0]
    return src in (m.nodes[f"reshape_{role}"].value, m.nodes[f"split_{role}"].value)


# -- replacement --------------------------------------------------------------------------------
def concat_projections(b, m, weights, biases, widths):
    """One projection from several of one input: weights side by side on their output columns
    (`shared_matmul.concat_weights`: stored values are joined once into a new param), biases
    likewise, zeros standing in for a missing one (None when none has a bias). One projection
    is kept as it is."""
    if len(weights) == 1:
        return m.new(weights[0]), None if biases[0] is None else m.new(biases[0])
    w = concat_weights(b, m, weights)
    if all(x is not None for x in biases):
        return w, concat_weights(b, m, biases)
    if all(x is None for x in biases):
        return w, None
    dt = m.graph.shape_of(weights[0]).dtype.np
    parts = [m.new(x) if x is not None else b.constant(np.zeros(n, dt))
             for x, n in zip(biases, widths)]
    return w, b.concat(parts, 0)


def _rope_mode(node) -> RopeMode:
    if node is None:
        return RopeMode.NONE
    return RopeMode.INTERLEAVED if node.op.interleaved else RopeMode.ROTATE_HALF


_NORM_ARGS = {r: (f"norm_a_{r}", f"norm_b_{r}") for r in ("q", "k")}


def _build(b, m):
    _, _, hq, d = m.op("reshape_q").dims
    hkv = m.op("reshape_k").dims[2]

    def get(name):  # resolve only what the block reads (old q/k/v weights may be joined away)
        return m.v(name) if name in m.values else None

    layout = _layout(m)
    if "qkv" in m.nodes:
        ins = {"x": get("x"), "w_qkv": get("w_qkv"), "b_qkv": get("b_qkv")}
    else:
        ins = {"x": get("x_q"), "x_kv": get("x_v")}
        has_bias = any(f"b_{r}" in m.values for r in ROLES)
        widths = {"q": hq * d, "k": hkv * d, "v": hkv * d}
        for _, joined in layout.projections:
            w, bias = concat_projections(b, m, [m.values[f"w_{r}"] for r in joined],
                                         [m.values.get(f"b_{r}") for r in joined],
                                         [widths[r] for r in joined])
            if bias is None and has_bias:  # biases on the other input's projection only
                dt = m.graph.shape_of(m.values[f"w_{joined[0]}"]).dtype.np
                bias = b.constant(np.zeros(sum(widths[r] for r in joined), dt))
            ins.update({f"w_{joined}": w, f"b_{joined}": bias})
    ins.update(w_o=get("w_o"), b_o=get("b_o"), cos=get("cos_q"), sin=get("sin_q"),
               mask=get("mask"), past_k=get("past_k"), past_v=get("past_v"))
    attn, rope = m.op("attn"), m.nodes.get("rope_q")
    norm = m.nodes.get("norm_q")
    if norm is not None:
        for r in ("q", "k"):  # the norm's gamma / beta, in its input order
            present = [name for name, has in (("gamma", norm.op.has_gamma),
                                              ("beta", norm.op.has_beta)) if has]
            ins.update({f"{r}_norm_{p}": get(v) for p, v in zip(present, _NORM_ARGS[r])})
    op = FusedAttentionBlock(
        num_heads=hq, num_kv_heads=hkv, head_dim=d, mask=attn.mask, window=attn.window,
        scale=attn.scale, softcap=attn.softcap, rope=_rope_mode(rope),
        n_rot=None if rope is None else rope.op.n_rot,
        has_qkv_bias=ins[f"b_{layout.projections[0][1]}"] is not None,
        has_out_bias=ins["b_o"] is not None,
        qk_norm=None if norm is None else replace(norm.op, axis=-1),
        qk_norm_per_head=norm is None or _per_head(m, "q"), qkv_inputs=layout,
        round_core=attn.round_operands, kv_cache="cache_k" in m.nodes)
    outs = b.add_node(op, [ins[r] for r in op.input_roles()])
    if not op.kv_cache:
        return outs[0]
    return {"root": outs[0], "cache_k": outs[1], "cache_v": outs[2]}


def _explain_attention(g, node, ctx) -> Miss | None:
    """An attention left alone: name the first part of the block that does not fit (the
    output merge and projection, then each of q, k, v), or inputs read in no supported
    layout."""
    miss = _explain_output(g, node)
    if miss is not None:
        return miss
    sources = {}
    for role, v in zip(ROLES, node.inputs[:3]):
        found = _explain_input(g, role, v)
        if isinstance(found, Miss):
            return found
        sources[role] = found
    if QkvInputs.of([sources[r] for r in ROLES]) is None:
        names = ", ".join(f"{r} projects {g.nodes[sources[r].node].label}" for r in ROLES)
        return fail(MissReason.NOT_SHARED_INPUT, detail=names,
                    hint="FusedAttentionBlock reads q from x and k, v each from x or one "
                         "second input x_kv, with k from x whenever v is; this layout stays an "
                         "attention op with its projections")
    return fail(MissReason.PATTERN_MISMATCH,
                detail="q, k, v and the output are head splits and a merge of projections of "
                       "one input, but their shapes or layout do not fit one block")


def _explain_output(g, node) -> Miss | None:
    def only_user(n, what):
        users = g.users(n.value)
        if len(users) != 1 or g.is_output(n.value):
            readers = ", ".join(u.label for u in users) or "the graph outputs"
            return None, fail(MissReason.PATTERN_MISMATCH,
                              detail=f"{what} {n.label} is read by {readers}; the block needs "
                                     "it only merged ([B, S, H*D]) and projected by one matmul")
        return users[0], None

    merge, miss = only_user(node, "attention output")
    if miss is not None:
        return miss
    if merge.op.kind != "transpose" or merge.op.perm != HEAD_SPLIT:
        return fail(MissReason.PATTERN_MISMATCH,
                    detail=f"attention output goes to {merge.label}, not the head merge "
                           f"transpose {HEAD_SPLIT} ([B, H, S, D] -> [B, S, H, D])")
    flat, miss = only_user(merge, "head merge")
    if miss is not None:
        return miss
    if flat.op.kind != "reshape" or flat.outputs[0].rank != 3:
        return fail(MissReason.PATTERN_MISMATCH,
                    detail=f"merged heads go to {flat.label}, not a reshape to [B, S, H*D]")
    proj, miss = only_user(flat, "merged heads")
    if miss is not None:
        return miss
    if proj.op.kind not in ("matmul", "fused_matmul_bias_act") or proj.inputs[0] != flat.value \
            or g.shape_of(proj.inputs[1]).rank != 2:
        return fail(MissReason.PATTERN_MISMATCH,
                    detail=f"merged heads go to {proj.label}, not an output projection @ w_o")
    return None


def _explain_input(g, role: str, v):
    """The projection input x of `role`'s head split, or a Miss saying what `role` is."""
    n = g.nodes[v.node]
    if n.op.kind == "concat" and role != "q" and len(n.inputs) == 2:  # after a KV cache
        n = g.nodes[n.inputs[1].node]
    if n.op.kind == "rope" and role != "v":
        n = g.nodes[n.inputs[0].node]
    shape = f"transpose(reshape(x @ w_{role} (+ b), [B, S, H, D]), {HEAD_SPLIT})"
    if n.op.kind == "input" and role != "q":
        return fail(MissReason.PATTERN_MISMATCH,
                    hint="keys / values read from a cache as they are (a decode step's "
                         "cross-attention over cached encoder states) have no projection to "
                         "fuse; the attention op runs fused on its own.",
                    detail=f"{role} is {n.label}, not {shape}")
    if n.op.kind != "transpose" or n.op.perm != HEAD_SPLIT:
        return fail(MissReason.PATTERN_MISMATCH, detail=f"{role} is {n.label}, not {shape}")
    r = g.nodes[n.inputs[0].node]
    if r.op.kind != "reshape":
        return fail(MissReason.PATTERN_MISMATCH,
                    detail=f"{role} heads are transposed from {r.label}, not {shape}")
    p = g.nodes[r.inputs[0].node]
    if p.op.kind == "narrow":
        p = g.nodes[p.inputs[0].node]
    if p.op.label == "add":
        mm = [g.nodes[u.node] for u in p.inputs if g.nodes[u.node].op.kind == "matmul"]
        p = mm[0] if mm else p
    if p.op.kind not in ("matmul", "fused_matmul_bias_act") or \
            g.shape_of(p.inputs[1]).rank != 2:
        return fail(MissReason.PATTERN_MISMATCH,
                    detail=f"{role} heads are split from {p.label}, not from a projection "
                           f"x @ w_{role} (+ b)")
    return p.inputs[0]


FUSE_ATTENTION_BLOCK = Rule(
    "FuseAttentionBlock",
    _build,
    pattern=Guarded(_pattern, _may_project_merged_heads),
    checks=(target_claims("fused_attention_block"), reads_supported_inputs, kv_cache_fits,
            projections_fit, head_split_perms, head_shapes, rope_on_q_and_k, qk_norms_match),
    may_expose=frozenset({"cache_k", "cache_v"}),
    anchor=lambda op: op.kind == "attention",
    explain=_explain_attention,
    produces="fused_attention_block",
)
RULES = (FUSE_ATTENTION_BLOCK,)
