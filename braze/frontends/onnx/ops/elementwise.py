"""ONNX elementwise ops: arithmetic (numpy broadcasting), math and activation functions,
comparisons and logic, Where, Cast, Clip, and activations braze writes in primitives
(HardSigmoid, HardSwish, Softplus, Elu, Selu, PRelu, Mish). Operands of mixed dtypes that ONNX
allows (Pow's exponent) are cast to the base's dtype."""
from __future__ import annotations

import numpy as np

from ....ir.dtypes import bool_
from ....ir.op import Value
from ....ir.ops.elementwise import BinaryFn, CompareFn, UnaryFn
from ..context import ImportContext, NodeView, converter
from ..dtypes import onnx_dtype

_BINARY = {"Add": BinaryFn.ADD, "Sub": BinaryFn.SUB, "Mul": BinaryFn.MUL, "Div": BinaryFn.DIV,
           "Pow": BinaryFn.POW, "And": BinaryFn.AND, "Or": BinaryFn.OR, "Xor": BinaryFn.XOR}
_UNARY = {"Relu": UnaryFn.RELU, "Sigmoid": UnaryFn.SIGMOID, "Tanh": UnaryFn.TANH,
          "Exp": UnaryFn.EXP, "Log": UnaryFn.LOG, "Sqrt": UnaryFn.SQRT, "Neg": UnaryFn.NEG,
          "Abs": UnaryFn.ABS, "Sin": UnaryFn.SIN, "Cos": UnaryFn.COS, "Erf": UnaryFn.ERF,
          "Reciprocal": UnaryFn.RECIPROCAL, "Floor": UnaryFn.FLOOR, "Ceil": UnaryFn.CEIL,
          "Sign": UnaryFn.SIGN, "Not": UnaryFn.NOT, "Round": UnaryFn.ROUND,
          "Tan": UnaryFn.TAN, "Asin": UnaryFn.ASIN, "Acos": UnaryFn.ACOS, "Atan": UnaryFn.ATAN,
          "Sinh": UnaryFn.SINH, "Cosh": UnaryFn.COSH, "Asinh": UnaryFn.ASINH,
          "Acosh": UnaryFn.ACOSH, "Atanh": UnaryFn.ATANH}
_COMPARE = {"Equal": CompareFn.EQ, "Less": CompareFn.LT, "Greater": CompareFn.GT,
            "LessOrEqual": CompareFn.LE, "GreaterOrEqual": CompareFn.GE}


@converter(*_BINARY)
def binary(ctx: ImportContext, node: NodeView):
    a, b = ctx.value(node, 0), ctx.value(node, 1)
    if ctx.dtype(b) != ctx.dtype(a):
        if node.op_type != "Pow":
            raise ctx.fail(node, f"operands have different dtypes ({ctx.dtype(a)}, "
                                 f"{ctx.dtype(b)})")
        b = ctx.g.cast(b, ctx.dtype(a))
    fn = _BINARY[node.op_type]
    if fn is BinaryFn.DIV and ctx.dtype(a).is_int:
        return [_int_div_truncating(ctx, a, b)]
    return [ctx.g.binary(a, b, fn)]


def _int_div_truncating(ctx, a, b):
    """ONNX integer Div truncates toward zero; braze's integer div floors: fix the sign case."""
    g = ctx.g
    q = g.div(a, b)
    zero = ctx.const_like(0, a)
    inexact = g.ne(g.mul(q, b), a)
    neg = g.logical_xor(g.lt(a, zero), g.lt(b, zero))
    return g.where(g.logical_and(inexact, neg), g.add(q, ctx.const_like(1, a)), q)


@converter("Mod")
def mod(ctx, node):
    a, b = ctx.value(node, 0), ctx.value(node, 1)
    fmod = node.attr("fmod", 0)
    return [ctx.g.fmod(a, b) if fmod else ctx.g.mod(a, b)]


@converter(*_UNARY)
def unary(ctx, node):
    return [ctx.g.activation(ctx.value(node, 0), _UNARY[node.op_type])]


@converter("Gelu")
def gelu(ctx, node):
    approx = node.attr("approximate", "none")
    fn = {"none": UnaryFn.GELU, "tanh": UnaryFn.GELU_APPROX}.get(approx)
    if fn is None:
        raise ctx.fail(node, f"unknown Gelu approximate={approx!r} (none or tanh)")
    return [ctx.g.activation(ctx.value(node, 0), fn)]


@converter("LeakyRelu")
def leaky_relu(ctx, node):
    return [ctx.g.leaky_relu(ctx.value(node, 0), node.attr("alpha", 0.01))]


@converter("HardSigmoid")
def hard_sigmoid(ctx, node):
    x = ctx.value(node, 0)
    return [hard_sigmoid_of(ctx.g, x, node.attr("alpha", 0.2), node.attr("beta", 0.5))]


def hard_sigmoid_of(g, x, alpha: float, beta: float):
    """clamp(alpha * x + beta, 0, 1)."""
    return g.clamp(g.add(g.mul(x, float(alpha)), float(beta)), 0.0, 1.0)


@converter("HardSwish")
def hard_swish(ctx, node):
    x = ctx.value(node, 0)
    return [ctx.g.mul(x, hard_sigmoid_of(ctx.g, x, 1.0 / 6.0, 0.5))]


@converter("Softplus")
def softplus(ctx, node):
    return [softplus_of(ctx.g, ctx.value(node, 0))]


def softplus_of(g, x):
    """log(1 + exp(x)) as max(x, 0) + log(1 + exp(-|x|)): no overflow for large x."""
    tail = g.log(g.add(g.exp(g.neg(g.abs(x))), 1.0))
    return g.add(g.relu(x), tail)


def elu_of(g, x, alpha: float):
    """x where x > 0, else alpha * (exp(x) - 1); exp reads min(x, 0), so it never overflows."""
    neg = g.mul(g.sub(g.exp(g.minimum(x, 0.0)), 1.0), float(alpha))
    return g.where(g.gt(x, 0.0), x, neg)


@converter("Elu")
def elu(ctx, node):
    return [elu_of(ctx.g, ctx.value(node, 0), float(node.attr("alpha", 1.0)))]


@converter("Selu")
def selu(ctx, node):
    x = ctx.value(node, 0)
    alpha = float(node.attr("alpha", 1.67326319217681884765625))
    gamma = float(node.attr("gamma", 1.05070102214813232421875))
    return [ctx.g.mul(elu_of(ctx.g, x, alpha), ctx.const_like(gamma, x))]


@converter("Mish")
def mish(ctx, node):
    g, x = ctx.g, ctx.value(node, 0)
    return [g.mul(x, g.tanh(softplus_of(ctx.g, x)))]


@converter("PRelu")
def prelu(ctx, node):
    """x where x >= 0, else slope * x. The slope broadcasts to x unidirectionally (NumPy rules,
    aligned at the trailing axis, never growing x): a per-channel slope of an [N, C, H, W]
    input is [C, 1, 1]."""
    g = ctx.g
    x, slope = ctx.value(node, 0), ctx.value(node, 1)
    xd, sd = ctx.dims(x), ctx.dims(slope)
    fits = len(sd) <= len(xd) and all(
        s == 1 or str(s) == str(d) for s, d in zip(reversed(sd), reversed(xd)))
    if not fits:
        hint = ""
        if len(sd) == 1 and len(xd) > 2 and sd[0] == xd[1]:
            hint = (f"; a per-channel slope must be stored as [{sd[0]}"
                    f"{', 1' * (len(xd) - 2)}] (ONNX aligns shapes at the trailing axis)")
        raise ctx.fail(node, f"slope of shape {tuple(sd)} does not broadcast to the input's "
                             f"shape {tuple(xd)} (unidirectional broadcasting){hint}")
    if ctx.dtype(slope) != ctx.dtype(x):
        raise ctx.fail(node, f"slope is {ctx.dtype(slope)} but the input is {ctx.dtype(x)}")
    zero = ctx.const_like(0, x)
    return [g.where(g.lt(x, zero), g.mul(x, slope), x)]


@converter("Clip")
def clip(ctx, node):
    """min(max(x, lo), hi): bounds known at import time become a clamp; bounds computed at run
    time (scalar tensors) become maximum / minimum nodes."""
    x = ctx.value(node, 0)
    lo, hi = (_clip_bound(ctx, node, i, what) for i, what in ((1, "min"), (2, "max")))
    static = not any(isinstance(b, Value) for b in (lo, hi))
    if static and lo is not None and hi is not None and ctx.dtype(x).is_float and lo <= hi:
        return [ctx.g.clamp(x, float(lo), float(hi))]
    # (min > max: ONNX's min(max(x, lo), hi) sets every element to max, as below)
    y = x
    if lo is not None:
        y = ctx.g.maximum(y, lo if isinstance(lo, Value) else ctx.const_like(lo, x))
    if hi is not None:
        y = ctx.g.minimum(y, hi if isinstance(hi, Value) else ctx.const_like(hi, x))
    return [y]


def _clip_bound(ctx, node, i: int, what: str):
    """Clip bound `i`: None (absent), a Python number (known) or a scalar braze value."""
    if not ctx.has(node, i):
        return None
    k = ctx.known(node, i)
    if k is not None and not k.symbolic:
        if k.array.size != 1:
            raise ctx.fail(node, f"Clip {what} must be a scalar, got shape {k.array.shape}")
        return k.array.reshape(-1)[0].item()
    v = ctx.value(node, i)
    dims, x = ctx.dims(v), ctx.value(node, 0)
    if len(dims) > 1 or (dims and dims[0] != 1):
        raise ctx.fail(node, f"Clip {what} must be a scalar, got shape {tuple(dims)}")
    if ctx.dtype(v) != ctx.dtype(x):
        raise ctx.fail(node, f"Clip {what} is {ctx.dtype(v)} but the input is {ctx.dtype(x)}")
    return ctx.g.reshape(v, ()) if dims else v


@converter("Max", "Min", "Sum", "Mean")
def variadic(ctx, node):
    fn = {"Max": BinaryFn.MAX, "Min": BinaryFn.MIN, "Sum": BinaryFn.ADD,
          "Mean": BinaryFn.ADD}[node.op_type]
    vals = [ctx.value(node, i) for i in range(len(node.inputs)) if ctx.has(node, i)]
    y = vals[0]
    for v in vals[1:]:
        y = ctx.g.binary(y, v, fn)
    if node.op_type == "Mean" and len(vals) > 1:
        y = ctx.g.div(y, ctx.const_like(len(vals), y))
    return [y]


@converter(*_COMPARE)
def compare(ctx, node):
    a, b = ctx.value(node, 0), ctx.value(node, 1)
    return [ctx.g.compare(a, b, _COMPARE[node.op_type])]


@converter("IsNaN")
def isnan(ctx, node):
    return [ctx.g.isnan(ctx.value(node, 0))]


@converter("IsInf")
def isinf(ctx, node):
    return [ctx.g.isinf(ctx.value(node, 0), bool(node.attr("detect_positive", 1)),
                        bool(node.attr("detect_negative", 1)))]


@converter("Where")
def where(ctx, node):
    return [ctx.g.where(ctx.value(node, 0), ctx.value(node, 1), ctx.value(node, 2))]


@converter("Cast")
def cast(ctx, node):
    x = ctx.value(node, 0)
    to = onnx_dtype(node.attr("to"), f"{ctx.source}: node {node.label} target type")
    return [x if ctx.dtype(x) == to else ctx.g.cast(x, to)]


@converter("CastLike")
def cast_like(ctx, node):
    x, to = ctx.value(node, 0), ctx.dtype(ctx.value(node, 1))
    return [x if ctx.dtype(x) == to else ctx.g.cast(x, to)]


@converter("Identity")
def identity(ctx, node):
    t = ctx.tensor(node, 0)
    return [t.known if t.value is None and t.known is not None else ctx.value(node, 0)]


@converter("Dropout")
def dropout(ctx, node):
    if ctx.has(node, 2) and ctx.known(node, 2) is not None and bool(ctx.scalar(node, 2, "mode")):
        raise ctx.fail(node, "Dropout in training mode is not supported; export the model in "
                             "eval mode")
    if ctx.has(node, 2) and ctx.known(node, 2) is None:
        raise ctx.fail(node, "Dropout's training_mode is computed at run time; export in eval "
                             "mode")
    x = ctx.value(node, 0)
    if len(node.outputs) < 2 or not node.outputs[1]:
        return [x]
    # inference mode keeps every element: the mask is all true
    keep = ctx.g.constant(np.ones((), np.bool_), bool_)
    return [x, ctx.g.expand(keep, ctx.dims(x)) if ctx.dims(x) else keep]
