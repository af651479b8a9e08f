"""Elementwise ops: unary functions (activations and math), binary arithmetic and logic,
comparisons, the float tests isnan / isinf, where, cast, the parameterized activations
leaky_relu and clamp, and stop_gradient (an identity that autodiff treats as a constant)."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from ...errors import GraphError
from ..dtypes import DType, bool_
from ..op import Op, require, same_dtype
from ..shapes import Shape, broadcast_shapes
from ._erf import erf
from .float_to_int import float_to_int

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _sigmoid(x):
    with np.errstate(over="ignore"):  # exp(-x) overflows to inf below -88: sigmoid is 0
        return 1.0 / (1.0 + np.exp(-x))


def _gelu(x):
    return 0.5 * x * (1.0 + erf(x / x.dtype.type(math.sqrt(2.0))))


def _quick_gelu(x):
    return x * _sigmoid(x * x.dtype.type(1.702))


def _hard_swish(x):
    t = x.dtype.type
    return x * np.clip(x + t(3), t(0), t(6)) / t(6)


def _relu6(x):
    t = x.dtype.type
    return np.clip(x, t(0), t(6))


def _gelu_approx(x):
    c = x.dtype.type(_SQRT_2_OVER_PI)
    return 0.5 * x * (1.0 + np.tanh(c * (x + x.dtype.type(0.044715) * x * x * x)))


class UnaryFn(enum.Enum):
    """Unary functions. `is_activation` marks the ones a matmul epilogue may apply."""

    GELU = "gelu"
    GELU_APPROX = "gelu_approx"
    SILU = "silu"
    RELU = "relu"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    NEG = "neg"
    ABS = "abs"
    SIN = "sin"
    COS = "cos"
    ERF = "erf"
    SQUARE = "square"
    RECIPROCAL = "reciprocal"
    FLOOR = "floor"
    CEIL = "ceil"
    SIGN = "sign"
    NOT = "not"
    ROUND = "round"
    QUICK_GELU = "quick_gelu"
    HARD_SWISH = "hard_swish"
    RELU6 = "relu6"
    TAN = "tan"
    ASIN = "asin"
    ACOS = "acos"
    ATAN = "atan"
    SINH = "sinh"
    COSH = "cosh"
    ASINH = "asinh"
    ACOSH = "acosh"
    ATANH = "atanh"

    @property
    def is_activation(self) -> bool:
        return self in ACTIVATIONS

    def apply(self, x: np.ndarray) -> np.ndarray:
        return _UNARY_IMPL[self](x)


ACTIVATIONS = frozenset(
    {UnaryFn.GELU, UnaryFn.GELU_APPROX, UnaryFn.SILU, UnaryFn.RELU, UnaryFn.SIGMOID, UnaryFn.TANH,
     UnaryFn.QUICK_GELU, UnaryFn.HARD_SWISH, UnaryFn.RELU6}
)

def _maximum(a, b):
    """NumPy's float32 maximum for every dtype: a NaN operand wins (the first if both), and of
    equal operands (+0.0 against -0.0) the second. NumPy's float16 loop keeps the first on
    ties, so float16 takes the explicit rule (float32 / float64 / bfloat16 already follow it)."""
    if np.asarray(a).dtype == np.float16 or np.asarray(b).dtype == np.float16:
        return np.where(np.isnan(a) | (a > b), a, b)
    return np.maximum(a, b)


def _minimum(a, b):
    """np.minimum with `_maximum`'s rule for NaN and ties (the second of equal operands)."""
    if np.asarray(a).dtype == np.float16 or np.asarray(b).dtype == np.float16:
        return np.where(np.isnan(a) | (a < b), a, b)
    return np.minimum(a, b)


_UNARY_IMPL = {
    UnaryFn.GELU: _gelu,
    UnaryFn.GELU_APPROX: _gelu_approx,
    UnaryFn.SILU: lambda x: x * _sigmoid(x),
    UnaryFn.RELU: lambda x: _maximum(x, x.dtype.type(0)),  # relu(-0.0) is +0.0
    UnaryFn.SIGMOID: _sigmoid,
    UnaryFn.TANH: np.tanh,
    UnaryFn.EXP: np.exp,
    UnaryFn.LOG: np.log,
    UnaryFn.SQRT: np.sqrt,
    UnaryFn.RSQRT: lambda x: 1.0 / np.sqrt(x),
    UnaryFn.NEG: np.negative,
    UnaryFn.ABS: np.abs,
    UnaryFn.SIN: np.sin,
    UnaryFn.COS: np.cos,
    UnaryFn.ERF: erf,
    UnaryFn.SQUARE: np.square,
    UnaryFn.RECIPROCAL: lambda x: 1.0 / x,
    UnaryFn.FLOOR: np.floor,
    UnaryFn.CEIL: np.ceil,
    UnaryFn.SIGN: np.sign,
    UnaryFn.NOT: np.logical_not,
    UnaryFn.ROUND: np.round,  # half to even, as ONNX Round
    UnaryFn.QUICK_GELU: _quick_gelu,  # x * sigmoid(1.702 x), CLIP's quick_gelu
    UnaryFn.HARD_SWISH: _hard_swish,  # x * relu6(x + 3) / 6, MobileNetV3 / PP-LCNet
    UnaryFn.RELU6: _relu6,  # clip(x, 0, 6): MobileNet v1 / v2's activation, as a conv epilogue
    UnaryFn.TAN: np.tan,
    UnaryFn.ASIN: np.arcsin,
    UnaryFn.ACOS: np.arccos,
    UnaryFn.ATAN: np.arctan,
    UnaryFn.SINH: np.sinh,
    UnaryFn.COSH: np.cosh,
    UnaryFn.ASINH: np.arcsinh,
    UnaryFn.ACOSH: np.arccosh,
    UnaryFn.ATANH: np.arctanh,
}
# Activations that are compositions of math primitives (`Unary.decompose` writes them out).
LOGICAL_UNARY = frozenset({UnaryFn.GELU, UnaryFn.GELU_APPROX, UnaryFn.SILU, UnaryFn.QUICK_GELU,
                           UnaryFn.HARD_SWISH, UnaryFn.RELU6})
_FLOAT_ONLY = frozenset(UnaryFn) - {UnaryFn.NEG, UnaryFn.ABS, UnaryFn.SQUARE, UnaryFn.SIGN,
                                    UnaryFn.RELU, UnaryFn.NOT}


def _same_type(x: np.ndarray, out) -> np.ndarray:
    out = np.asarray(out)
    return out if out.dtype == x.dtype else out.astype(x.dtype)


@dataclass(frozen=True)
class Unary(Op):
    """`fn(x)` elementwise: activations (gelu, silu, relu, ...) and math (exp, sqrt, ...)."""

    kind = "unary"
    arity = 1
    elementwise = True
    fn: UnaryFn

    @property
    def label(self) -> str:
        return self.fn.value

    @classmethod
    def labels(cls) -> tuple[str, ...]:
        return tuple(f.value for f in UnaryFn)

    def infer(self, ins):
        (x,) = ins
        if self.fn is UnaryFn.NOT:
            require(x.dtype == bool_, f"not needs bool input, got {x.dtype}")
        elif self.fn in _FLOAT_ONLY:
            require(x.dtype.is_float or x.dtype.kind == "complex",
                    f"{self.fn.value} needs a float input, got {x.dtype}")
        return x

    def reference(self, x):
        return _same_type(x, self.fn.apply(x))

    def decompose(self, g, ins):
        """The logical activations (`LOGICAL_UNARY`: gelu, gelu_approx, silu, quick_gelu,
        hard_swish, relu6) written with math primitives, for backends without their kernels. The op
        stays a primitive (`composite` is False): unfuse keeps it; lowerings ask for this."""
        (x,) = ins
        fn = self.fn
        if fn is UnaryFn.GELU:
            return g.mul(g.mul(x, 0.5), g.add(g.erf(g.div(x, math.sqrt(2.0))), 1.0))
        if fn is UnaryFn.GELU_APPROX:
            cubic = g.add(x, g.mul(g.mul(g.mul(x, x), x), 0.044715))
            return g.mul(g.mul(x, 0.5), g.add(g.tanh(g.mul(cubic, _SQRT_2_OVER_PI)), 1.0))
        if fn is UnaryFn.SILU:
            return g.mul(x, g.sigmoid(x))
        if fn is UnaryFn.QUICK_GELU:
            return g.mul(x, g.sigmoid(g.mul(x, 1.702)))
        if fn is UnaryFn.HARD_SWISH:
            return g.div(g.mul(x, g.clamp(g.add(x, 3.0), 0.0, 6.0)), 6.0)
        if fn is UnaryFn.RELU6:
            return g.clamp(x, 0.0, 6.0)
        raise GraphError(f"{fn.value} is a primitive function with no decomposition; only "
                         f"{', '.join(sorted(f.value for f in LOGICAL_UNARY))} decompose")


class BinaryFn(enum.Enum):
    """Binary functions. DIV on integers floors; MOD takes the divisor's sign (Python %), FMOD
    the dividend's (C fmod); AND / OR / XOR are logical and need bool operands."""

    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MAX = "max"
    MIN = "min"
    POW = "pow"
    MOD = "mod"
    FMOD = "fmod"
    AND = "and"
    OR = "or"
    XOR = "xor"

    @property
    def commutative(self) -> bool:
        return self in (BinaryFn.ADD, BinaryFn.MUL, BinaryFn.MAX, BinaryFn.MIN, BinaryFn.AND,
                        BinaryFn.OR, BinaryFn.XOR)

    @property
    def is_logical(self) -> bool:
        return self in (BinaryFn.AND, BinaryFn.OR, BinaryFn.XOR)


_BINARY_IMPL = {
    BinaryFn.ADD: np.add,
    BinaryFn.SUB: np.subtract,
    BinaryFn.MUL: np.multiply,
    BinaryFn.DIV: lambda a, b: (a // b) if a.dtype.kind in "iu" else np.divide(a, b),
    BinaryFn.MAX: _maximum,
    BinaryFn.MIN: _minimum,
    BinaryFn.POW: np.power,
    BinaryFn.MOD: np.mod,
    BinaryFn.FMOD: np.fmod,
    BinaryFn.AND: np.logical_and,
    BinaryFn.OR: np.logical_or,
    BinaryFn.XOR: np.logical_xor,
}


@dataclass(frozen=True)
class Binary(Op):
    """`fn(a, b)` with NumPy broadcasting; both operands share one dtype."""

    kind = "binary"
    arity = 2
    elementwise = True
    fn: BinaryFn

    @property
    def label(self) -> str:
        return self.fn.value

    @classmethod
    def labels(cls) -> tuple[str, ...]:
        return tuple(f.value for f in BinaryFn)

    def infer(self, ins):
        a, b = ins
        same_dtype(self, ins)
        if self.fn.is_logical:
            require(a.dtype == bool_, f"{self.fn.value} needs bool operands, got {a.dtype}")
        else:
            require(a.dtype != bool_, f"{self.fn.value} needs numeric operands, got bool")
        return Shape(broadcast_shapes(a.dims, b.dims), a.dtype)

    def reference(self, a, b):
        return _same_type(a, _BINARY_IMPL[self.fn](a, b))


class CompareFn(enum.Enum):
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"


_COMPARE_IMPL = {
    CompareFn.EQ: np.equal,
    CompareFn.NE: np.not_equal,
    CompareFn.LT: np.less,
    CompareFn.LE: np.less_equal,
    CompareFn.GT: np.greater,
    CompareFn.GE: np.greater_equal,
}


@dataclass(frozen=True)
class Compare(Op):
    """`fn(a, b)` elementwise with broadcasting, giving bool."""

    kind = "compare"
    arity = 2
    elementwise = True
    fn: CompareFn

    @property
    def label(self) -> str:
        return self.fn.value

    @classmethod
    def labels(cls) -> tuple[str, ...]:
        return tuple(f.value for f in CompareFn)

    def infer(self, ins):
        a, b = ins
        same_dtype(self, ins)
        return Shape(broadcast_shapes(a.dims, b.dims), bool_)

    def reference(self, a, b):
        return _COMPARE_IMPL[self.fn](a, b)


@dataclass(frozen=True)
class IsNan(Op):
    """Whether each element is NaN (bool)."""

    kind = "isnan"
    arity = 1
    elementwise = True

    def infer(self, ins):
        require(ins[0].dtype.is_float, f"isnan needs a float input, got {ins[0].dtype}")
        return ins[0].with_dtype(bool_)

    def reference(self, x):
        return np.isnan(x)


@dataclass(frozen=True)
class IsInf(Op):
    """Whether each element is +inf (`detect_positive`) or -inf (`detect_negative`) (bool)."""

    kind = "isinf"
    arity = 1
    elementwise = True
    detect_positive: bool = True
    detect_negative: bool = True

    def infer(self, ins):
        require(ins[0].dtype.is_float, f"isinf needs a float input, got {ins[0].dtype}")
        return ins[0].with_dtype(bool_)

    def reference(self, x):
        pos = np.isposinf(x) if self.detect_positive else np.zeros(x.shape, bool)
        return pos | np.isneginf(x) if self.detect_negative else pos


@dataclass(frozen=True)
class Where(Op):
    """`cond ? a : b` with broadcasting over all three."""

    kind = "where"
    arity = 3
    elementwise = True

    def infer(self, ins):
        c, a, b = ins
        require(c.dtype == bool_, f"where condition must be bool, got {c.dtype}")
        same_dtype(self, (a, b))
        return Shape(broadcast_shapes(c.dims, a.dims, b.dims), a.dtype)

    def reference(self, c, a, b):
        return np.where(c, a, b)


@dataclass(frozen=True)
class Cast(Op):
    """Convert the element type to `dtype`. Float -> integer / bool follows `float_to_int`
    (defined for NaN, infinities and out-of-range values: what ONNX Runtime, PyTorch and NumPy
    give on x86-64)."""

    kind = "cast"
    arity = 1
    elementwise = True
    dtype: DType

    def infer(self, ins):
        return ins[0].with_dtype(self.dtype)

    def reference(self, x):
        x = np.asarray(x)
        if x.dtype.kind == "f" or x.dtype.name == "bfloat16":
            if self.dtype.kind in ("int", "uint", "bool"):
                return float_to_int(x, self.dtype.np)
        return x.astype(self.dtype.np)


@dataclass(frozen=True)
class StopGradient(Op):
    """The identity, except to autodiff: no gradient flows back through it and its tangent is
    zero (torch's `detach`, JAX's `lax.stop_gradient`). Runs as a view of its input."""

    kind = "stop_gradient"
    arity = 1
    elementwise = True

    def infer(self, ins):
        return ins[0]

    def reference(self, x):
        return x


@dataclass(frozen=True)
class LeakyRelu(Op):
    """`x if x >= 0 else alpha * x`."""

    kind = "leaky_relu"
    arity = 1
    elementwise = True
    alpha: float = 0.01

    def infer(self, ins):
        require(ins[0].dtype.is_float, f"leaky_relu needs a float input, got {ins[0].dtype}")
        return ins[0]

    def reference(self, x):
        return _same_type(x, np.where(x >= 0, x, x * x.dtype.type(self.alpha)))


@dataclass(frozen=True)
class Clamp(Op):
    """Clip into [lo, hi]. An integer x with float bounds clips in float64 and converts back
    as Cast does (`float_to_int`: a bound outside the type gives that rule's value)."""

    kind = "clamp"
    arity = 1
    elementwise = True
    lo: float
    hi: float

    def infer(self, ins):
        require(self.lo <= self.hi, f"clamp needs lo <= hi, got {self.lo} > {self.hi}")
        return ins[0]

    def reference(self, x):
        out = np.asarray(np.clip(x, self.lo, self.hi))
        if x.dtype.kind in "iu" and out.dtype.kind == "f":  # float bounds: an out-of-range one
            return float_to_int(out, x.dtype)                # converts as Cast defines
        return _same_type(x, out)
