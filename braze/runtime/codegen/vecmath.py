"""Vectorizable float32 math for generated C kernels: exp, tanh, erf, erfc, sigmoid and GELU
written as branch-free C (selects, no calls, no tables), so GCC vectorizes them 8-wide under
AVX2 (16 under AVX-512) inside an `omp simd` loop without -ffast-math, and NaN / inf keep their
IEEE meaning (the kernels are built without -ffinite-math-only).

Methods (coefficients fit in float64 by iteratively reweighted least squares toward minimax
relative error, each rounded to float32 before the next is refit):
- exp: clamp to [-104, 89], n = round(x / ln 2) (the 1.5 * 2^23 shift), r = x - n ln 2 in two
  Cody-Waite parts, e^r = 1 + r + r^2 P(r) with P of degree 4 on [-ln2/2, ln2/2] (3e-9), then
  2^n in two factors so that results down into the denormals round once. Callers whose
  argument range is known use the clamp-free one-factor core (with a 2^bias that keeps their
  intermediate normal and is taken off in their last multiply).
- tanh: |x| < 0.625: x + x^3 P(x^2) (degree 4); otherwise sign(x) (1 - 2 / (e^(2|x|) + 1))
  with |x| clamped to 10 (tanh(10) rounds to 1).
- erf: |x| < 0.921875: x + x P(x^2) (degree 5); otherwise sign(x) (1 - erfc(|x|)) with |x|
  clamped to 4.5 (1 - erfc(4.5) rounds to 1).
- erfc (z >= 0): t = 1 / (1 + z/2), erfc(z) = t exp(-z^2 + Q(t)), Q of degree 10 in t - 1/2
  (fit on z in [0, 12.5]); z^2 is split exactly (FMA or Dekker), so the exponent is right to
  an ulp.
- GELU: x Phi(x) with Phi(x) = erfc(-x / sqrt 2) / 2 from the erfc form on both sides, so the
  left tail keeps full relative accuracy (0.5 x (1 + erf) loses it to cancellation).
- sigmoid 1 / (1 + e^-x); SiLU x / (1 + e^-x); tanh-GELU as x sigmoid(2u) (no cancellation).

Measured maximum error against float64 NumPy / SciPy over all float32 magnitudes, denormals,
+-0, +-inf and NaN included (tests/runtime/test_region_codegen.py holds the bounds): exp 1.3
ulp, tanh 1.4, erf 2.4, sigmoid 2.6, SiLU 2.9, quick GELU 3.5, GELU 5.7 (the erfc polynomial's
float32 evaluation), counting denormal results in steps of 2^-149; tanh-GELU 4 ulp plus the
float rounding of its cubic argument (|2u| 2^-22 relative, in the far left tail only). As in
the reference formulas, x-times-sigmoid forms give NaN at x = -inf. Cost per element on the
dev machine, one thread, a 4096-element loop in cache (CPU time): exp ~0.5 ns, sigmoid / SiLU
~0.85, tanh ~0.75, GELU ~1.7 (glibc's libmvec, accurate only in absolute terms in GELU's tail:
expf ~0.6, erff GELU ~1.1, timed earlier in larger loops).

GCC sinks a float select below the operations that use it (each is then computed for both
arms and blended): a clamp feeding several uses cost GELU five blends, a numerator chosen
before a division two divisions. Such selects are made on the bits (an unsigned min, a mask)
and NaN is carried through the arithmetic rather than tested at the end.

libm's log / sin / cos / pow stay calls, vectorized through glibc's libmvec where it has them
(declared below for x86-64 glibc)."""
from __future__ import annotations

import platform
from functools import cache

from .cc import glibc_version

__all__ = ["VECMATH_C", "libmvec_decls", "CALLS"]

CALLS = {"exp": "bz_expf", "tanh": "bz_tanhf", "erf": "bz_erff", "sigmoid": "bz_sigmoidf",
         "silu": "bz_siluf", "gelu": "bz_geluf", "gelu_approx": "bz_gelu_tanhf",
         "quick_gelu": "bz_quick_geluf"}
"""Function name -> the C function of VECMATH_C (float32 only)."""

ERFC_Q = ("-0.67179406f", "1.3452865f", "0.18936555f", "-0.37516394f", "-0.15760612f",
          "0.28205708f", "0.10672544f", "-0.29033178f", "-0.0004282862f", "0.2458333f",
          "-0.1401319f")
"""log(erfc(z) / t) + z^2 = sum of ERFC_Q[i] (t - 1/2)^i, t = 1 / (1 + z/2), z in [0, 12.5]
(C float literals): bz_erfc_q's polynomial, and c_snippets.GELU16's."""

VECMATH_C = r"""
#ifndef BRAZE_VECMATH
#define BRAZE_VECMATH
#include <stdint.h>
#define BZ_INLINE static inline __attribute__((always_inline))

BZ_INLINE uint32_t bz_bits(float x) { union { float f; uint32_t u; } v; v.f = x; return v.u; }
BZ_INLINE float bz_float(uint32_t u) { union { float f; uint32_t u; } v; v.u = u; return v.f; }

/* x * y as hi + lo exactly. */
BZ_INLINE float bz_mul_lo(float x, float y, float hi) {
#if defined(__FMA__) || defined(__FP_FAST_FMAF)
  return __builtin_fmaf(x, y, -hi);
#else
  const float split = 4097.0f;  /* Dekker: halves of 12 bits multiply exactly */
  float xs = x * split, ys = y * split;
  float xh = xs - (xs - x), yh = ys - (ys - y);
  float xl = x - xh, yl = y - yh;
  return ((xh * yh - hi) + xh * yl + xl * yh) + xl * yl;
#endif
}

/* The polynomial part of e^(h + l): returns p with e^(h + l) = p * 2^(*ni - bias), *ni the
   rounded exponent n = round((h + l) / ln 2) plus `bias`. l is a low part carried beyond
   float precision (-0.0f when there is none). */
BZ_INLINE float bz_exp_reduce(float h, float l, int32_t bias, int32_t* ni) {
  const float shift = 12582912.0f;  /* 1.5 * 2^23: adding it rounds to an integer */
  float k = (h + l) * 1.44269504f + shift;
  float n = k - shift;
  *ni = (int32_t)(bz_bits(k) - bz_bits(shift)) + bias;
  float r = h - n * 0.693145752f;   /* ln2 high part: n * it is exact */
  r = r - n * 1.42860677e-6f;       /* ln2 low part */
  r = r + l;
  float p = 0.0013821024f;
  p = p * r + 0.008368669f;
  p = p * r + 0.041668262f;
  p = p * r + 0.16666521f;
  p = p * r + 0.49999994f;
  return 1.0f + r + r * r * p;
}

/* e^(h + l) * 2^bias for h + l in the range where n + bias stays within [-126, 127]: callers
   clamp their arguments so (no clamps or second scale factor here). */
BZ_INLINE float bz_exp_core(float h, float l, int32_t bias) {
  int32_t ni;
  float p = bz_exp_reduce(h, l, bias, &ni);
  return p * bz_float((uint32_t)(ni + 127) << 23);
}

/* e^(hi + lo) * 2^bias for a float sum hi + lo carried to more than float precision (the
   error of x^2 in lo, say). `bias` (a literal) keeps results that would be denormal normal, so
   the caller's last multiply rounds once. NaN flows through (it fails every test). */
BZ_INLINE float bz_exp_hl(float hi, float lo, int32_t bias) {
  const float low = -104.0f - 0.693147181f * (float)bias;  /* below: 0 even after the bias */
  float s = hi + lo;
  float h = s < low ? low : (s > 89.0f ? 89.0f : hi);
  float l = s < low ? -0.0f : lo;  /* selects on float compares: an int mask costs */
  l = s > 89.0f ? -0.0f : l;        /* conversions; -0.0f (x + -0 == x) folds away */
  int32_t ni;
  float p = bz_exp_reduce(h, l, bias, &ni);
  int32_t n1 = ni >> 1;            /* 2^n as 2^n1 * 2^n2: both factors stay normal */
  int32_t n2 = ni - n1;
  float s1 = bz_float((uint32_t)(n1 + 127) << 23);
  float s2 = bz_float((uint32_t)(n2 + 127) << 23);
  return p * s1 * s2;
}

BZ_INLINE float bz_expf(float x) { return bz_exp_hl(x, -0.0f, 0); }

BZ_INLINE float bz_tanhf(float x) {  /* odd: computed for |x|, the sign put back last */
  float ax = __builtin_fabsf(x);
  float z = x * x;
  float p = -0.0056993747f;
  p = p * z + 0.020633498f;
  p = p * z - 0.053737767f;
  p = p * z + 0.13331415f;
  p = p * z - 0.3333328f;
  float small = ax + ax * z * p;
  float e = bz_exp_core(2.0f * (ax > 10.0f ? 10.0f : ax), -0.0f, 0);  /* tanh(10) rounds to 1; */
  float big = 1.0f - 2.0f / (e + 1.0f);                /* a NaN passes the clamp and the exp */
  return __builtin_copysignf(ax < 0.625f ? small : big, x);
}

/* log(erfc(z) / t) + z^2 as a polynomial in t - 0.5, t = 1 / (1 + z/2), for z >= 0; in
   Estrin's form (pairs, then powers s^2 and s^4): half of Horner's chain of ten dependent
   FMAs, which two threads on this 2-vCPU machine could not overlap (bias_gelu 4-11% less CPU). */
BZ_INLINE float bz_erfc_q(float t) {
  float s = t - 0.5f;
  float s2 = s * s, s4 = s2 * s2;
  float c01 = """ + ERFC_Q[1] + r""" * s + """ + ERFC_Q[0] + r""";
  float c23 = """ + ERFC_Q[3] + r""" * s + """ + ERFC_Q[2] + r""";
  float c45 = """ + ERFC_Q[5] + r""" * s + """ + ERFC_Q[4] + r""";
  float c67 = """ + ERFC_Q[7] + r""" * s + """ + ERFC_Q[6] + r""";
  float c89 = """ + ERFC_Q[9] + r""" * s + """ + ERFC_Q[8] + r""";
  float c0_3 = c23 * s2 + c01;
  float c4_7 = c67 * s2 + c45;
  float c8_10 = """ + ERFC_Q[10] + r""" * s2 + c89;
  return (c8_10 * s4 + c4_7) * s4 + c0_3;
}

/* erfc(z) for 0 <= z <= 9, given z^2 = z2h + z2l exactly. */
BZ_INLINE float bz_erfc_big(float z, float z2h, float z2l) {
  float t = 1.0f / (1.0f + 0.5f * z);
  return t * bz_exp_core(-z2h, bz_erfc_q(t) - z2l, 0);
}

/* erf(x) / x - 1 as a polynomial in x^2, for |x| < 0.921875 (erf(x) = x + x p: the
   leading 2 / sqrt(pi) - 1 adds no rounding of its own). */
BZ_INLINE float bz_erf_small(float z2) {
  float p = -0.00054452877f;
  p = p * z2 + 0.0048791654f;
  p = p * z2 - 0.026683487f;
  p = p * z2 + 0.11279351f;
  p = p * z2 - 0.3761224f;
  return p * z2 + 0.12837917f;
}

BZ_INLINE float bz_erff(float x) {
  float ax = __builtin_fabsf(x);
  float z = ax < 4.5f ? ax : 4.5f;  /* 1 - erfc(4.5) rounds to 1; keeps inf - inf out */
  float z2 = z * z;
  float small = x + x * bz_erf_small(x * x);
  float big = __builtin_copysignf(1.0f - bz_erfc_big(z, z2, bz_mul_lo(z, z, z2)), x);
  big = x != x ? x : big;
  return ax < 0.921875f ? small : big;
}

/* x Phi(x), Phi the standard normal CDF, from erfc(|x| / sqrt 2) / 2 on both sides (scaled by
   2^100 so that the left tail's result rounds once, even into the denormals): Phi(-|x|) has
   full relative accuracy and 1 - Phi(-|x|) >= 1/2 loses none, so one formula covers all x. */
BZ_INLINE float bz_geluf(float x) {
  float ax = __builtin_fabsf(x);
  uint32_t cap = bz_bits(17.5f);  /* min on the bits of |x| (ordered as the floats are): a float
     select here, GCC pushes below every use (five blends); a NaN becomes 17.5, and fails
     `ax < 17.5f` below */
  float axc = bz_float(bz_bits(ax) < cap ? bz_bits(ax) : cap);
  float x2 = axc * axc;                       /* z^2 = x^2 / 2, exactly as hi + lo */
  float t = 1.0f / (1.0f + axc * 0.353553391f);  /* z / 2 = |x| / (2 sqrt 2) */
  float e = bz_exp_core(-0.5f * x2, bz_erfc_q(t) - 0.5f * bz_mul_lo(axc, axc, x2), 99);
  float tail = ax < 17.5f ? t * e : 0.0f;     /* Phi(-|x|) * 2^100; beyond (and NaN), 0 */
  return x < 0.0f ? (x * tail) * 0x1p-100f : x * (1.0f - tail * 0x1p-100f);
}

/* num / (1 + e^-|u|) with num chosen per side, so neither tail overflows or cancels:
   sigmoid(u) = 1 / (1 + e^-u) for u >= 0 and e^u / (1 + e^u) below (e^u scaled by 2^64 so a
   denormal result rounds once). */
BZ_INLINE float bz_sigmoid_parts(float u_hi, float u_lo, float pos, float neg) {
  float a = -__builtin_fabsf(u_hi);
  float ac = a < -131.0f ? -131.0f : a;  /* e^-131 2^64 is still normal */
  float es = bz_exp_core(ac, u_hi < 0.0f ? u_lo : -u_lo, 64);
  es = a < -131.0f ? 0.0f : es;   /* so -inf * sigmoid(-inf) is NaN, as x * 0 */
  float e = es * 0x1p-64f;                                        /* e^-|u| */
  uint32_t left = -(uint32_t)(u_hi < 0.0f);  /* the numerator chosen on the bits: a float
     select GCC moves below the division, which then runs twice */
  float num = bz_float((bz_bits(neg * es) & left) | (bz_bits(pos) & ~left));
  return num / (1.0f + e) * (u_hi < 0.0f ? 0x1p-64f : 1.0f);
}

BZ_INLINE float bz_sigmoidf(float x) { return bz_sigmoid_parts(x, -0.0f, 1.0f, 1.0f); }
BZ_INLINE float bz_siluf(float x) { return bz_sigmoid_parts(x, -0.0f, x, x); }

/* x sigmoid(1.702 x), with 1.702 x carried as hi + lo (|x| <= 100 there: beyond, the
   sigmoid is 0 or 1 in float). */
BZ_INLINE float bz_quick_geluf(float x) {
  float xc = x < -100.0f ? -100.0f : x;  /* one clamp as two selects: GCC 12 does not */
  xc = xc > 100.0f ? 100.0f : xc;        /* vectorize the nested form of one variable */
  float u = 1.702f * xc;
  return bz_sigmoid_parts(u, bz_mul_lo(1.702f, xc, u), x, x);
}

/* 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): no cancellation
   in the left tail, where the error is that of 2u's float rounding (|2u| * 2^-23 relative). */
BZ_INLINE float bz_gelu_tanhf(float x) {
  float u2 = 1.59576912f * (x + 0.044715f * x * x * x);
  return bz_sigmoid_parts(u2, -0.0f, x, x);
}
#endif
"""


@cache
def libmvec_decls() -> str:
    """`omp declare simd` declarations of the libm functions glibc's libmvec has vector forms
    of on x86-64 (logf, sinf, cosf, powf since 2.22; erff since 2.35): math.h declares them
    so only under -ffast-math, which the region kernels do not use. Empty elsewhere."""
    if platform.machine() not in ("x86_64", "AMD64") or glibc_version() < (2, 22):
        return ""
    decls = ["float logf(float);", "float sinf(float);", "float cosf(float);",
             "float powf(float, float);"]
    return "".join(f"#pragma omp declare simd notinbranch\n{d}\n" for d in decls)
