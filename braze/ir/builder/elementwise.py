"""Builder methods for elementwise ops, long names and the short GraphExt names."""
from __future__ import annotations

from ...errors import GraphError
from ..dtypes import DType
from ..op import Value
from ..ops.elementwise import (
    Binary,
    BinaryFn,
    Cast,
    Clamp,
    Compare,
    CompareFn,
    IsInf,
    IsNan,
    LeakyRelu,
    StopGradient,
    Unary,
    UnaryFn,
    Where,
)
from .rlx_args import check_shape


def _enum(enum_cls, v):
    if isinstance(v, enum_cls):
        return v
    try:
        return enum_cls(v)
    except ValueError:
        names = ", ".join(e.value for e in enum_cls)
        raise GraphError(f"unknown {enum_cls.__name__} {v!r}; known: {names}") from None


class ElementwiseBuilder:
    # -- generic forms ---------------------------------------------------------------------------
    def activation(self, x: Value, fn: UnaryFn | str, shape=None) -> Value:
        """Apply a unary function (`"gelu"`, `UnaryFn.SILU`, ...). RLX's order
        `activation(fn, x, shape)` works too; `shape` is checked against the inferred type."""
        if isinstance(x, (UnaryFn, str)):
            x, fn = fn, x
        out = self.add_node(Unary(_enum(UnaryFn, fn)), (x,))[0]
        check_shape(f"activation {self.node(out).op.label}", self.shape_of(out), shape)
        return out

    unary = activation

    def binary(self, a, b, fn: BinaryFn | str, shape=None) -> Value:
        """`fn(a, b)` with broadcasting; Python scalars become constants of the other's dtype.
        RLX's order `binary(fn, a, b, shape)` works too; `shape` is checked."""
        if isinstance(a, (BinaryFn, str)):
            a, b, fn = b, fn, a
        fn = _enum(BinaryFn, fn)
        a2 = self._coerce(a, like=b if isinstance(b, Value) else None)
        b2 = self._coerce(b, like=a2)
        out = self.add_node(Binary(fn), (a2, b2))[0]
        check_shape(f"binary {fn.value}", self.shape_of(out), shape)
        return out

    def compare(self, a, b, fn: CompareFn | str) -> Value:
        a2 = self._coerce(a, like=b if isinstance(b, Value) else None)
        b2 = self._coerce(b, like=a2)
        return self.add_node(Compare(_enum(CompareFn, fn)), (a2, b2))[0]

    def where(self, cond: Value, a, b) -> Value:
        a2 = self._coerce(a, like=b if isinstance(b, Value) else None)
        b2 = self._coerce(b, like=a2)
        return self.add_node(Where(), (cond, a2, b2))[0]

    def cast(self, x: Value, dtype: DType) -> Value:
        return self.add_node(Cast(dtype), (x,))[0]

    def leaky_relu(self, x: Value, alpha: float = 0.01) -> Value:
        return self.add_node(LeakyRelu(float(alpha)), (x,))[0]

    def clamp(self, x: Value, lo: float, hi: float) -> Value:
        return self.add_node(Clamp(float(lo), float(hi)), (x,))[0]

    # -- short names -----------------------------------------------------------------------------
    def add(self, a, b) -> Value:
        return self.binary(a, b, BinaryFn.ADD)

    def sub(self, a, b) -> Value:
        return self.binary(a, b, BinaryFn.SUB)

    def mul(self, a, b) -> Value:
        return self.binary(a, b, BinaryFn.MUL)

    def div(self, a, b) -> Value:
        return self.binary(a, b, BinaryFn.DIV)

    def maximum(self, a, b) -> Value:
        return self.binary(a, b, BinaryFn.MAX)

    def minimum(self, a, b) -> Value:
        return self.binary(a, b, BinaryFn.MIN)

    def pow(self, a, b) -> Value:
        return self.binary(a, b, BinaryFn.POW)

    def mod(self, a, b) -> Value:
        """Remainder with the divisor's sign (Python `%`); `fmod` keeps the dividend's."""
        return self.binary(a, b, BinaryFn.MOD)

    def fmod(self, a, b) -> Value:
        return self.binary(a, b, BinaryFn.FMOD)

    def logical_and(self, a, b) -> Value:
        return self.binary(a, b, BinaryFn.AND)

    def logical_or(self, a, b) -> Value:
        return self.binary(a, b, BinaryFn.OR)

    def logical_xor(self, a, b) -> Value:
        return self.binary(a, b, BinaryFn.XOR)

    def isnan(self, x: Value) -> Value:
        """bool: x is NaN."""
        return self.add_node(IsNan(), (x,))[0]

    def stop_gradient(self, x: Value) -> Value:
        """x, as a constant to autodiff: gradients do not flow back through it (torch's
        `x.detach()`)."""
        return self.add_node(StopGradient(), (x,))[0]

    def isinf(self, x: Value, detect_positive: bool = True, detect_negative: bool = True
              ) -> Value:
        """bool: x is +inf / -inf (each side switchable)."""
        return self.add_node(IsInf(bool(detect_positive), bool(detect_negative)), (x,))[0]

    def eq(self, a, b) -> Value:
        return self.compare(a, b, CompareFn.EQ)

    def lt(self, a, b) -> Value:
        return self.compare(a, b, CompareFn.LT)

    def gt(self, a, b) -> Value:
        return self.compare(a, b, CompareFn.GT)

    def le(self, a, b) -> Value:
        return self.compare(a, b, CompareFn.LE)

    def ge(self, a, b) -> Value:
        return self.compare(a, b, CompareFn.GE)

    def ne(self, a, b) -> Value:
        return self.compare(a, b, CompareFn.NE)


def _unary_method(fn: UnaryFn):
    def method(self, x: Value) -> Value:
        return self.activation(x, fn)

    method.__name__ = fn.value
    method.__doc__ = f"`{fn.value}(x)` elementwise."
    return method


for _fn in UnaryFn:
    _name = {"not": "logical_not"}.get(_fn.value, _fn.value)
    setattr(ElementwiseBuilder, _name, _unary_method(_fn))
