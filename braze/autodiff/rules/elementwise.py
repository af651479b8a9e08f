"""VJP and JVP rules of the elementwise ops: one rule per op class, dispatching on `op.fn`.

Each function's derivative is written once (`_unary_derivative`, `_binary_partials`) and used by
both modes: the VJP multiplies the cotangent by it (then sums broadcast axes away), the JVP
multiplies the tangent. Derivatives are built from differentiable ops, so gradient graphs can be
differentiated again. Piecewise-constant functions (floor, ceil, round, sign) have zero gradient;
bool and integer values carry none."""
from __future__ import annotations

import math

import numpy as np

from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.op import Value
from ...ir.ops.elementwise import (
    Binary,
    BinaryFn,
    Cast,
    Clamp,
    Compare,
    IsInf,
    IsNan,
    LeakyRelu,
    StopGradient,
    Unary,
    UnaryFn,
    Where,
)
from ...ir.ops.io import Constant
from ..emit import add_optional, is_float, scalar
from ..registry import jvp_rule, non_differentiable, unbroadcast, vjp_rule

_ZERO_GRADIENT = frozenset({UnaryFn.FLOOR, UnaryFn.CEIL, UnaryFn.ROUND, UnaryFn.SIGN,
                            UnaryFn.NOT})
_GELU_TANH_C = math.sqrt(2.0 / math.pi)
_GELU_TANH_K = 0.044715


def _unary_derivative(b: Graph, fn: UnaryFn, x: Value, y: Value) -> Value:
    """d fn(x) / dx, given x and y = fn(x)."""
    c = lambda v: scalar(b, v, x)  # noqa: E731
    if fn is UnaryFn.GELU:  # Phi(x) + x * phi(x)
        cdf = b.mul(c(0.5), b.add(c(1.0), b.erf(b.mul(x, c(1 / math.sqrt(2.0))))))
        pdf = b.mul(c(1 / math.sqrt(2 * math.pi)), b.exp(b.mul(c(-0.5), b.square(x))))
        return b.add(cdf, b.mul(x, pdf))
    if fn is UnaryFn.GELU_APPROX:  # 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3k x^2)
        inner = b.mul(c(_GELU_TANH_C), b.add(x, b.mul(c(_GELU_TANH_K), b.mul(x, b.square(x)))))
        t = b.tanh(inner)
        du = b.mul(c(_GELU_TANH_C), b.add(c(1.0), b.mul(c(3 * _GELU_TANH_K), b.square(x))))
        left = b.mul(c(0.5), b.add(c(1.0), t))
        right = b.mul(b.mul(c(0.5), x), b.mul(b.sub(c(1.0), b.square(t)), du))
        return b.add(left, right)
    if fn is UnaryFn.SILU:  # s (1 + x (1 - s))
        s = b.sigmoid(x)
        return b.mul(s, b.add(c(1.0), b.mul(x, b.sub(c(1.0), s))))
    if fn is UnaryFn.QUICK_GELU:  # s + 1.702 x s (1 - s), s = sigmoid(1.702 x)
        s = b.sigmoid(b.mul(x, c(1.702)))
        return b.add(s, b.mul(b.mul(c(1.702), x), b.mul(s, b.sub(c(1.0), s))))
    if fn is UnaryFn.HARD_SWISH:  # 0 below -3, 1 above 3, (2x + 3) / 6 between
        mid = b.div(b.add(b.mul(c(2.0), x), c(3.0)), c(6.0))
        return b.where(b.lt(x, c(-3.0)), c(0.0), b.where(b.gt(x, c(3.0)), c(1.0), mid))
    if fn is UnaryFn.RELU:
        return b.where(b.gt(x, c(0.0)), c(1.0), c(0.0))
    if fn is UnaryFn.RELU6:  # 1 on [0, 6], as the clamp(x, 0, 6) it fuses passes gradients
        return b.where(b.logical_and(b.ge(x, c(0.0)), b.le(x, c(6.0))), c(1.0), c(0.0))
    if fn is UnaryFn.SIGMOID:
        return b.mul(y, b.sub(c(1.0), y))
    if fn is UnaryFn.TANH:
        return b.sub(c(1.0), b.square(y))
    if fn is UnaryFn.EXP:
        return y
    if fn is UnaryFn.LOG:
        return b.reciprocal(x)
    if fn is UnaryFn.SQRT:
        return b.div(c(0.5), y)
    if fn is UnaryFn.RSQRT:  # -0.5 x^-1.5 = -0.5 y / x
        return b.mul(c(-0.5), b.div(y, x))
    if fn is UnaryFn.NEG:
        return c(-1.0)
    if fn is UnaryFn.ABS:
        return b.sign(x)
    if fn is UnaryFn.SIN:
        return b.cos(x)
    if fn is UnaryFn.COS:
        return b.neg(b.sin(x))
    if fn is UnaryFn.ERF:
        return b.mul(c(2 / math.sqrt(math.pi)), b.exp(b.neg(b.square(x))))
    if fn is UnaryFn.SQUARE:
        return b.mul(c(2.0), x)
    if fn is UnaryFn.RECIPROCAL:
        return b.neg(b.square(y))
    return _inverse_or_hyperbolic_derivative(b, fn, x, y, c)


def _inverse_or_hyperbolic_derivative(b: Graph, fn: UnaryFn, x: Value, y: Value, c) -> Value:
    """d fn(x) / dx for tan, the inverse trigonometric and the hyperbolic functions."""
    if fn is UnaryFn.TAN:
        return b.add(c(1.0), b.square(y))
    if fn in (UnaryFn.ASIN, UnaryFn.ACOS):
        d = b.rsqrt(b.sub(c(1.0), b.square(x)))
        return d if fn is UnaryFn.ASIN else b.neg(d)
    if fn is UnaryFn.ATAN:
        return b.reciprocal(b.add(c(1.0), b.square(x)))
    if fn is UnaryFn.SINH:
        return b.cosh(x)
    if fn is UnaryFn.COSH:
        return b.sinh(x)
    if fn is UnaryFn.ASINH:
        return b.rsqrt(b.add(b.square(x), c(1.0)))
    if fn is UnaryFn.ACOSH:
        return b.rsqrt(b.sub(b.square(x), c(1.0)))
    if fn is UnaryFn.ATANH:
        return b.reciprocal(b.sub(c(1.0), b.square(x)))
    raise NotImplementedError(f"no derivative for unary {fn.value}")


def _times(b: Graph, v: Value, d: Value, fn: UnaryFn) -> Value:
    return b.neg(v) if fn is UnaryFn.NEG else b.mul(v, d)


@vjp_rule(Unary)
def unary_vjp(b, node, ins, outs, cts):
    (ct,) = cts
    fn = node.op.fn
    if ct is None or fn in _ZERO_GRADIENT or not is_float(node.outputs[0]):
        return [None]
    return [_times(b, ct, _unary_derivative(b, fn, ins[0], outs[0]), fn)]


@jvp_rule(Unary)
def unary_jvp(b, node, ins, outs, tangents):
    (t,) = tangents
    fn = node.op.fn
    if t is None or fn in _ZERO_GRADIENT or not is_float(node.outputs[0]):
        return [None]
    return [_times(b, t, _unary_derivative(b, fn, ins[0], outs[0]), fn)]


def _is_constant(b: Graph, v: Value) -> bool:
    return isinstance(b.node(v).op, Constant)


def _binary_partials(b: Graph, node: Node, a: Value, c: Value, y: Value
                     ) -> tuple[Value | None, Value | None]:
    """(d y / d a, d y / d c) for y = fn(a, c), broadcasting like the op (None = zero;
    the scalar 1 stands for an identity partial)."""
    fn = node.op.fn
    one = lambda: scalar(b, 1.0, y)  # noqa: E731
    if fn is BinaryFn.ADD:
        return one(), one()
    if fn is BinaryFn.SUB:
        return one(), scalar(b, -1.0, y)
    if fn is BinaryFn.MUL:
        return c, a
    if fn is BinaryFn.DIV:
        inv = b.reciprocal(c)
        return inv, b.neg(b.mul(y, inv))
    if fn in (BinaryFn.MAX, BinaryFn.MIN):  # a tie shares the cotangent evenly (torch, JAX)
        a_wins = b.gt(a, c) if fn is BinaryFn.MAX else b.lt(a, c)
        tie = b.where(b.eq(a, c), scalar(b, 0.5, y), scalar(b, 0.0, y))
        share_a = b.where(a_wins, one(), tie)
        return share_a, b.sub(one(), share_a)
    if fn is BinaryFn.POW:
        return _pow_partials(b, a, c, y)
    if fn is BinaryFn.MOD:  # a - c * floor(a / c)
        return one(), b.neg(b.floor(b.div(a, c)))
    if fn is BinaryFn.FMOD:  # a - c * trunc(a / c)
        q = b.div(a, c)
        trunc = b.where(b.ge(q, scalar(b, 0.0, y)), b.floor(q), b.ceil(q))
        return one(), b.neg(trunc)
    return None, None  # logical ops: bool


def _pow_partials(b: Graph, a: Value, c: Value, y: Value) -> tuple[Value, Value | None]:
    """(c a^(c-1), a^c log a) with torch's values where those are 0 * inf: d/da is 0 where
    c == 0, d/dc is 0 where a == 0 and c >= 0. The masked entries read a safe base (1), so
    the gradient graph has no NaN there to leak into higher orders."""
    zero, one = scalar(b, 0.0, y), scalar(b, 1.0, y)
    constant_c = _is_constant(b, c)
    if constant_c and not np.any(np.asarray(b.node(c).op.value) == 0):
        da = b.mul(c, b.pow(a, b.sub(c, one)))
    else:
        c_zero = b.eq(c, zero)
        da = b.where(c_zero, zero, b.mul(c, b.pow(b.where(c_zero, one, a), b.sub(c, one))))
    if constant_c:
        return da, None
    log_zero = b.logical_and(b.eq(a, zero), b.ge(c, zero))
    dc = b.where(log_zero, zero, b.mul(y, b.log(b.where(log_zero, one, a))))
    return da, dc


def _is_one(b: Graph, v: Value) -> bool:
    op = b.node(v).op
    return isinstance(op, Constant) and op.value.shape == () and float(op.value) == 1.0


def _scale(b: Graph, v: Value, d: Value) -> Value:
    return v if _is_one(b, d) else b.mul(v, d)


@vjp_rule(Binary)
def binary_vjp(b, node, ins, outs, cts):
    (ct,) = cts
    if ct is None or not is_float(node.outputs[0]):
        return [None, None]
    partials = _binary_partials(b, node, ins[0], ins[1], outs[0])
    return [None if d is None else unbroadcast(b, _scale(b, ct, d), b.shape_of(x))
            for x, d in zip(ins, partials)]


def _to_output_shape(b: Graph, node: Node, t: Value | None) -> Value | None:
    """Broadcast a tangent up to the node's output dims (a partial may have fewer)."""
    if t is None or b.shape_of(t).dims == node.outputs[0].dims:
        return t
    return b.expand(t, node.outputs[0].dims)


@jvp_rule(Binary)
def binary_jvp(b, node, ins, outs, tangents):
    if all(t is None for t in tangents) or not is_float(node.outputs[0]):
        return [None]
    partials = _binary_partials(b, node, ins[0], ins[1], outs[0])
    total = None
    for t, d in zip(tangents, partials):
        if t is not None and d is not None:
            total = add_optional(b, total, _scale(b, t, d))
    return [_to_output_shape(b, node, total)]


@vjp_rule(Where)
def where_vjp(b, node, ins, outs, cts):
    (ct,) = cts
    cond, a, c = ins
    if ct is None:
        return [None, None, None]
    zero = scalar(b, 0.0, ct)
    da = unbroadcast(b, b.where(cond, ct, zero), b.shape_of(a))
    dc = unbroadcast(b, b.where(cond, zero, ct), b.shape_of(c))
    return [None, da, dc]


@jvp_rule(Where)
def where_jvp(b, node, ins, outs, tangents):
    _, ta, tc = tangents
    if ta is None and tc is None:
        return [None]
    zero = scalar(b, 0.0, outs[0])
    return [_to_output_shape(b, node, b.where(ins[0], zero if ta is None else ta,
                                              zero if tc is None else tc))]


def _cast_back(b: Graph, node: Node, v: Value | None, to) -> Value | None:
    if v is None or not (node.outputs[0].dtype.is_float and to.dtype.is_float):
        return None
    return v if b.shape_of(v).dtype == to.dtype else b.cast(v, to.dtype)


@vjp_rule(Cast)
def cast_vjp(b, node, ins, outs, cts):
    return [_cast_back(b, node, cts[0], b.shape_of(ins[0]))]


@jvp_rule(Cast)
def cast_jvp(b, node, ins, outs, tangents):
    return [_cast_back(b, node, tangents[0], node.outputs[0])]


def _leaky_scale(b: Graph, node: Node, x: Value, v: Value) -> Value:
    """`v` where x > 0, alpha * v elsewhere: alpha at 0, as torch and as relu (alpha 0) has."""
    return b.where(b.gt(x, scalar(b, 0.0, x)), v, b.mul(v, scalar(b, node.op.alpha, x)))


def _clamp_pass(b: Graph, node: Node, x: Value, v: Value) -> Value:
    inside = b.logical_and(b.ge(x, scalar(b, node.op.lo, x)), b.le(x, scalar(b, node.op.hi, x)))
    return b.where(inside, v, scalar(b, 0.0, v))


@vjp_rule(LeakyRelu)
def leaky_relu_vjp(b, node, ins, outs, cts):
    return [None if cts[0] is None else _leaky_scale(b, node, ins[0], cts[0])]


@jvp_rule(LeakyRelu)
def leaky_relu_jvp(b, node, ins, outs, tangents):
    return [None if tangents[0] is None else _leaky_scale(b, node, ins[0], tangents[0])]


@vjp_rule(Clamp)
def clamp_vjp(b, node, ins, outs, cts):
    if cts[0] is None or not is_float(node.outputs[0]):
        return [None]
    return [_clamp_pass(b, node, ins[0], cts[0])]


@jvp_rule(Clamp)
def clamp_jvp(b, node, ins, outs, tangents):
    if tangents[0] is None or not is_float(node.outputs[0]):
        return [None]
    return [_clamp_pass(b, node, ins[0], tangents[0])]


@vjp_rule(StopGradient)
def stop_gradient_vjp(b, node, ins, outs, cts):
    return [None]  # the input gets no cotangent: the gradient stops here


@jvp_rule(StopGradient)
def stop_gradient_jvp(b, node, ins, outs, tangents):
    return [None]  # a zero tangent


non_differentiable(Compare, "a comparison gives bool: piecewise constant, no gradient")
non_differentiable(IsNan, "isnan gives bool: no gradient")
non_differentiable(IsInf, "isinf gives bool: no gradient")
