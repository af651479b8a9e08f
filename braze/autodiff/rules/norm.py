"""VJP and JVP rules of the normalizations. layer_norm, rms_norm and group_norm use the closed
form backward ops (`*_backward_input` / `_gamma` / `_beta`); inference batch_norm is linear in
x and written with primitives. JVPs go through each op's decomposition."""
from __future__ import annotations

from ...ir.ops.norm import BatchNorm, GroupNorm, LayerNorm, RmsNorm
from ..registry import jvp_rule, vjp_rule
from ._composite import jvp_through_decomposition


def _affine(node, ins):
    """(gamma, beta) input values, None where absent."""
    it = iter(ins[1:])
    gamma = next(it) if node.op.has_gamma else None
    beta = next(it) if node.op.has_beta else None
    return gamma, beta


def _with_affine(node, dx, dgamma, dbeta) -> list:
    out = [dx]
    if node.op.has_gamma:
        out.append(dgamma())
    if node.op.has_beta:
        out.append(dbeta())
    return out


@vjp_rule(LayerNorm)
def layer_norm_vjp(b, node, ins, outs, cts):
    ct, op = cts[0], node.op
    if ct is None:
        return [None] * len(ins)
    x, (gamma, _) = ins[0], _affine(node, ins)
    return _with_affine(
        node, b.layer_norm_backward_input(ct, x, gamma, op.eps, op.axis),
        lambda: b.layer_norm_backward_gamma(ct, x, op.eps, op.axis),
        lambda: b.rms_norm_backward_beta(ct, op.axis))


@vjp_rule(RmsNorm)
def rms_norm_vjp(b, node, ins, outs, cts):
    ct, op = cts[0], node.op
    if ct is None:
        return [None] * len(ins)
    x, (gamma, _) = ins[0], _affine(node, ins)
    return _with_affine(
        node, b.rms_norm_backward_input(ct, x, gamma, op.eps, op.axis),
        lambda: b.rms_norm_backward_gamma(ct, x, op.eps, op.axis),
        lambda: b.rms_norm_backward_beta(ct, op.axis))


@vjp_rule(GroupNorm)
def group_norm_vjp(b, node, ins, outs, cts):
    ct, op = cts[0], node.op
    if ct is None:
        return [None] * len(ins)
    x, (gamma, _) = ins[0], _affine(node, ins)
    return _with_affine(
        node, b.group_norm_backward_input(ct, x, op.num_groups, gamma, op.eps),
        lambda: b.group_norm_backward_gamma(ct, x, op.num_groups, op.eps),
        lambda: b.group_norm_backward_beta(ct, op.num_groups))


@vjp_rule(BatchNorm)
def batch_norm_vjp(b, node, ins, outs, cts):
    """y = (x - mean) * s + beta with s = gamma * rsqrt(var + eps), per channel (axis 1)."""
    ct = cts[0]
    if ct is None:
        return [None] * 5
    x, gamma, _, mean, var = ins
    rank = b.shape_of(x).rank
    c = b.shape_of(x).dims[1]
    col = (c,) + (1,) * (rank - 2)
    others = (0,) + tuple(range(2, rank))
    r = b.rsqrt(b.add(var, node.op.eps))
    s = b.mul(gamma, r)
    centered = b.sub(x, b.reshape(mean, col))
    dy_sum = b.sum(ct, others)
    dy_centered = b.sum(b.mul(ct, centered), others)
    dx = b.mul(ct, b.reshape(s, col))
    dgamma = b.mul(dy_centered, r)
    dmean = b.neg(b.mul(dy_sum, s))
    dvar = b.mul(b.mul(dy_centered, s), b.mul(b.mul(r, r), -0.5))
    return [dx, dgamma, dy_sum, dmean, dvar]


jvp_rule(LayerNorm, RmsNorm, GroupNorm, BatchNorm)(jvp_through_decomposition)
