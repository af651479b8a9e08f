"""float16 / bfloat16 values in generated element-wise regions (codegen/elementwise.py): C
expressions that give the reference interpreter's result for a body op whose output is
half-precision, computed in float32 and rounded back to the half type after the op.

The reference runs each op in NumPy: float16 ops are computed in float32 and rounded to float16
(NumPy's half loops), bfloat16 ones likewise (ml_dtypes' loops). A value is held in float32,
already rounded to its type, and each op's float32 result is rounded again (float32 -> half ->
float32: integer and float32 operations on the bits, bit-exact to the conversions; they
vectorize). For add, sub, mul, div, sqrt, neg, abs, max, min, compares, where, casts,
clamp, relu, leaky_relu, floor / ceil / round, sign and mod / fmod that is the reference's
result bit for bit (float32 carries 2p + 2 bits of both half types, so the second rounding is
the correctly rounded one). NaN results are NaN where the reference's are; their sign and
payload may differ.

The logical activations (sigmoid, silu, gelu, gelu_approx, quick_gelu, hard_swish) are not one
rounding in the reference but its formula (ir/ops/elementwise.py) evaluated op by op in the
dtypes NumPy picks: every step in float16 for float16 (Python-float scalars are weak), while a
bfloat16 array with a Python float promotes to float32, so for bfloat16 those steps stay
float32 and only the bfloat16-by-bfloat16 ones round. The generated code follows the same
steps: the reference's float16 sigmoid of x <= -11.1 is 0 (exp(-x) overflows float16), its
left tail of gelu cancels, and a once-rounded float32 activation would differ by thousands of
ulps there. exp, tanh and erf themselves are the float32 approximations of codegen/vecmath.py
(error 1.3-2.4 float32 ulp) rounded to the half type, which is the reference's value except when
the exact result lies within those few float32 ulps of a rounding boundary: then it is one
half-precision ulp off, and a step that follows can magnify that. Measured on every float16
and bfloat16 input (tests/runtime/test_region_half.py holds the bounds): exp, tanh, erf, log,
sin, cos and every activation within 1 ulp of the reference, bit-identical on all but 1-4 of
the 65536 inputs, except float16 sigmoid / silu / quick_gelu: 2 ulp on one input each (an exp
one ulp off near 1, through 1 / (1 + e)); NaN exactly where the reference has NaN."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from ...ir.ops.elementwise import (
    Binary,
    BinaryFn,
    Cast,
    Clamp,
    LeakyRelu,
    Unary,
    UnaryFn,
    Where,
)
from .vecmath import CALLS

__all__ = ["HALF_TYPES", "half_prelude", "half_load", "half_store", "half_expr",
           "clamp_bounds"]

HALF_TYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}
"""braze dtype name -> the NumPy scalar type the reference computes with."""

_ROUND = {"f16": "bz_round_f16", "bf16": "bz_round_bf16"}

_ROUND_C = r"""
/* float16 <-> float32 in integer and float32 operations, bit-exact to the conversions, which
   GCC vectorizes (GCC 12 keeps _Float16 conversions scalar, and with them the whole loop). */
BZ_INLINE float bz_f16_load(uint16_t h) {
  uint32_t em = (uint32_t)(h & 0x7fffu) << 13;
  float f = bz_float(em) * 0x1p112f;  /* rebias exactly: normals, and subnormals normalize */
  uint32_t u = bz_bits(f) | (em >= (0x7c00u << 13) ? 0x7f800000u : 0u);  /* inf, NaN */
  return bz_float(u | ((uint32_t)(h & 0x8000u) << 16));
}
/* x rounded to the nearest float16 (ties to even), as a float32. */
BZ_INLINE float bz_round_f16(float x) {
  uint32_t u = bz_bits(x), a = u & 0x7fffffffu;
  uint32_t n = (a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u;  /* 10 fraction bits */
  uint32_t s = bz_bits((bz_float(a) + 0.75f) - 0.75f);  /* below 2^-14: multiples of 2^-24 */
  uint32_t r = a < 0x38800000u ? s : (n > 0x477fe000u ? 0x7f800000u : n);  /* > 65504: inf */
  r = a > 0x7f800000u ? ((a | 0x00400000u) & 0xffffe000u) : r;  /* NaN stays a quiet NaN */
  return bz_float(r | (u & 0x80000000u));
}
/* The float16 bits of x, a float16 value held exactly in a float32 (bz_round_f16's). */
BZ_INLINE uint16_t bz_f16_bits(float x) {
  uint32_t u = bz_bits(x), a = u & 0x7fffffffu;
  uint32_t n = (a - 0x38000000u) >> 13;
  uint32_t s = bz_bits(bz_float(a) + 0.5f) - 0x3f000000u;  /* subnormal: its count of 2^-24 */
  uint32_t r = a < 0x38800000u ? s : (a >= 0x7f800000u ? 0x7c00u | ((a >> 13) & 0x3ffu) : n);
  return (uint16_t)(r | ((u >> 16) & 0x8000u));
}
/* bfloat16: kernels/exact_c's conversions, integer operations that vectorize as they are. */
BZ_INLINE float bz_round_bf16(float x) { return bf16_load(bf16_store(x)); }
/* float64 -> float16 in one rounding, as NumPy casts (through float32 can round twice);
   a scalar conversion. */
BZ_INLINE float bz_f16_from_f64(double x) { return (float)(_Float16)x; }
"""


def half_prelude() -> str:
    """C of the half conversions (bfloat16's and the float64 one from kernels/exact_c.py, which
    the exact element-wise kernels use too; float16's vectorizable ones here) and the rounding
    helpers, for a source that holds half values (after vecmath's, whose bit helpers it uses)."""
    from ..kernels.exact_c import HALF_C  # lazily: the kernels package imports this module

    return "\n#include <string.h>\n" + HALF_C + _ROUND_C


_LOAD = {"f16": "bz_f16_load", "bf16": "bf16_load"}
_STORE = {"f16": "bz_f16_bits", "bf16": "bf16_store"}


def half_load(h: str, ref: str) -> str:
    """The float32 value of the stored half `ref`."""
    return f"{_LOAD[h]}({ref})"


def half_store(h: str, expr: str) -> str:
    """The 16 bits that store the float32 `expr` (a value of type h: exact)."""
    return f"{_STORE[h]}({expr})"


def _lit(v: float) -> str:
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    return f"{float(np.float32(v))!r}f"


def half_expr(op_, a: list[str], h: str, it: str, float_expr, scalar=None) -> str:
    """C float expression of a body op whose output has half type `h`, over argument
    expressions `a` (float32 holding their values; the first of C type `it`), as the reference
    computes it. `float_expr(op_, a, t, it)` writes an op in C type t (elementwise._expr);
    `scalar(attribute)`, when given, names a clamp bound or leaky slope the kernel reads from
    its arguments (None: a literal; codegen.scalars)."""
    r = lambda e: f"{_ROUND[h]}({e})"  # noqa: E731
    named = scalar or (lambda attr: None)
    if isinstance(op_, Unary):
        return _unary(op_.fn, a[0], h, r, lambda: float_expr(op_, a, "float", it))
    if isinstance(op_, Binary) and op_.fn in (BinaryFn.MAX, BinaryFn.MIN):
        return _max_min(op_.fn, a[0], a[1], h)
    if isinstance(op_, Where):
        return float_expr(op_, a, "float", it)  # selects a value of the type: no rounding
    if isinstance(op_, Cast):
        if h == "f16" and it == "double":
            return f"bz_f16_from_f64({a[0]})"
        return r(f"((float)({a[0]}))")  # bfloat16 from float64: through float32
    if isinstance(op_, Clamp):
        lo, hi = (named(attr) or _lit(float(v)) for attr, v in zip(("lo", "hi"),
                                                                  clamp_bounds(op_, h)))
        x = a[0]
        clipped = f"({x} < {lo} ? {lo} : ({x} > {hi} ? {hi} : {x}))"
        return clipped if h == "f16" else r(clipped)
    if isinstance(op_, LeakyRelu):
        alpha = named("alpha") or _lit(float(HALF_TYPES[h](op_.alpha)))
        return f"({a[0]} >= 0 ? {a[0]} : {r(f'({a[0]} * {alpha})')})"
    return r(float_expr(op_, a, "float", it))


def _max_min(fn: BinaryFn, a: str, b: str, h: str) -> str:
    """The reference's maximum / minimum (ir/ops/elementwise.py `_maximum`): the second of
    equal operands (+0 against -0); a NaN operand wins, the first if both are."""
    cmp = ">" if fn is BinaryFn.MAX else "<"
    return f"(({a} != {a} || {a} {cmp} {b}) ? {a} : {b})"


def clamp_bounds(op_: Clamp, h: str) -> tuple[np.float32, np.float32]:
    """The float32 bounds a half clamp compares with (np.clip against Python-float bounds):
    float16 compares with the bounds rounded to float16 (the reference's result on -inf /
    +inf, which is already the chosen bound's value); bfloat16 is clipped in float32 (the
    bounds rounded to float32), the chosen bound then rounded to bfloat16."""
    if h == "f16":
        with np.errstate(all="ignore"):
            edge = np.array([-np.inf, np.inf], np.float16)
            lo, hi = np.asarray(op_.reference(edge), np.float32)
        return np.float32(lo), np.float32(hi)
    return np.float32(op_.lo), np.float32(op_.hi)


def _unary(fn: UnaryFn, x: str, h: str, r, plain) -> str:
    """A unary function of half type h: the activations as the reference's formula, step by
    step; RELU / SIGN with NumPy's handling of -0 per type; the rest one rounding of `plain()`
    (the float32 function)."""
    if fn is UnaryFn.RELU:  # maximum(x, 0) with the type's tie rule
        return _max_min(BinaryFn.MAX, x, "0.0f", h)
    if fn is UnaryFn.SIGN:  # NumPy's float16 sign(-0) is +0, ml_dtypes' bfloat16 keeps -0
        zero = f"({x} == 0 ? 0.0f : {x})" if h == "f16" else x
        return f"({x} > 0 ? 1.0f : ({x} < 0 ? -1.0f : {zero}))"
    if fn is UnaryFn.RSQRT:  # 1 / sqrt(x): sqrt rounds to the type first
        return r(f"(1.0f / {r(f'sqrtf({x})')})")
    steps = _ActivationSteps(x, h, r)
    if fn in steps.table:
        return steps.table[fn]()
    return r(plain())


class _ActivationSteps:
    """The reference's activation formulas over a half value x. `r` rounds to the half type
    (an op of two half operands); `weak` is an op of a half value and a Python float: half
    for float16, float32 (no rounding) for bfloat16. Each formula's value is of the half
    type (rounded last)."""

    def __init__(self, x: str, h: str, r):
        self.x, self.r = x, r
        self.weak = r if h == "f16" else (lambda e: e)
        self.k = lambda v: _lit(float(HALF_TYPES[h](v)))  # x.dtype.type(v)
        self.table = {UnaryFn.SIGMOID: lambda: r(self.sigmoid(x)), UnaryFn.SILU: self.silu,
                      UnaryFn.QUICK_GELU: self.quick_gelu, UnaryFn.GELU: self.gelu,
                      UnaryFn.GELU_APPROX: self.gelu_approx, UnaryFn.HARD_SWISH: self.hard_swish,
                      UnaryFn.RELU6: self.relu6}

    def call(self, name: str, v: str) -> str:
        return self.r(f"{CALLS[name]}({v})")

    def sigmoid(self, v: str) -> str:  # 1.0 / (1.0 + exp(-v))
        e = self.call("exp", f"(-{v})")
        return self.weak(f"(1.0f / {self.weak(f'(1.0f + {e})')})")

    def silu(self) -> str:  # x * sigmoid(x)
        return self.r(f"({self.x} * {self.sigmoid(self.x)})")

    def quick_gelu(self) -> str:  # x * sigmoid(x * t(1.702))
        x = self.x
        v = self.r(f"({x} * {self.k(1.702)})")
        return self.r(f"({x} * {self.sigmoid(v)})")

    def gelu(self) -> str:  # 0.5 * x * (1.0 + erf(x / t(sqrt 2)))
        x, r, w = self.x, self.r, self.weak
        e = self.call("erf", r(f"({x} / {self.k(math.sqrt(2.0))})"))
        return r(f"({w(f'(0.5f * {x})')} * {w(f'(1.0f + {e})')})")

    def gelu_approx(self) -> str:
        """0.5 * x * (1.0 + tanh(t(c) * (x + t(0.044715) * x * x * x)))."""
        x, r, w = self.x, self.r, self.weak
        cube = r(f"({self.k(0.044715)} * {x})")
        cube = r(f"({r(f'({cube} * {x})')} * {x})")
        u = r(f"({self.k(math.sqrt(2.0 / math.pi))} * {r(f'({x} + {cube})')})")
        t = self.call("tanh", u)
        return r(f"({w(f'(0.5f * {x})')} * {w(f'(1.0f + {t})')})")

    def relu6(self) -> str:
        """clip(x, 0, 6): exact, the value x or a bound."""
        x = self.x
        return self.r(f"({x} < 0 ? 0.0f : ({x} > 6.0f ? 6.0f : {x}))")

    def hard_swish(self) -> str:
        """x * clip(x + t(3), t(0), t(6)) / t(6); x + 3 is never -0, so the clip's tie rules
        do not matter; clip of bfloat16 gives float32, and the product stays float32."""
        x, r, w = self.x, self.r, self.weak
        a = r(f"({x} + 3.0f)")
        c = f"({a} < 0 ? 0.0f : ({a} > 6.0f ? 6.0f : {a}))"
        return r(f"({w(f'({x} * {c})')} / 6.0f)")
