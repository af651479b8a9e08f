"""scaled_dot_product_attention -> braze `attention` (q [B, H, S, D]) in every mask form:

  no mask                          -> mask kind none
  is_causal (Sq == Sk)             -> causal (braze aligns the last query with the last key, which
                                      is torch's top-left alignment when the lengths agree)
  is_causal (Sq != Sk)             -> custom, with torch's top-left triangle built from ranges
  boolean attn_mask                -> custom, the additive mask where(mask, 0, -inf) made outside
                                      the attention (braze's softmax is safe: a fully masked row
                                      gives zeros, as torch's sdpa does)
  float attn_mask                  -> custom (added to the scores, broadcast)
  scale, enable_gqa                -> the scale attribute; kv heads dividing query heads

Inputs of rank 3 ([B, S, D]) get a unit head axis; higher ranks fold their leading dims into B."""
from __future__ import annotations

import math

from ....ir.dtypes import bool_, i64
from ....ir.ops.attention import MaskKind
from ....ir.symbolic import SymDim
from ..context import Call, Lazy, TorchContext, converter


def _additive(ctx: TorchContext, mask, dt):
    if ctx.dtype(mask) == bool_:
        g = ctx.g
        return g.where(mask, ctx.value(0.0, dt), ctx.value(-math.inf, dt))
    return ctx.cast(mask, dt)


def _top_left_causal(ctx, sq, sk, dt):
    """Additive [Sq, Sk] mask: query i sees keys j <= i."""
    g = ctx.g
    i = g.reshape(g.arange(sq, 0, 1, i64), (sq, 1))
    j = g.reshape(g.arange(sk, 0, 1, i64), (1, sk))
    return g.where(g.le(j, i), ctx.value(0.0, dt), ctx.value(-math.inf, dt))


def _to_rank4(ctx, xs, mask, lead):
    """q, k, v (and the mask) as [B, H, S, D]: rank 3 gets a unit head axis, rank > 4 folds
    its leading dims into the batch."""
    g = ctx.g
    rank = len(lead) + 2
    if rank == 4:
        return xs, mask
    if rank < 2:
        raise ctx.fail("scaled_dot_product_attention needs inputs of rank >= 2")
    out = []
    for x in xs:
        d = ctx.dims(x)
        if d[:-2] != lead:
            raise ctx.fail(f"query batch dims {lead} and key/value batch dims {d[:-2]} differ; "
                           "braze needs them equal for inputs of rank other than 4")
        if rank < 4:
            out.append(g.reshape(x, (1,) * (4 - rank) + d))
        else:
            b = SymDim.of(1)
            for a in lead[:-1]:
                b = b * SymDim.of(a)
            out.append(g.reshape(x, (b.to_dim(), lead[-1]) + d[-2:]))
    if mask is not None:
        m = ctx.dims(mask)
        if rank < 4 and len(m) > 2:
            mask = g.reshape(mask, m[:-2] + (1,) + m[-2:])
        elif rank > 4 and len(m) > 2:
            raise ctx.fail("an attention mask with batch dims on inputs of rank > 4 is not "
                           "supported; fold the leading dims into the batch first")
    return out, mask


@converter("aten.scaled_dot_product_attention.default",
           "aten._scaled_dot_product_flash_attention_for_cpu.default",
           "aten._scaled_dot_product_attention_math.default")
def sdpa(ctx, c: Call):
    g = ctx.g
    dt = ctx.out_dtype(0)
    q, k, v = (ctx.value(c[n], dt) for n in ("query", "key", "value"))
    if float(c.get("dropout_p", 0.0)) != 0.0:
        raise ctx.fail("attention dropout is random; call module.eval() (or pass dropout_p=0) "
                       "before importing")
    mask = c.args.get("attn_mask")
    mask = None if mask is None else ctx.value(mask)
    causal = bool(c.get("is_causal", False))
    if causal and mask is not None:
        raise ctx.fail("scaled_dot_product_attention takes attn_mask or is_causal, not both")
    lead = ctx.dims(q)[:-2]
    (q, k, v), mask = _to_rank4(ctx, (q, k, v), mask, lead)
    b, hq, sq, _ = ctx.dims(q)
    bk, hkv, sk, _ = ctx.dims(k)
    if hq != hkv and not c.get("enable_gqa", False) and hkv != 1:
        raise ctx.fail(f"query has {hq} heads and key/value {hkv}; pass enable_gqa=True for "
                       "grouped-query attention")
    if bk != b:
        k, v = (g.expand(x, (b,) + ctx.dims(x)[1:]) for x in (k, v))
    kind = MaskKind.NONE
    if mask is not None:
        mask, kind = _additive(ctx, mask, dt), MaskKind.CUSTOM
    elif causal:
        if SymDim.of(sq) == SymDim.of(sk):
            kind = MaskKind.CAUSAL
        else:
            mask, kind = _top_left_causal(ctx, sq, sk, dt), MaskKind.CUSTOM
    scale = c.args.get("scale")
    y = g.attention(q, k, v, mask, kind=kind, scale=None if scale is None else float(scale))
    out_dims = lead + ctx.dims(y)[-2:]
    if ctx.dims(y) != out_dims:
        y = g.reshape(y, out_dims)
    if c.key == "aten.scaled_dot_product_attention.default":
        return y

    err = ctx.fail("the attention's logsumexp output is not supported")

    def lse():
        raise err

    return (y, Lazy(lse)) + tuple(Lazy(lse) for _ in range(len(c.node.meta["val"]) - 2))
