"""ONNX Runtime's attention-family contrib ops (com.microsoft): Attention (packed QKV projection),
MultiHeadAttention (separate q / k / v), RotaryEmbedding and BERT's
EmbedLayerNormalization, as braze's logical ops (matmul / narrow / reshape / transpose around
`attention`, `rope`, `layer_norm`) so that the attention-block fusion recombines them.

Masks follow ORT's CPU kernels (checked against ONNX Runtime 1.31): a key masked by
`mask_index` / `key_padding_mask` (raw 0/1 masks, right-padding lengths [B], end/start positions
[2B]) gets `mask_filter_value` (default -10000) added to its score; `attention_bias` is added as
given; under unidirectional=1 future keys drop out of the softmax entirely. A causal mask alone
is braze's causal attention; combined with other masks it is an additive mask holding the
dtype's lowest value at future keys. A KV cache (Attention's `past` [2, B, N, P, D],
MultiHeadAttention's `past_key` / `past_value` [B, N, P, D]) is concatenated before the new keys
and values on the sequence axis, which is what `present` / `present_key` / `present_value`
return; a causal mask then lets query i see keys <= P + i (a decode step), the attention block
fusion turns it into one FusedAttentionBlock with a KV cache. `past_sequence_length`, shared
past / present buffers and the packed QKV / KV layouts (which ORT runs only on GPUs) are not
supported."""
from __future__ import annotations

import ml_dtypes

from ....ir.dtypes import i64
from ....ir.ops.attention import MaskKind
from ....ir.ops.reduce import ReduceFn
from ....ir.symbolic import SymDim
from ..context import ImportContext, NodeView
from .contrib import contrib, wants

MASK_FILTER_VALUE = -10000.0


def _same(a, b) -> bool:
    return SymDim.of(a) == SymDim.of(b)


def _reject_inputs(ctx: ImportContext, node: NodeView, names: dict[int, str]) -> None:
    for i, what in names.items():
        if ctx.has(node, i):
            raise ctx.fail(node, f"input {i} ({what}) is not supported: braze takes a KV "
                                 "cache's length from its shape (a cache buffer of fixed size "
                                 "with a separate length, or a beam-search cache indirection, "
                                 "is not imported); export the model without it")


def _reject_outputs(ctx: ImportContext, node: NodeView, names: dict[int, str]) -> None:
    for i, what in names.items():
        if wants(node, i):
            raise ctx.fail(node, f"output {i} ({what}) is not supported")


def _additive(ctx: ImportContext, ok, like, filter_value: float):
    """0 where `ok`, `filter_value` elsewhere, in `like`'s dtype."""
    return ctx.g.where(ok, ctx.const_like(0.0, like), ctx.const_like(filter_value, like))


def _positions(ctx: ImportContext, n, shape):
    """arange(n) as i64, reshaped to `shape` (a row or a column)."""
    return ctx.g.reshape(ctx.g.arange(n), shape)


def key_mask(ctx: ImportContext, node: NodeView, mask, like, batch, sk, filter_value: float):
    """ORT's key / padding mask formats as an additive [B, 1, Sq|1, Sk] score mask: raw 0/1
    masks [B, Sk] and [B, Sq, Sk] (0 = masked), lengths [B] (keys at or past the length are
    masked) and end / start positions [2B] (left padding)."""
    g = ctx.g
    dims = tuple(ctx.dims(mask))
    rank = len(dims)
    if rank in (2, 3):
        ok = g.gt(mask, ctx.const_like(0, mask))
        add = _additive(ctx, ok, like, filter_value)
        return g.reshape(add, (dims[0], 1, 1, dims[1]) if rank == 2
                         else (dims[0], 1, dims[1], dims[2]))
    if rank != 1:
        raise ctx.fail(node, f"mask of shape {list(dims)} is not supported (raw masks [B, T] "
                             "and [B, S, T], lengths [B], end/start positions [2B] are)")
    j = _positions(ctx, sk, (1, sk))
    m = g.cast(mask, i64)
    if _same(dims[0], batch):
        ok = g.lt(j, g.reshape(m, (batch, 1)))
    elif _same(dims[0], SymDim.of(batch) * 2):
        pairs = g.reshape(m, (2, batch))
        end = g.reshape(g.narrow(pairs, 0, 0, 1), (batch, 1))
        start = g.reshape(g.narrow(pairs, 0, 1, 1), (batch, 1))
        ok = g.logical_and(g.lt(j, end), g.ge(j, start))
    else:
        raise ctx.fail(node, f"1-D mask of length {dims[0]} is not supported (lengths [B] "
                             f"and end/start positions [2B] are, B = {batch})")
    return g.reshape(_additive(ctx, ok, like, filter_value), (batch, 1, 1, sk))


def score_mask(ctx: ImportContext, node: NodeView, like, *, batch, sq, sk, key_mask_input=None,
               bias_input=None, causal: bool = False, past_len: bool = False):
    """(mask kind, additive mask or None) for braze attention from ORT's mask inputs.
    `past_len`: the keys start with a KV cache of sk - sq entries (query i is at position
    sk - sq + i: a causal query sees the cache and the new keys up to its own)."""
    g = ctx.g
    filter_value = float(node.attr("mask_filter_value", MASK_FILTER_VALUE))
    past = (SymDim.of(sk) - SymDim.of(sq)).to_dim() if past_len else 0
    if causal and not _same(sq, sk) and not past_len:
        raise ctx.fail(node, f"unidirectional attention with query length {sq} and key length "
                             f"{sk} is not supported (ORT aligns the mask differently)")
    parts = []
    if key_mask_input is not None:
        parts.append(key_mask(ctx, node, key_mask_input, like, batch, sk, filter_value))
    if bias_input is not None:
        parts.append(bias_input)
    if not parts:
        return (MaskKind.CAUSAL if causal else MaskKind.NONE), None
    if causal:
        rows = _positions(ctx, sq, (sq, 1))
        if past != 0:
            rows = g.add(rows, g.sym_const((past,), ()))
        ok = g.le(_positions(ctx, sk, (1, sk)), rows)
        lowest = float(ml_dtypes.finfo(ctx.dtype(like).np).min)  # bf16 too
        parts.insert(0, _additive(ctx, ok, like, lowest))
    total = parts[0]
    for p in parts[1:]:
        total = g.add(total, p)
    only_bias = key_mask_input is None and not causal
    return (MaskKind.BIAS if only_bias else MaskKind.CUSTOM), total


def _heads(ctx: ImportContext, t, batch, seq, heads: int):
    """[B, S, H*D] -> [B, H, S, D]."""
    d = ctx.dims(t)[-1] // heads
    return ctx.g.transpose(ctx.g.reshape(t, (batch, seq, heads, d)), (0, 2, 1, 3))


def _merge_heads(ctx: ImportContext, o, batch, seq):
    """[B, H, S, D] -> [B, S, H*D]."""
    _, h, _, d = ctx.dims(o)
    return ctx.g.reshape(ctx.g.transpose(o, (0, 2, 1, 3)), (batch, seq, h * d))


def _num_heads(ctx: ImportContext, node: NodeView) -> int:
    heads = int(node.attr("num_heads", 0))
    if heads <= 0:
        raise ctx.fail(node, f"num_heads must be a positive int, got {heads}")
    return heads


def _scale(node: NodeView) -> float | None:
    s = float(node.attr("scale", 0.0))
    return s if s != 0.0 else None


def _split_widths(ctx: ImportContext, node: NodeView, total: int, heads: int):
    sizes = list(node.attr("qkv_hidden_sizes", []) or [])
    if not sizes:
        if total % 3:
            raise ctx.fail(node, f"QKV width {total} is not divisible by 3; give "
                                 "qkv_hidden_sizes")
        sizes = [total // 3] * 3
    if len(sizes) != 3 or sum(sizes) != total or sizes[0] != sizes[1]:
        raise ctx.fail(node, f"qkv_hidden_sizes {sizes} do not split the QKV width {total} "
                             "into equal Q and K widths and a V width")
    if any(s % heads for s in sizes):
        raise ctx.fail(node, f"qkv_hidden_sizes {sizes} are not divisible by num_heads {heads}")
    return sizes


@contrib("Attention")
def attention(ctx, node):
    """Self-attention with one packed projection: x [B, S, E] @ W [E, Dq+Dk+Dv] (+ bias),
    split into consecutive Q, K, V column blocks, each [B, S, N, D] per head; output
    [B, S, Dv] (and `present` = stack(K, V) [2, B, N, S, D] when named)."""
    _reject_inputs(ctx, node, {6: "past_sequence_length"})
    if node.attr("do_rotary", 0) or node.attr("past_present_share_buffer", 0):
        raise ctx.fail(node, "do_rotary / past_present_share_buffer are not supported")
    g = ctx.g
    heads = _num_heads(ctx, node)
    x, w = ctx.value(node, 0), ctx.value(node, 1)
    if len(ctx.dims(x)) != 3 or len(ctx.dims(w)) != 2:
        raise ctx.fail(node, f"input {ctx.dims(x)} must be [B, S, E] and weights "
                             f"{ctx.dims(w)} [E, Dq+Dk+Dv]")
    batch, seq, _ = ctx.dims(x)
    dq, dk, dv = _split_widths(ctx, node, ctx.dims(w)[1], heads)
    qkv = g.matmul(x, w)
    if ctx.has(node, 2):
        qkv = g.add(qkv, ctx.value(node, 2))
    q = _heads(ctx, g.narrow(qkv, -1, 0, dq), batch, seq, heads)
    k = _heads(ctx, g.narrow(qkv, -1, dq, dk), batch, seq, heads)
    v = _heads(ctx, g.narrow(qkv, -1, dq + dk, dv), batch, seq, heads)
    past = ctx.opt_value(node, 4)
    if past is not None:
        k, v = _after_past(ctx, node, k, v, *_split_past(ctx, node, past, batch, heads, dk, dv))
    sk = ctx.dims(k)[2]
    kind, mask = score_mask(ctx, node, x, batch=batch, sq=seq, sk=sk,
                            key_mask_input=ctx.opt_value(node, 3),
                            bias_input=ctx.opt_value(node, 5),
                            causal=bool(node.attr("unidirectional", 0)),
                            past_len=past is not None)
    o = g.attention(q, k, v, mask, kind=kind, scale=_scale(node))
    present = None
    if wants(node, 1):
        if dk != dv:
            raise ctx.fail(node, "output `present` needs equal K and V widths")
        shape = (1, batch, heads, sk, dk // heads)
        present = g.concat([g.reshape(k, shape), g.reshape(v, shape)], 0)
    return [_merge_heads(ctx, o, batch, seq), present]


def _split_past(ctx: ImportContext, node: NodeView, past, batch, heads: int, dk: int, dv: int):
    """Attention's `past` [2, B, N, P, D] as (past keys, past values) [B, N, P, D]."""
    dims = tuple(ctx.dims(past))
    d = dk // heads
    if dk != dv or len(dims) != 5 or dims[0] != 2 or not _same(dims[1], batch) or \
            dims[2] != heads or dims[4] != d:
        raise ctx.fail(node, f"past {list(dims)} must be [2, B, N, P, D] = [2, {batch}, "
                             f"{heads}, P, {d}] (equal K and V widths)")
    shape = dims[1:]
    return tuple(ctx.g.reshape(ctx.g.narrow(past, 0, i, 1), shape) for i in (0, 1))


def _after_past(ctx: ImportContext, node: NodeView, k, v, past_k, past_v):
    """k, v [B, N, L, D] after the cache [B, N, P, D]: [B, N, P + L, D] each."""
    for name, new, old in (("key", k, past_k), ("value", v, past_v)):
        nd, od = ctx.dims(new), ctx.dims(old)
        if len(od) != 4 or tuple(od[:2]) != tuple(nd[:2]) or od[3] != nd[3]:
            raise ctx.fail(node, f"past {name} {list(od)} must be [B, N, P, D] with the new "
                                 f"{name}s' [B, N, D] = {[nd[0], nd[1], nd[3]]}")
    return ctx.g.concat([past_k, k], 2), ctx.g.concat([past_v, v], 2)


def _mha_qkv(ctx: ImportContext, node: NodeView, heads: int):
    """(q, k, v) as [B, N, S, D] from MultiHeadAttention's inputs, bias applied."""
    g = ctx.g
    query = ctx.value(node, 0)
    qd = ctx.dims(query)
    has_bias = ctx.has(node, 3)
    if len(qd) != 3 or not ctx.has(node, 1) or len(ctx.dims(ctx.value(node, 1))) == 5:
        raise ctx.fail(node, f"query {list(qd)} must be [B, S, D] with separate key / value "
                             "inputs (ORT's packed QKV / KV layouts run only on GPUs)")
    batch, seq, dq = qd
    key = ctx.value(node, 1)
    kd = ctx.dims(key)
    bias = ctx.value(node, 3) if has_bias else None
    if bias is not None and len(kd) != 3:
        raise ctx.fail(node, f"a bias with key layout {list(kd)} is not supported (only with "
                             "[B, L, D] key and value)")
    if bias is not None:
        query = g.add(query, g.narrow(bias, 0, 0, dq))
    q = _heads(ctx, query, batch, seq, heads)
    value = ctx.value(node, 2)
    if len(kd) == 4:
        return q, key, value
    klen = kd[1]
    dk, dv = kd[2], ctx.dims(value)[2]
    if bias is not None:
        key = g.add(key, g.narrow(bias, 0, dq, dk))
        value = g.add(value, g.narrow(bias, 0, dq + dk, dv))
    return q, _heads(ctx, key, batch, klen, heads), _heads(ctx, value, batch, klen, heads)


@contrib("MultiHeadAttention")
def multi_head_attention(ctx, node):
    """Attention of projected q [B, S, Dq] against k [B, L, Dk] / v [B, L, Dv] (or per-head
    k / v [B, N, L, D]), with an optional bias [Dq+Dk+Dv] added to q, k, v; output
    [B, S, Dv], `present_key` / `present_value` = k, v [B, N, L, D] when named."""
    _reject_inputs(ctx, node, {8: "past_sequence_length", 9: "cache_indirection"})
    _reject_outputs(ctx, node, {3: "qk"})
    g = ctx.g
    heads = _num_heads(ctx, node)
    q, k, v = _mha_qkv(ctx, node, heads)
    has_past = ctx.has(node, 6) or ctx.has(node, 7)
    if has_past:
        if not (ctx.has(node, 6) and ctx.has(node, 7)) or len(ctx.dims(ctx.value(node, 1))) != 3:
            raise ctx.fail(node, "past_key and past_value are supported together, with key and "
                                 "value [B, L, D] (new tokens to append to the cache)")
        k, v = _after_past(ctx, node, k, v, ctx.value(node, 6), ctx.value(node, 7))
    batch, _, sq, _ = ctx.dims(q)
    sk = ctx.dims(k)[2]
    kind, mask = score_mask(ctx, node, q, batch=batch, sq=sq, sk=sk,
                            key_mask_input=ctx.opt_value(node, 4),
                            bias_input=ctx.opt_value(node, 5),
                            causal=bool(node.attr("unidirectional", 0)), past_len=has_past)
    o = g.attention(q, k, v, mask, kind=kind, scale=_scale(node))
    return [_merge_heads(ctx, o, batch, sq), k if wants(node, 1) else None,
            v if wants(node, 2) else None]


def _rope_tables(ctx: ImportContext, node: NodeView, seq):
    """cos / sin rows for the positions: [S, half] for an offset position_ids [1] (rows
    offset..offset+S-1), [B, S, half] for position ids [B, S]."""
    g = ctx.g
    cos, sin = ctx.value(node, 2), ctx.value(node, 3)
    k = ctx.known(node, 1)
    pd = k.array.shape if k is not None else tuple(ctx.dims(ctx.value(node, 1)))
    if len(pd) <= 1:
        if k is not None and not k.symbolic:
            off = int(k.array.reshape(-1)[0])
            return g.narrow(cos, 0, off, seq), g.narrow(sin, 0, off, seq)
        pos = g.add(g.arange(seq), g.reshape(g.cast(ctx.value(node, 1), i64), ()))
    else:
        pos = g.cast(ctx.value(node, 1), i64)
    return g.gather(cos, pos, 0), g.gather(sin, pos, 0)


@contrib("RotaryEmbedding")
def rotary_embedding(ctx, node):
    """RoPE of x [B, N, S, D] or [B, S, N*D] with cos / sin caches [max_pos, n_rot / 2] read at
    position_ids ([B, S], or a start offset [1]); rotate-half or interleaved, partial rotation
    by rotary_embedding_dim."""
    if node.attr("is_packed_batching", 0):
        raise ctx.fail(node, "is_packed_batching=1 is not supported")
    if float(node.attr("scale", 1.0)) != 1.0:
        raise ctx.fail(node, f"scale={node.attr('scale')} is not supported")
    g = ctx.g
    x = ctx.value(node, 0)
    dims = ctx.dims(x)
    half = ctx.dims(ctx.value(node, 2))[-1]
    heads = int(node.attr("num_heads", 0))
    if len(dims) == 4:
        batch, _, seq, hd = dims
    elif len(dims) == 3:
        batch, seq, width = dims
        hd = width // heads if heads > 0 else 2 * half
        if heads <= 0:
            heads = width // hd
        if heads * hd != width:
            raise ctx.fail(node, f"hidden size {width} does not split into {heads} heads")
    else:
        raise ctx.fail(node, f"input {list(dims)} must be [B, N, S, D] or [B, S, N*D]")
    n_rot = int(node.attr("rotary_embedding_dim", 0)) or hd
    if 2 * half != n_rot:
        raise ctx.fail(node, f"cos/sin caches of width {half} do not match a rotary dim of "
                             f"{n_rot}")
    cos, sin = _rope_tables(ctx, node, seq)
    interleaved = bool(node.attr("interleaved", 0))
    if len(dims) == 4:
        if len(ctx.dims(cos)) == 3:
            cos, sin = (g.reshape(t, (batch, 1, seq, half)) for t in (cos, sin))
        return [g.rope(x, cos, sin, interleaved=interleaved,
                       n_rot=None if n_rot == hd else n_rot)]
    lead = (seq, 1, half) if len(ctx.dims(cos)) == 2 else (batch, seq, 1, half)
    cos, sin = (g.reshape(t, lead) for t in (cos, sin))
    x4 = g.reshape(x, (batch, seq, heads, hd))
    y = g.rope(x4, cos, sin, interleaved=interleaved, n_rot=None if n_rot == hd else n_rot)
    return [g.reshape(y, dims)]


@contrib("EmbedLayerNormalization")
def embed_layer_norm(ctx, node):
    """BERT embeddings: layer_norm(word[ids] + position[pos] (+ segment[segment_ids])), with
    positions 0..S-1 unless position_ids is given; `mask_index` output = the number of ones in
    each mask row (what ORT's Attention reads as the right-padding length)."""
    g = ctx.g
    ids = g.cast(ctx.value(node, 0), i64)
    seq = ctx.dims(ids)[1]
    word, pos_table = ctx.value(node, 2), ctx.value(node, 3)
    s = g.gather(word, ids, 0)
    if ctx.has(node, 8):
        pe = g.gather(pos_table, g.cast(ctx.value(node, 8), i64), 0)
    else:
        pe = g.narrow(pos_table, 0, 0, seq)
    s = g.add(s, pe)
    if ctx.has(node, 1) and ctx.has(node, 4):
        s = g.add(s, g.gather(ctx.value(node, 4), g.cast(ctx.value(node, 1), i64), 0))
    y = g.layer_norm(s, ctx.value(node, 5), ctx.opt_value(node, 6),
                     eps=float(node.attr("epsilon", 1e-12)))
    mask_index = None
    if wants(node, 1):
        if not ctx.has(node, 7):
            raise ctx.fail(node, "output mask_index without a mask input is not supported "
                                 "(ORT leaves it undefined)")
        mask = ctx.value(node, 7)
        ones = g.cast(g.eq(mask, ctx.const_like(1, mask)), ctx.dtype(mask))
        mask_index = g.reduce(ones, ReduceFn.SUM, (1,), keepdims=False)
    return [y, mask_index, s if wants(node, 2) else None]
