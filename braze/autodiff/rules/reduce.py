"""VJP and JVP rules of the reductions (sum, mean, max, min, prod), softmax, log_softmax and
cumsum; argmax has no gradient. Softmax and log_softmax are composite but get closed-form rules:
shorter gradient graphs than differentiating their max-subtracting decompositions."""
from __future__ import annotations

from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.op import Value
from ...ir.ops.reduce import ArgMax, Cumsum, LogSoftmax, Reduce, ReduceFn, Softmax
from ..emit import count_of, keep_reduced_axes, scalar
from ..registry import jvp_rule, non_differentiable, vjp_rule


def _kept(b: Graph, node: Node, v: Value) -> Value:
    """A reduction result `v` with the reduced axes back as size 1."""
    op = node.op
    if op.keepdims:
        return v
    return keep_reduced_axes(b, v, op.axes, node.outputs[0].rank + len(op.axes))


def _reduced_count(b: Graph, x: Value, axes) -> Value:
    dims = b.shape_of(x).dims
    return count_of(b, [dims[a] for a in axes], x)


def _prod_partials(b: Graph, node: Node, x: Value, out_k: Value) -> Value:
    """d prod / d x_i = the product of the other elements of x_i's slice, written so a zero
    gives no 0 / 0: out / x_i where the slice has no zero; the product of the nonzero elements
    at the slice's only zero; 0 everywhere else (slices with two or more zeros, and the
    nonzero elements of a slice with a zero)."""
    axes = node.op.axes
    zero, one = scalar(b, 0.0, x), scalar(b, 1.0, x)
    is_zero = b.eq(x, zero)
    safe = b.where(is_zero, one, x)
    n_zero = b.sum(b.cast(is_zero, b.shape_of(x).dtype), axes, keepdims=True)
    nonzero_prod = b.prod(safe, axes, keepdims=True)
    at_zero = b.where(b.eq(n_zero, one), nonzero_prod, zero)
    return b.where(is_zero, at_zero, b.div(out_k, safe))


@vjp_rule(Reduce)
def reduce_vjp(b, node, ins, outs, cts):
    (ct,) = cts
    (x,) = ins
    if ct is None or not node.outputs[0].dtype.is_float:
        return [None]
    fn = node.op.fn
    x_dims = b.shape_of(x).dims
    ct_k = _kept(b, node, ct)
    if fn is ReduceFn.SUM:
        return [b.expand(ct_k, x_dims)]
    if fn is ReduceFn.MEAN:
        return [b.expand(b.div(ct_k, _reduced_count(b, x, node.op.axes)), x_dims)]
    out_k = _kept(b, node, outs[0])
    if fn is ReduceFn.PROD:  # d prod / d x_i = the product of the others (zeros included)
        return [b.mul(ct_k, _prod_partials(b, node, x, out_k))]
    # max / min: the cotangent is shared evenly by the elements that attain the extreme
    hit = b.cast(b.eq(x, out_k), b.shape_of(x).dtype)
    ties = b.sum(hit, node.op.axes, keepdims=True)
    return [b.mul(hit, b.div(ct_k, ties))]


@jvp_rule(Reduce)
def reduce_jvp(b, node, ins, outs, tangents):
    (t,) = tangents
    (x,) = ins
    if t is None or not node.outputs[0].dtype.is_float:
        return [None]
    op = node.op
    fn = op.fn
    if fn in (ReduceFn.SUM, ReduceFn.MEAN):
        return [b.add_node(op, (t,))[0]]
    out_k = _kept(b, node, outs[0])
    if fn is ReduceFn.PROD:
        return [b.sum(b.mul(t, _prod_partials(b, node, x, out_k)), op.axes, op.keepdims)]
    hit = b.cast(b.eq(x, out_k), b.shape_of(x).dtype)
    ties = b.sum(hit, op.axes, op.keepdims)
    return [b.div(b.sum(b.mul(hit, t), op.axes, op.keepdims), ties)]


@vjp_rule(Softmax)
def softmax_vjp(b, node, ins, outs, cts):
    (ct,) = cts
    if ct is None:
        return [None]
    y = outs[0]
    inner = b.sum(b.mul(ct, y), node.op.axis, keepdims=True)
    return [b.mul(y, b.sub(ct, inner))]


@jvp_rule(Softmax)
def softmax_jvp(b, node, ins, outs, tangents):
    (t,) = tangents
    if t is None:
        return [None]
    y = outs[0]
    inner = b.sum(b.mul(t, y), node.op.axis, keepdims=True)
    return [b.mul(y, b.sub(t, inner))]


@vjp_rule(LogSoftmax)
def log_softmax_vjp(b, node, ins, outs, cts):
    (ct,) = cts
    if ct is None:
        return [None]
    total = b.sum(ct, node.op.axis, keepdims=True)
    return [b.sub(ct, b.mul(b.exp(outs[0]), total))]


@jvp_rule(LogSoftmax)
def log_softmax_jvp(b, node, ins, outs, tangents):
    (t,) = tangents
    if t is None:
        return [None]
    inner = b.sum(b.mul(b.exp(outs[0]), t), node.op.axis, keepdims=True)
    return [b.sub(t, inner)]


@vjp_rule(Cumsum)
def cumsum_vjp(b, node, ins, outs, cts):
    if cts[0] is None or not node.outputs[0].dtype.is_float:
        return [None]
    op = node.op
    return [b.cumsum(cts[0], op.axis, exclusive=op.exclusive, reverse=not op.reverse)]


@jvp_rule(Cumsum)
def cumsum_jvp(b, node, ins, outs, tangents):
    if tangents[0] is None or not node.outputs[0].dtype.is_float:
        return [None]
    return [b.add_node(node.op, (tangents[0],))[0]]


non_differentiable(ArgMax, "argmax gives i64 indices: piecewise constant, no gradient")
