"""Elementwise ATen ops: arithmetic with torch's type promotion (operands are cast to the dtype
torch.export recorded for the result), math and activation functions (gelu none/tanh, silu,
hardswish, ...), comparisons, logic, where / masked_fill, clamp, casts and the ops that vanish
in inference (clone, alias, dropout, metadata asserts)."""
from __future__ import annotations

import math

import numpy as np

from ....ir.dtypes import bool_
from ....ir.ops.elementwise import BinaryFn, CompareFn, UnaryFn
from ....ir.symbolic import SymDim
from ..context import Call, TorchContext, converter
from ..dtypes import braze_dtype, torch_dtype


def promoted(ctx: TorchContext, a, b):
    """The dtype torch computes `a op b` in (its type promotion: tensors of rank 0 and Python
    scalars only lift the category)."""
    import torch

    def rep(x):
        if ctx.is_tensor(x):
            return torch.empty((1,) if ctx.rank(x) else (), dtype=torch_dtype(ctx.dtype(x)))
        return 0 if isinstance(x, SymDim) else x

    return braze_dtype(torch.result_type(rep(a), rep(b)), ctx.where())


def binary(ctx: TorchContext, a, b, fn: BinaryFn, dtype=None):
    """`fn(a, b)` computed in `dtype` (default: the node's result dtype)."""
    dt = dtype or ctx.out_dtype()
    return ctx.g.binary(ctx.value(a, dt), ctx.value(b, dt), fn)


def _scaled(ctx, other, alpha):
    if alpha is None or alpha == 1:
        return other
    if ctx.is_tensor(other):
        return binary(ctx, other, alpha, BinaryFn.MUL)
    return other * alpha


@converter("aten.add.Tensor", "aten.add.Scalar")
def add(ctx, c: Call):
    if ctx.out_dtype() == bool_:  # torch's bool + bool is or
        return ctx.g.logical_or(ctx.value(c["self"], bool_), ctx.value(c["other"], bool_))
    return binary(ctx, c["self"], _scaled(ctx, c["other"], c.get("alpha")), BinaryFn.ADD)


@converter("aten.sub.Tensor", "aten.sub.Scalar")
def sub(ctx, c):
    return binary(ctx, c["self"], _scaled(ctx, c["other"], c.get("alpha")), BinaryFn.SUB)


@converter("aten.rsub.Tensor", "aten.rsub.Scalar")
def rsub(ctx, c):
    return binary(ctx, c["other"], _scaled(ctx, c["self"], c.get("alpha")), BinaryFn.SUB)


@converter("aten.mul.Tensor", "aten.mul.Scalar")
def mul(ctx, c):
    if ctx.out_dtype() == bool_:  # torch's bool * bool is and (its logaddexp writes one)
        return ctx.g.logical_and(ctx.value(c["self"], bool_), ctx.value(c["other"], bool_))
    return binary(ctx, c["self"], c["other"], BinaryFn.MUL)


@converter("aten.div.Tensor", "aten.div.Scalar", "aten.true_divide.Tensor")
def div(ctx, c):
    return binary(ctx, c["self"], c["other"], BinaryFn.DIV)


@converter("aten.div.Tensor_mode", "aten.div.Scalar_mode", "aten.floor_divide.default",
           "aten.floor_divide.Scalar")
def div_mode(ctx, c):
    mode = c.args.get("rounding_mode", "floor")
    dt = ctx.out_dtype()
    a, b = ctx.value(c["self"], dt), ctx.value(c["other"], dt)
    g = ctx.g
    if mode is None:
        return g.div(a, b)
    if dt.is_int:
        q = g.div(a, b)  # braze's integer division floors
        if mode == "floor":
            return q
        inexact = g.ne(g.mul(q, b), a)
        return g.where(g.logical_and(g.lt(q, ctx.value(0, dt)), inexact),
                       g.add(q, ctx.value(1, dt)), q)
    q = g.div(a, b)
    if mode == "floor":
        return g.floor(q)
    if mode == "trunc":
        return g.mul(g.sign(q), g.floor(g.abs(q)))
    raise ctx.fail(f"rounding_mode {mode!r} is not one of None, 'floor', 'trunc'")


@converter("aten.remainder.Tensor", "aten.remainder.Scalar", "aten.remainder.Scalar_Tensor")
def remainder(ctx, c):
    return binary(ctx, c["self"], c["other"], BinaryFn.MOD)


@converter("aten.fmod.Tensor", "aten.fmod.Scalar")
def fmod(ctx, c):
    return binary(ctx, c["self"], c["other"], BinaryFn.FMOD)


@converter("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def pow_(ctx, c):
    return binary(ctx, c["self"], c["exponent"], BinaryFn.POW)


@converter("aten.maximum.default")
def maximum(ctx, c):
    return binary(ctx, c["self"], c["other"], BinaryFn.MAX)


@converter("aten.minimum.default")
def minimum(ctx, c):
    return binary(ctx, c["self"], c["other"], BinaryFn.MIN)


@converter("aten.fmax.default")
def fmax(ctx, c):
    return _nan_ignoring(ctx, c, BinaryFn.MAX)


@converter("aten.fmin.default")
def fmin(ctx, c):
    return _nan_ignoring(ctx, c, BinaryFn.MIN)


def _nan_ignoring(ctx, c, fn: BinaryFn):
    """torch.fmax / fmin: as maximum / minimum, but a NaN operand gives the other operand (NaN
    only where both are); braze's max / min propagate a NaN, as torch.maximum / minimum do."""
    dt = ctx.out_dtype()
    a, b = ctx.value(c["self"], dt), ctx.value(c["other"], dt)
    g = ctx.g
    m = g.binary(a, b, fn)
    if not dt.is_float:
        return m
    return g.where(g.isnan(a), b, g.where(g.isnan(b), a, m))


# -- logic ----------------------------------------------------------------------------------------
def _logical(fn: BinaryFn):
    def convert(ctx, c):
        a, b = c["self"], c["other"]
        for x in (a, b):
            if ctx.is_tensor(x) and ctx.dtype(x) != bool_ and c.key.startswith("aten.bitwise"):
                raise ctx.fail(f"bitwise {fn.value} of {ctx.dtype(x)} tensors is not supported "
                               "(braze's and / or / xor are logical, on bool)")
        return ctx.cast(binary(ctx, a, b, fn, bool_), ctx.out_dtype())

    return convert


for _fn in (BinaryFn.AND, BinaryFn.OR, BinaryFn.XOR):
    _n = _fn.value
    converter(f"aten.bitwise_{_n}.Tensor", f"aten.bitwise_{_n}.Scalar",
              f"aten.logical_{_n}.default", f"aten.__{_n}__.Tensor")(_logical(_fn))


@converter("aten.logical_not.default", "aten.bitwise_not.default")
def logical_not(ctx, c):
    x = c["self"]
    if c.key.startswith("aten.bitwise") and ctx.dtype(x) != bool_:
        raise ctx.fail(f"bitwise not of {ctx.dtype(x)} tensors is not supported")
    return ctx.cast(ctx.g.logical_not(ctx.value(x, bool_)), ctx.out_dtype())


def _compare(fn: CompareFn):
    def convert(ctx, c):
        a, b = c["self"], c["other"]
        return ctx.g.compare(*(ctx.value(x, promoted(ctx, a, b)) for x in (a, b)), fn)

    return convert


for _cf in CompareFn:
    converter(f"aten.{_cf.value}.Tensor", f"aten.{_cf.value}.Scalar")(_compare(_cf))


@converter("aten.isnan.default")
def isnan(ctx, c):
    x = ctx.value(c["self"])
    return ctx.g.isnan(x) if ctx.dtype(x).is_float else ctx.g.ne(x, x)


@converter("aten.isinf.default", "aten.isposinf.default", "aten.isneginf.default")
def isinf(ctx, c):
    x = ctx.value(c["self"])
    if not ctx.dtype(x).is_float:
        return ctx.g.ne(x, x)
    pos, neg = {"aten.isposinf.default": (True, False),
                "aten.isneginf.default": (False, True)}.get(c.key, (True, True))
    return ctx.g.isinf(x, pos, neg)


@converter("aten.isfinite.default")
def isfinite(ctx, c):
    x = ctx.value(c["self"])
    if not ctx.dtype(x).is_float:
        return ctx.g.eq(x, x)
    return ctx.g.logical_not(ctx.g.logical_or(ctx.g.isnan(x), ctx.g.isinf(x)))


@converter("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther",
           "aten.where.Scalar")
def where(ctx, c):
    dt = ctx.out_dtype()
    return ctx.g.where(ctx.value(c["condition"], bool_), ctx.value(c["self"], dt),
                       ctx.value(c["other"], dt))


@converter("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def masked_fill(ctx, c):
    dt = ctx.out_dtype()
    return ctx.g.where(ctx.value(c["mask"], bool_), ctx.value(c["value"], dt),
                       ctx.value(c["self"], dt))


# -- unary functions ------------------------------------------------------------------------------
_UNARY = {"abs": UnaryFn.ABS, "neg": UnaryFn.NEG, "exp": UnaryFn.EXP, "log": UnaryFn.LOG,
          "sqrt": UnaryFn.SQRT, "rsqrt": UnaryFn.RSQRT, "sin": UnaryFn.SIN, "cos": UnaryFn.COS,
          "tanh": UnaryFn.TANH, "sigmoid": UnaryFn.SIGMOID, "relu": UnaryFn.RELU,
          "erf": UnaryFn.ERF, "floor": UnaryFn.FLOOR, "ceil": UnaryFn.CEIL, "round": UnaryFn.ROUND,
          "sign": UnaryFn.SIGN, "reciprocal": UnaryFn.RECIPROCAL, "silu": UnaryFn.SILU,
          "hardswish": UnaryFn.HARD_SWISH, "square": UnaryFn.SQUARE, "tan": UnaryFn.TAN,
          "asin": UnaryFn.ASIN, "acos": UnaryFn.ACOS, "atan": UnaryFn.ATAN, "sinh": UnaryFn.SINH,
          "cosh": UnaryFn.COSH, "asinh": UnaryFn.ASINH, "acosh": UnaryFn.ACOSH,
          "atanh": UnaryFn.ATANH}


def _unary(fn: UnaryFn):
    def convert(ctx, c):
        x = ctx.value(c["self"])
        dt = ctx.out_dtype()
        if fn in (UnaryFn.FLOOR, UnaryFn.CEIL, UnaryFn.ROUND) and ctx.dtype(x).is_int:
            return x  # integers are already whole
        return ctx.g.activation(ctx.cast(x, dt), fn)

    return convert


for _name, _ufn in _UNARY.items():
    converter(f"aten.{_name}.default")(_unary(_ufn))


@converter("aten.round.decimals")
def round_decimals(ctx, c):
    """torch.round(x, decimals=d) as ATen computes it: round(x * 10^d) / 10^d, and for d < 0
    round(x / 10^-d) * 10^-d (half to even), in the input's float type."""
    x = ctx.value(c["self"])
    d = ctx.static_int(c.get("decimals", 0), "round decimals")
    if ctx.dtype(x).is_int:
        raise ctx.fail("round with decimals= needs a float tensor (torch refuses integers)")
    g, dt = ctx.g, ctx.dtype(x)
    ten = ctx.value(float(10 ** abs(d)), dt)
    if d == 0:
        return g.activation(x, UnaryFn.ROUND)
    if d > 0:
        return g.div(g.activation(g.mul(x, ten), UnaryFn.ROUND), ten)
    return g.mul(g.activation(g.div(x, ten), UnaryFn.ROUND), ten)


def _float_in(ctx, c):
    return ctx.value(c["self"], ctx.out_dtype())


@converter("aten.gelu.default")
def gelu(ctx, c):
    approx = c.args.get("approximate", "none")
    if approx not in ("none", "tanh"):
        raise ctx.fail(f"gelu approximate={approx!r} is not 'none' or 'tanh'")
    fn = UnaryFn.GELU if approx == "none" else UnaryFn.GELU_APPROX
    return ctx.g.activation(_float_in(ctx, c), fn)


@converter("aten.log1p.default")
def log1p(ctx, c):
    x = _float_in(ctx, c)
    return ctx.g.log(ctx.g.add(x, ctx.value(1.0, ctx.dtype(x))))


@converter("aten.expm1.default")
def expm1(ctx, c):
    x = _float_in(ctx, c)
    return ctx.g.sub(ctx.g.exp(x), ctx.value(1.0, ctx.dtype(x)))


@converter("aten.log2.default", "aten.log10.default")
def log_base(ctx, c):
    x = _float_in(ctx, c)
    base = 2.0 if c.key == "aten.log2.default" else 10.0
    return ctx.g.div(ctx.g.log(x), ctx.value(math.log(base), ctx.dtype(x)))


@converter("aten.exp2.default")
def exp2(ctx, c):
    x = _float_in(ctx, c)
    return ctx.g.exp(ctx.g.mul(x, ctx.value(math.log(2.0), ctx.dtype(x))))


@converter("aten.trunc.default")
def trunc(ctx, c):
    x = ctx.value(c["self"])
    if ctx.dtype(x).is_int:
        return x
    return ctx.g.mul(ctx.g.sign(x), ctx.g.floor(ctx.g.abs(x)))


@converter("aten.leaky_relu.default")
def leaky_relu(ctx, c):
    return ctx.g.leaky_relu(_float_in(ctx, c), float(c.get("negative_slope", 0.01)))


@converter("aten.hardtanh.default", "aten.relu6.default")
def hardtanh(ctx, c):
    lo, hi = (0.0, 6.0) if c.key == "aten.relu6.default" else (c.get("min_val", -1.0),
                                                              c.get("max_val", 1.0))
    return ctx.g.clamp(ctx.value(c["self"]), float(lo), float(hi))


@converter("aten.hardsigmoid.default")
def hardsigmoid(ctx, c):
    x = _float_in(ctx, c)
    y = ctx.g.add(ctx.g.div(x, ctx.value(6.0, ctx.dtype(x))), ctx.value(0.5, ctx.dtype(x)))
    return ctx.g.clamp(y, 0.0, 1.0)


def _softplus(ctx, x, beta: float, threshold: float):
    g, dt = ctx.g, ctx.dtype(x)
    bx = g.mul(x, ctx.value(float(beta), dt)) if beta != 1 else x
    soft = g.log(g.add(g.exp(bx), ctx.value(1.0, dt)))
    if beta != 1:
        soft = g.div(soft, ctx.value(float(beta), dt))
    return g.where(g.gt(bx, ctx.value(float(threshold), dt)), x, soft)


@converter("aten.softplus.default")
def softplus(ctx, c):
    return _softplus(ctx, _float_in(ctx, c), c.get("beta", 1.0), c.get("threshold", 20.0))


@converter("aten.mish.default")
def mish(ctx, c):
    x = _float_in(ctx, c)
    return ctx.g.mul(x, ctx.g.tanh(_softplus(ctx, x, 1.0, 20.0)))


@converter("aten.elu.default")
def elu(ctx, c):
    x = _float_in(ctx, c)
    g, dt = ctx.g, ctx.dtype(x)
    alpha, scale = float(c.get("alpha", 1.0)), float(c.get("scale", 1.0))
    input_scale = float(c.get("input_scale", 1.0))
    neg = g.mul(g.sub(g.exp(g.mul(x, ctx.value(input_scale, dt))), ctx.value(1.0, dt)),
                ctx.value(alpha * scale, dt))
    return g.where(g.gt(x, ctx.value(0.0, dt)), g.mul(x, ctx.value(scale, dt)), neg)


@converter("aten._prelu_kernel.default")
def prelu(ctx, c):
    x, w = ctx.value(c["self"]), ctx.value(c["weight"])
    g = ctx.g
    return g.where(g.gt(x, ctx.value(0.0, ctx.dtype(x))), x, g.mul(w, x))


@converter("aten.clamp.default", "aten.clamp_min.default", "aten.clamp_max.default")
def clamp(ctx, c):
    """Static bounds become one clamp; a bound that depends on the input sizes (`size - 1`, as
    the decompositions of replicate / reflect pad and linear interpolation write it) becomes a
    maximum / minimum with the size as a run-time scalar."""
    lo = c.args.get("min") if c.key != "aten.clamp_max.default" else None
    hi = c.args.get("max") if c.key != "aten.clamp_min.default" else None
    if isinstance(lo, SymDim) or isinstance(hi, SymDim):
        return _clamp_values(ctx, c["self"], lo, hi)
    dt = ctx.out_dtype()
    x = ctx.value(c["self"], dt)
    lo, hi = (_wrapped_bound(b, dt) for b in (lo, hi))
    lo = -math.inf if lo is None else float(lo)
    hi = math.inf if hi is None else float(hi)
    if lo > hi:  # torch sets every element to max
        lo = hi
    return ctx.g.clamp(x, lo, hi)


def _wrapped_bound(b, dt):
    """A clamp bound as torch reads it for a tensor of `dt`: a negative int bound of an
    unsigned tensor wraps (uint8's clamp(-2, 2) is clamp(254, 2), every element 2)."""
    if isinstance(b, int) and b < 0 and dt.is_int and np.iinfo(dt.np).min == 0:
        return int(np.array(b).astype(dt.np))
    return b


def _clamp_values(ctx, x, lo, hi):
    """min(max(x, lo), hi) in the node's dtype: every element is `hi` when lo > hi, as in torch.
    Float values pick with `where`, so x keeps the whole gradient where it equals a bound (as
    torch.clamp's backward; a maximum would share it with the bound); a NaN bound wins, as in
    torch."""
    dt = ctx.out_dtype()
    g = ctx.g
    y = ctx.value(x, dt)
    for bound, beyond, extreme in ((lo, g.lt, g.maximum), (hi, g.gt, g.minimum)):
        if bound is None:
            continue
        v = ctx.value(bound, dt)
        if dt.is_float:
            y = g.where(g.logical_or(beyond(y, v), g.isnan(v)), v, y)
        else:
            y = extreme(y, v)
    return y


@converter("aten.clamp.Tensor", "aten.clamp_min.Tensor", "aten.clamp_max.Tensor")
def clamp_tensor(ctx, c):
    lo = c.args.get("min") if c.key != "aten.clamp_max.Tensor" else None
    hi = c.args.get("max") if c.key != "aten.clamp_min.Tensor" else None
    return _clamp_values(ctx, c["self"], lo, hi)


# -- casts and ops that vanish ------------------------------------------------------------------
@converter("aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device",
           "aten.to.other", "aten.type_as.default", "aten._to_dim_order_copy.default")
def to_copy(ctx, c):
    return ctx.value(c["self"], ctx.out_dtype())


@converter("aten.detach.default", "aten.detach_copy.default")
def detach(ctx, c):
    """`x.detach()` (and `torch.no_grad()` regions): the value, with no gradient through it.
    braze keeps `aten.detach` out of torch's decompositions (which make it an `alias`)."""
    return ctx.g.stop_gradient(ctx.value(c["self"]))


@converter("aten.clone.default", "aten.alias.default", "aten.contiguous.default",
           "aten.lift_fresh_copy.default", "aten.lift_fresh.default", "aten.alias_copy.default",
           "aten.dropout.default", "aten.feature_dropout.default", "aten.alpha_dropout.default")
def identity(ctx, c):
    if c.args.get("train"):
        raise ctx.fail("dropout in training mode is random; call module.eval() before importing")
    return ctx.value(c.args.get("self", c.args.get("input")))


@converter("aten.native_dropout.default")
def native_dropout(ctx, c):
    if c.args.get("train"):
        raise ctx.fail("dropout in training mode is random; call module.eval() before importing")
    x = ctx.value(c["input"])
    return (x, ctx.g.expand(ctx.value(True), ctx.dims(x)))


RUNTIME_CHECKS = ("aten._assert_tensor_metadata.default", "aten._assert_scalar.default",
                  "aten.sym_constrain_range_for_size.default", "aten.sym_constrain_range.default",
                  "aten._assert_async.msg", "aten._assert_async.default")


@converter(*RUNTIME_CHECKS)
def no_output(ctx, c):
    return None
