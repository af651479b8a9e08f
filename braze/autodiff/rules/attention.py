"""VJP rules of attention (one `attention_backward_all` for d q, d k, d v, plus
`attention_backward` wrt the mask for custom / bias masks) and rope (`rope_backward` for d x;
d cos / d sin from the rotated halves with primitives). JVPs go through the decompositions."""
from __future__ import annotations

from ...ir.ops.attention import Attention, Rope
from ..registry import jvp_rule, unbroadcast, vjp_rule
from ._composite import jvp_through_decomposition


@vjp_rule(Attention)
def attention_vjp(b, node, ins, outs, cts):
    ct, op = cts[0], node.op
    if ct is None:
        return [None] * len(ins)
    mask = ins[3] if len(ins) == 4 else None
    attrs = dict(kind=op.mask, window=op.window, scale=op.scale, softcap=op.softcap)
    dq, dk, dv = b.attention_backward_all(ct, *ins[:3], mask, **attrs)
    if mask is None:
        return [dq, dk, dv]
    return [dq, dk, dv, b.attention_backward(ct, *ins[:3], mask, wrt="mask", **attrs)]


def _halves(b, x, op: Rope):
    """The (a, b) halves rope pairs up in x's first n_rot dims, each [..., n_rot / 2]."""
    dims = b.shape_of(x).dims
    d = dims[-1]
    n = op.rotated(d)
    h = n // 2
    if op.interleaved:
        pairs = b.reshape(b.narrow(x, -1, 0, n) if n < d else x, dims[:-1] + (h, 2))
        return (b.reshape(b.narrow(pairs, -1, 0, 1), dims[:-1] + (h,)),
                b.reshape(b.narrow(pairs, -1, 1, 1), dims[:-1] + (h,)))
    return b.narrow(x, -1, 0, h), b.narrow(x, -1, h, h)


@vjp_rule(Rope)
def rope_vjp(b, node, ins, outs, cts):
    """out_a = a cos - b sin, out_b = b cos + a sin: d cos = ct_a a + ct_b b and
    d sin = ct_b a - ct_a b, summed over the axes cos / sin broadcast along."""
    ct, op = cts[0], node.op
    if ct is None:
        return [None] * 3
    x, cos, sin = ins
    dx = b.rope_backward(ct, cos, sin, op.interleaved, op.n_rot)
    (xa, xb), (ca, cb) = _halves(b, x, op), _halves(b, ct, op)
    table = b.shape_of(cos)
    dcos = unbroadcast(b, b.add(b.mul(ca, xa), b.mul(cb, xb)), table)
    dsin = unbroadcast(b, b.sub(b.mul(cb, xa), b.mul(ca, xb)), table)
    return [dx, dcos, dsin]


jvp_rule(Attention, Rope)(jvp_through_decomposition)
