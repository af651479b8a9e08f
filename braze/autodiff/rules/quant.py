"""Autodiff of the quantization ops. Quantize gives integers: no gradient. Dequantize is linear
in its scale (`(q - zero_point) * scale`), so the scale gets a gradient and its JVP is a
dequantize of the scale's tangent. FakeQuantize is straight-through: the cotangent passes where
`round(x / scale) + zero_point` lies in the quantized dtype's range and is 0 outside it, as
torch's fake_quantize_per_tensor_affine / per_channel_affine; scale and zero point get none."""
from __future__ import annotations

from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.op import Value
from ...ir.ops.quant import Dequantize, FakeQuantize, Quantize, quant_range
from ..emit import ones, scalar
from ..registry import jvp_rule, non_differentiable, vjp_rule

non_differentiable(Quantize, "quantize gives integers: piecewise constant, no gradient (use "
                             "fake_quantize for quantization-aware training)")


def _along(b: Graph, p: Value, axis: int | None, rank: int) -> Value:
    """A per-axis parameter reshaped to broadcast along `axis` of a rank-`rank` tensor."""
    if axis is None:
        return p
    n = b.shape_of(p).dims[0]
    return b.reshape(p, tuple(n if a == axis else 1 for a in range(rank)))


@vjp_rule(Dequantize)
def dequantize_vjp(b, node, ins, outs, cts):
    q, scale, zp = ins
    if cts[0] is None:
        return [None, None, None]
    axis = node.op.axis
    centered = b.add_node(Dequantize(axis), (q, ones(b, b.shape_of(scale)), zp))[0]
    prod = b.mul(cts[0], centered)
    rank = b.shape_of(prod).rank
    kept = () if axis is None else (axis,)
    summed = tuple(a for a in range(rank) if a not in kept)
    return [None, b.sum(prod, summed) if summed else prod, None]


@jvp_rule(Dequantize)
def dequantize_jvp(b, node, ins, outs, tangents):
    q, _, zp = ins
    t = tangents[1]
    return [None if t is None else b.add_node(Dequantize(node.op.axis), (q, t, zp))[0]]


def _straight_through(b: Graph, node: Node, ins, v: Value) -> Value:
    """`v` where x rounds into the quantized range, 0 elsewhere."""
    x, scale, zp = ins
    axis = node.op.axis
    rank = b.shape_of(x).rank
    dtype = b.shape_of(x).dtype
    lo, hi = quant_range(b.shape_of(zp).dtype)
    level = b.add(b.activation(b.div(x, _along(b, scale, axis, rank)), "round"),
                  _along(b, b.cast(zp, dtype), axis, rank))
    inside = b.logical_and(b.ge(level, scalar(b, lo, x)), b.le(level, scalar(b, hi, x)))
    return b.where(inside, v, scalar(b, 0.0, v))


@vjp_rule(FakeQuantize)
def fake_quantize_vjp(b, node, ins, outs, cts):
    if cts[0] is None:
        return [None, None, None]
    return [_straight_through(b, node, ins, cts[0]), None, None]


@jvp_rule(FakeQuantize)
def fake_quantize_jvp(b, node, ins, outs, tangents):
    t = tangents[0]
    return [None if t is None else _straight_through(b, node, ins, t)]
