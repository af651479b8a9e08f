"""C source snippets the native kernels share (included into each library's source, each
behind an include guard): the activation codes and `act_span` (every epilogue's activation
loop), AVX-512 vector math (exp16, sigmoid16, gelu16), bf16 rounding and rows, 8 x 8 and
16 x 16 transposes, the register-tile micro-kernel, RoPE rows."""
from __future__ import annotations

from ..codegen.vecmath import ERFC_Q

__all__ = ["ACT_CODES", "ROPE_ROW", "TO_BF16", "EXP16", "GELU16", "BF16_ROW", "TRANSPOSE16",
           "TRANSPOSE8", "REGISTER_TILE", "ACT_SPAN", "NAN_BITS"]

ACT_CODES = {None: 0, "gelu": 1, "gelu_approx": 2, "silu": 3, "relu": 4, "sigmoid": 5,
             "tanh": 6, "quick_gelu": 7, "hard_swish": 8, "relu6": 9}

ROPE_ROW = r"""
/* The first 2 * half values of a row rotated by cos / sin [half] (y may be x). */
static inline void rope_row(const float* x, float* y, const float* c, const float* sn,
                            int64_t half, int interleaved) {
  if (interleaved) {
    for (int64_t i = 0; i < half; i++) {
      float a = x[2 * i], b = x[2 * i + 1];
      y[2 * i] = a * c[i] - b * sn[i];
      y[2 * i + 1] = b * c[i] + a * sn[i];
    }
  } else {
    #pragma omp simd
    for (int64_t i = 0; i < half; i++) {
      float a = x[i], b = x[i + half];
      y[i] = a * c[i] - b * sn[i];
      y[i + half] = b * c[i] + a * sn[i];
    }
  }
}
"""

TO_BF16 = r"""
#ifndef BRAZE_TO_BF16
#define BRAZE_TO_BF16
#include <string.h>
/* The bf16 nearest to the f32 with bits u (ties to even); NaN stays a quiet NaN. */
static inline uint16_t to_bf16(uint32_t u) {
  uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
  return (uint16_t)(nan ? ((u >> 16) | 0x40u) : ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
}

/* The bf16 nearest to x (ties to even), and the f32 value of a bf16 (the union's punning is
   defined in GCC; a pointer cast is not, and let GCC keep a stale value). */
static inline uint16_t f32_to_bf16(float x) {
  union { float f; uint32_t u; } c = {x};
  return to_bf16(c.u);
}
static inline float bf16_to_f32(uint16_t h) {
  union { uint32_t u; float f; } c = {(uint32_t)h << 16};
  return c.f;
}

/* x rounded to the nearest bf16 value, as an f32. */
static inline float bf16_value(float x) { return bf16_to_f32(f32_to_bf16(x)); }

/* x[0, n) rounded to bf16 values in place. */
static inline void round_span(float* x, int64_t n) {
  #pragma omp simd
  for (int64_t i = 0; i < n; i++) x[i] = bf16_value(x[i]);
}

/* dst rows [0, rows) (row stride ld) columns [0, w) = bf16 of src rows [0, m) (row stride lds)
   columns [0, n); zero elsewhere. */
static inline void round_rows(const float* src, int64_t lds, int64_t m, int64_t n,
                              uint16_t* dst, int64_t ld, int64_t w, int64_t rows) {
  for (int64_t i = 0; i < rows; i++) {
    uint16_t* o = dst + i * ld;
    if (i >= m) { memset(o, 0, w * sizeof(uint16_t)); continue; }
    const uint32_t* s = (const uint32_t*)(src + i * lds);
    #pragma omp simd
    for (int64_t c = 0; c < n; c++) o[c] = to_bf16(s[c]);
    for (int64_t c = n; c < w; c++) o[c] = 0;
  }
}

/* round_rows of the rows that start `at` elements into src, where src holds f32 values, or
   (in16) bf16 values already, copied as they are. */
static inline void bf16_rows(const void* src, int in16, int64_t at, int64_t lds, int64_t m,
                             int64_t n, uint16_t* dst, int64_t ld, int64_t w, int64_t rows) {
  if (!in16) {
    round_rows((const float*)src + at, lds, m, n, dst, ld, w, rows);
    return;
  }
  const uint16_t* s16 = (const uint16_t*)src + at;
  for (int64_t i = 0; i < rows; i++) {
    uint16_t* o = dst + i * ld;
    int64_t valid = i < m ? n : 0;
    if (valid) memcpy(o, s16 + i * lds, valid * sizeof(uint16_t));
    memset(o + valid, 0, (w - valid) * sizeof(uint16_t));
  }
}
#endif
"""

EXP16 = r"""
#ifndef BRAZE_EXP16
#define BRAZE_EXP16
#if defined(__AVX512F__)
#include <immintrin.h>
#define SPLAT _mm512_set1_ps
/* e^x in 16 lanes for x <= 88 (callers clamp; far below -87 it is 0): 2^n p(r), n = x log2(e)
   rounded, r = x - n ln2 (ln2 in two parts, |r| <= ln2 / 2) and p the degree-7 Taylor
   polynomial (its truncation 5e-9 relative): about an ulp of float32, no call, no table. */
/* e^(x + lo) 2^bias, lo a low part of the argument (bias: a result that would be denormal
   stays normal, for a caller whose last multiply takes 2^-bias off and rounds once). */
static inline __m512 exp16_hl(__m512 x, __m512 lo, float bias) {
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_add_ps(x, lo),
                                                SPLAT(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, SPLAT(0.693359375f), x);
  r = _mm512_add_ps(_mm512_fnmadd_ps(n, SPLAT(-2.12194440e-4f), r), lo);
  __m512 p = SPLAT(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, SPLAT(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, SPLAT(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, SPLAT(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, SPLAT(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, SPLAT(0.5f));
  p = _mm512_fmadd_ps(p, r, SPLAT(1.0f));
  p = _mm512_fmadd_ps(p, r, SPLAT(1.0f));
  return _mm512_scalef_ps(p, _mm512_add_ps(n, SPLAT(bias)));
}

static inline __m512 exp16(__m512 x) { return exp16_hl(x, _mm512_setzero_ps(), 0.0f); }
#endif
#endif
"""

GELU16 = EXP16 + r"""
#ifndef BRAZE_GELU16
#define BRAZE_GELU16
#if defined(__AVX512F__)
/* GELU(x) = x Phi(x) in 16 lanes, Phi the standard normal CDF: codegen.vecmath's bz_geluf
   (its erfc form on both sides: full relative accuracy in the left tail; its polynomial,
   ERFC_Q) in intrinsics, with exp16 and 1 / (1 + z/2) from rcp14 and a Newton step. bz_geluf's
   exp rounds with a 1.5 * 2^23 shift that -ffast-math folds away; these intrinsics keep their
   meaning under it. Phi(-|x|) = t e^(-z^2 + Q(t)) / 2, z = |x| / sqrt 2, t = 1 / (1 + z/2),
   with z^2 carried as hi + lo (FMA) into the exp. */
static inline __m512 gelu16(__m512 x) {
  __m512 ax = _mm512_min_ps(_mm512_abs_ps(x), SPLAT(17.5f));  /* Phi(-17.5) is 0 in float */
  __m512 x2 = _mm512_mul_ps(ax, ax), lo = _mm512_fmsub_ps(ax, ax, x2);
  __m512 d = _mm512_fmadd_ps(ax, SPLAT(0.353553391f), SPLAT(1.0f));
  __m512 t = _mm512_rcp14_ps(d);
  t = _mm512_fmadd_ps(_mm512_fnmadd_ps(d, t, SPLAT(1.0f)), t, t);
  __m512 s = _mm512_sub_ps(t, SPLAT(0.5f)), s2 = _mm512_mul_ps(s, s);
  __m512 s4 = _mm512_mul_ps(s2, s2);
  __m512 c01 = _mm512_fmadd_ps(SPLAT(Q1), s, SPLAT(Q0));
  __m512 c23 = _mm512_fmadd_ps(SPLAT(Q3), s, SPLAT(Q2));
  __m512 c45 = _mm512_fmadd_ps(SPLAT(Q5), s, SPLAT(Q4));
  __m512 c67 = _mm512_fmadd_ps(SPLAT(Q7), s, SPLAT(Q6));
  __m512 c89 = _mm512_fmadd_ps(SPLAT(Q9), s, SPLAT(Q8));
  __m512 q = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_fmadd_ps(SPLAT(Q10), s2, c89), s4,
                                             _mm512_fmadd_ps(c67, s2, c45)),
                             s4, _mm512_fmadd_ps(c23, s2, c01));
  __m512 e = exp16_hl(_mm512_mul_ps(x2, SPLAT(-0.5f)), _mm512_fmadd_ps(lo, SPLAT(-0.5f), q),
                      63.0f);
  __m512 tail = _mm512_mul_ps(t, e);                          /* Phi(-|x|) 2^64 */
  __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  __m512 left = _mm512_mul_ps(_mm512_mul_ps(x, tail), SPLAT(0x1p-64f));
  __m512 right = _mm512_mul_ps(x, _mm512_fnmadd_ps(tail, SPLAT(0x1p-64f), SPLAT(1.0f)));
  return _mm512_mask_blend_ps(neg, right, left);
}

/* GELU_tanh(v) in 16 lanes as v / (1 + e^t), t = -2u, with exp16 and an exact division: a few
   ulps, as the expf form it replaces (libmvec's expf made GPT-2's FFN GEMM ~18% slower than
   with no activation); 0 where t >= 88 (|v| e^-t < 1e-37), so the left tail keeps its
   relative accuracy down to there. t is clamped below at -88 too (1 + e^-88 is 1): exp16 is
   only valid above about -1e12 (its reduction r = t - n ln2 loses its bits there and the
   polynomial overflows to -inf), which t = -2u passes at v ~ 8e4, where GELU_tanh(v) = v
   had come out -0. */
/* y, but NaN where v is -inf: GELU_tanh(-inf) = -inf * 0 is NaN in the reference and PyTorch
   (the quotient forms give 0 or -inf). Constants by their bits (-ffast-math). */
static inline __m512 neg_inf_nan16(__m512 v, __m512 y) {
  __mmask16 ninf = _mm512_cmpeq_epi32_mask(_mm512_castps_si512(v),
                                           _mm512_set1_epi32((int)0xff800000u));
  return _mm512_mask_mov_ps(y, ninf, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
}

static inline __m512 gelu_tanh16(__m512 v) {
  __m512 t = _mm512_mul_ps(v, _mm512_fmadd_ps(_mm512_mul_ps(v, v), SPLAT(-0.0713548162726f),
                                              SPLAT(-1.59576912160573072f)));   /* -2u */
  __mmask16 live = _mm512_cmp_ps_mask(t, SPLAT(88.0f), _CMP_NGE_UQ);  /* a NaN stays NaN */
  __m512 d = _mm512_add_ps(SPLAT(1.0f), exp16(_mm512_max_ps(SPLAT(-88.0f),
                                                            _mm512_min_ps(t, SPLAT(88.0f)))));
  return neg_inf_nan16(v, _mm512_maskz_div_ps(live, v, d));
}

/* y[c] = GELU_tanh(x[c]) (gelu_tanh16) in float32 for c < n (y may be x). */
static inline void gelu_tanh_span(const float* x, float* y, int64_t n) {
  for (int64_t c = 0; c < n; c += 16) {
    __mmask16 m = n - c >= 16 ? 0xffff : (__mmask16)((1u << (n - c)) - 1);
    _mm512_mask_storeu_ps(y + c, m, gelu_tanh16(_mm512_maskz_loadu_ps(m, x + c)));
  }
}
#endif
#endif
"""
for _i, _c in enumerate(ERFC_Q):
    GELU16 = GELU16.replace(f"SPLAT(Q{_i})", f"SPLAT({_c})")

BF16_ROW = GELU16 + r"""
#ifndef BRAZE_BF16_ROW
#define BRAZE_BF16_ROW
#include <immintrin.h>
#if defined(__AVX512F__)
/* v[i] = GELU(v[i]) for n (<= 4) vectors of 16 values: see row_bf16. Each step runs over
   the n vectors before the next, so n independent ~20-op chains interleave (one at a time,
   the chain's latency left the vector units idle: 30 cycles per 16 values, 4 at once 20-22). */
static inline void gelu_erf16_n(__m512* v, const int n) {
  const __m512 one = SPLAT(1.0f);
  __m512 z[4], t[4], p[4], q[4], r[4];
  for (int i = 0; i < n; i++)
    z[i] = _mm512_min_ps(_mm512_mul_ps(_mm512_abs_ps(v[i]), SPLAT(0.70710678118654752f)),
                         SPLAT(3.92f));
  for (int i = 0; i < n; i++) t[i] = _mm512_mul_ps(z[i], z[i]);
  for (int i = 0; i < n; i++) {
    p[i] = _mm512_fmadd_ps(SPLAT(2.050087687e-06f), t[i], SPLAT(2.848568547e-04f));
    q[i] = _mm512_fmadd_ps(SPLAT(3.809036207e-05f), t[i], SPLAT(1.162339468e-03f));
  }
  for (int i = 0; i < n; i++) {
    p[i] = _mm512_fmadd_ps(p[i], t[i], SPLAT(3.764878958e-03f));
    q[i] = _mm512_fmadd_ps(q[i], t[i], SPLAT(1.496774051e-02f));
  }
  for (int i = 0; i < n; i++) {
    p[i] = _mm512_fmadd_ps(p[i], t[i], SPLAT(5.274640024e-02f));
    q[i] = _mm512_fmadd_ps(q[i], t[i], SPLAT(1.141023487e-01f));
  }
  for (int i = 0; i < n; i++) {
    p[i] = _mm512_fmadd_ps(p[i], t[i], SPLAT(1.903905869e-01f));
    q[i] = _mm512_fmadd_ps(q[i], t[i], SPLAT(5.020620227e-01f));
  }
  for (int i = 0; i < n; i++) {
    p[i] = _mm512_fmadd_ps(p[i], t[i], SPLAT(1.128379107e+00f));
    q[i] = _mm512_fmadd_ps(q[i], t[i], one);
  }
  for (int i = 0; i < n; i++) r[i] = _mm512_rcp14_ps(q[i]);   /* 1 / q to 2^-14, */
  for (int i = 0; i < n; i++)                                  /* then one Newton step */
    r[i] = _mm512_fmadd_ps(_mm512_fnmadd_ps(q[i], r[i], one), r[i], r[i]);
  for (int i = 0; i < n; i++) {
    __m512 e = _mm512_min_ps(_mm512_mul_ps(_mm512_mul_ps(z[i], p[i]), r[i]), one);
    e = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(e),   /* erf's sign: v's */
          _mm512_and_si512(_mm512_castps_si512(v[i]), _mm512_set1_epi32((int)0x80000000u))));
    __m512 h = _mm512_mul_ps(v[i], SPLAT(0.5f));
    v[i] = _mm512_fmadd_ps(h, e, h);
  }
}

static inline __m512 gelu_erf16(__m512 v) {
  gelu_erf16_n(&v, 1);
  return v;
}

/* The bf16 nearest (ties to even; NaN kept quiet) to each of 16 f32 values. With AVX512-BF16
   one vcvtneps2bf16 (the GELU epilogue 0.93-0.97x the time), which flushes values below 2^-126
   to zero: so does every bf16 product these values go on to (tdpbf16ps, vdpbf16ps). */
static inline __m256i bf16_round16(__m512 x) {
#if defined(__AVX512BF16__)
  return (__m256i)_mm512_cvtneps_pbh(x);
#else
  __m512i u = _mm512_castps_si512(x);
  __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
  __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                          _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
#endif
}

/* o[c] = bf16(x[c] + bias[c]), or gelu: bf16(GELU(x[c] + bias[c])), for c < n <= 32 (bias
   may be NULL), in one pass. GELU(v) = v (1 +
   erf(v / sqrt 2)) / 2 with erf(z) as z P(z^2) / Q(z^2) on |z| <= 3.92 (erf rounds to 1
   beyond), a rational fit with relative error 1.9e-8 in exact arithmetic, ~7 float32 ulp of
   erf as evaluated (1 / Q from rcp14 and a Newton step). Rounded to bf16 it matches the
   exact GELU but at near ties (~1e-5 of normal inputs with v > -1.5, as libmvec's erff); for
   v < -1.5, 1 + erf cancels as in libmvec's form (absolute error a few ulps of v). No calls
   and no division: libmvec's erff made the GELU epilogue cost up to as much again as a 1024 x
   384 x 1536 product, and a division per 16 values most of what was left. */
static inline void row_bf16(const float* x, const float* bias, uint16_t* o, int64_t n,
                            int gelu) {
  for (int64_t c = 0; c < n; c += 16) {
    __mmask16 m = n - c >= 16 ? 0xffff : (__mmask16)((1u << (n - c)) - 1);
    __m512 v = _mm512_maskz_loadu_ps(m, x + c);
    if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + c));
    _mm256_mask_storeu_epi16(o + c, m, bf16_round16(gelu ? gelu_erf16(v) : v));
  }
}



/* o[c] = bf16(GELU_tanh(x[c] + bias[c])) for c < n (bias may be NULL): the tanh GELU as
   v sigmoid(2u) = v / (1 + e^-2u), u = sqrt(2 / pi) (v + 0.044715 v^3), with exp16 and 1 / (1
   + e) from rcp14 and a Newton step: a few float32 ulps before the rounding to bf16 (libmvec's
   tanhf there made the GEMM ~15% slower than with no activation). */
static inline void gelu_tanh_row_bf16(const float* x, const float* bias, uint16_t* o,
                                      int64_t n) {
  for (int64_t c = 0; c < n; c += 16) {
    __mmask16 m = n - c >= 16 ? 0xffff : (__mmask16)((1u << (n - c)) - 1);
    __m512 v = _mm512_maskz_loadu_ps(m, x + c);
    if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + c));
    __m512 v2 = _mm512_mul_ps(v, v);
    __m512 t = _mm512_mul_ps(v, _mm512_fmadd_ps(v2, SPLAT(-0.0713548162726f),
                                                SPLAT(-1.59576912160573072f)));   /* -2u */
    __m512 d = _mm512_add_ps(SPLAT(1.0f), exp16(_mm512_max_ps(SPLAT(-88.0f),  /* as gelu_tanh16 */
                                                              _mm512_min_ps(t, SPLAT(88.0f)))));
    __m512 r = _mm512_rcp14_ps(d);
    r = _mm512_fmadd_ps(_mm512_fnmadd_ps(d, r, SPLAT(1.0f)), r, r);
    _mm256_mask_storeu_epi16(o + c, m, bf16_round16(neg_inf_nan16(v, _mm512_mul_ps(v, r))));
  }
}

/* row_bf16 with the GELU over a row of n values, four vectors at a time (their chains
   interleaved), the rest as row_bf16 does. */
static inline void gelu_row_bf16(const float* x, const float* bias, uint16_t* o, int64_t n) {
  int64_t c = 0;
  for (; c + 64 <= n; c += 64) {
    __m512 v[4];
    for (int i = 0; i < 4; i++) {
      v[i] = _mm512_loadu_ps(x + c + 16 * i);
      if (bias) v[i] = _mm512_add_ps(v[i], _mm512_loadu_ps(bias + c + 16 * i));
    }
    gelu_erf16_n(v, 4);
    for (int i = 0; i < 4; i++)
      _mm256_storeu_si256((__m256i*)(o + c + 16 * i), bf16_round16(v[i]));
  }
  if (c < n) row_bf16(x + c, bias ? bias + c : 0, o + c, n - c, 1);
}
#endif
#endif
"""

TRANSPOSE16 = r"""
#ifndef BRAZE_TRANSPOSE16
#define BRAZE_TRANSPOSE16
#include <immintrin.h>
#if defined(__AVX512F__)
/* r[x] = column x of the 16 x 16 32-bit matrix whose rows are r[0..15] on entry. */
static inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {   /* t[i + c]'s lane L: column 4 L + c of rows i.. i + 3 */
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; c++) {
    __m512i w0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);
    __m512i w1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);
    __m512i w2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
    __m512i w3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
    t[c] = _mm512_shuffle_i32x4(w0, w2, 0x88);
    t[4 + c] = _mm512_shuffle_i32x4(w1, w3, 0x88);
    t[8 + c] = _mm512_shuffle_i32x4(w0, w2, 0xdd);
    t[12 + c] = _mm512_shuffle_i32x4(w1, w3, 0xdd);
  }
  for (int i = 0; i < 16; i++) r[i] = t[i];
}

#endif
#endif
"""

TRANSPOSE8 = r"""
#ifndef BRAZE_TRANSPOSE8
#define BRAZE_TRANSPOSE8
#include <string.h>
typedef float bz_v8 __attribute__((vector_size(32), aligned(4)));
typedef int32_t bz_v8i __attribute__((vector_size(32)));
/* dst[k * ld_dst + i] = src[i * ld_src + k] for i, k < 8: an 8 x 8 float block transposed in
   registers (rows loaded whole; unpack, shuffle, 128-bit permute; rows stored whole). */
static inline void transpose8x8(const float* src, int64_t ld_src, float* dst, int64_t ld_dst) {
  const bz_v8i lo2 = {0, 8, 1, 9, 4, 12, 5, 13}, hi2 = {2, 10, 3, 11, 6, 14, 7, 15};
  const bz_v8i lo4 = {0, 1, 8, 9, 4, 5, 12, 13}, hi4 = {2, 3, 10, 11, 6, 7, 14, 15};
  const bz_v8i lo8 = {0, 1, 2, 3, 8, 9, 10, 11}, hi8 = {4, 5, 6, 7, 12, 13, 14, 15};
  bz_v8 r[8], u[8], w[8];
  for (int k = 0; k < 8; k++) memcpy(&r[k], src + k * ld_src, 32);
  for (int k = 0; k < 8; k += 2) {
    u[k] = __builtin_shuffle(r[k], r[k + 1], lo2);
    u[k + 1] = __builtin_shuffle(r[k], r[k + 1], hi2);
  }
  for (int k = 0; k < 8; k += 4) {
    w[k] = __builtin_shuffle(u[k], u[k + 2], lo4);
    w[k + 1] = __builtin_shuffle(u[k], u[k + 2], hi4);
    w[k + 2] = __builtin_shuffle(u[k + 1], u[k + 3], lo4);
    w[k + 3] = __builtin_shuffle(u[k + 1], u[k + 3], hi4);
  }
  for (int k = 0; k < 4; k++) {
    bz_v8 a = __builtin_shuffle(w[k], w[k + 4], lo8), b = __builtin_shuffle(w[k], w[k + 4], hi8);
    memcpy(dst + k * ld_dst, &a, 32);
    memcpy(dst + (k + 4) * ld_dst, &b, 32);
  }
}
#endif
"""

NAN_BITS = r"""
#ifndef BRAZE_NAN_BITS
#define BRAZE_NAN_BITS
#include <stdint.h>
#include <string.h>
/* 1 where x is a NaN, read from the bits: the kernels build with -ffast-math, under which
   `x != x` and isnan(x) are taken to be false. Vectorizes in `omp simd` loops. */
static inline int is_nan_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return (u & 0x7fffffffu) > 0x7f800000u;
}

/* max(a, b) that returns a NaN where either is one (NumPy's maximum, the reference's max
   pool). */
static inline float max_nan(float a, float b) {
  return (a > b || is_nan_bits(a)) ? a : b;
}
#endif
"""

REGISTER_TILE = r"""
/* The register tile of braze's packed fp32 GEMM and of the attention core. The includer
   defines VW (floats per vector), NR (columns per block, a multiple of VW), NV = NR / VW and
   the vector type vf. Under AVX-512 a tile is 6 rows x up to QP = 4 blocks of 16 columns (24
   accumulators; per k, 4 vectors of b and one broadcast of a per row: 0.42 loads per FMA,
   against 1.08 for the 12 x 16 tiles they replaced, which ran ~0.75x as fast); under AVX2
   6 x one block of 16 (12 accumulators of 8 floats). */
#if defined(__AVX512F__)
#define QP 4
#else
#define QP 1
#endif

/* c[h, q NR] (row stride ldc) = (add ? c : 0) + start + a[h, kc] @ b[kc, q NR] for h <= 6 rows
   and q <= QP column blocks (constants in each instantiation, so the loops unroll into
   registers). a: row stride lda; block u of b starts ps floats after block u - 1, row stride
   ldb; start: NULL (zeros), or its row i at start + i * lds (lds = 0: one row for all, a
   bias; start = c, lds = ldc: accumulate onto c in one running sum). Rows of a are addressed
   from two bases, so the compiler keeps them in registers (base + lda * {0, 1, 2}). */
static inline __attribute__((always_inline)) void tile_hq(
    int h, int q, int64_t kc, const float* restrict a, int64_t lda, const float* restrict b,
    int64_t ldb, int64_t ps, float* c, int64_t ldc, const float* start, int64_t lds,
    int add) {
  const float* a0 = a;
  const float* a3 = a + 3 * lda;
  vf acc[6][QP * NV];
  #pragma GCC unroll 6
  for (int i = 0; i < h; i++) {
    #pragma GCC unroll 8
    for (int v = 0; v < q * NV; v++)
      acc[i][v] = start ? *(const vf*)(start + i * lds + v * VW) : (vf){0};
  }
  #pragma GCC unroll 2
  for (int64_t k = 0; k < kc; k++) {
    vf bv[QP * NV];
    #pragma GCC unroll 4
    for (int u = 0; u < q; u++) {
      #pragma GCC unroll 4
      for (int v = 0; v < NV; v++) bv[u * NV + v] = *(const vf*)(b + u * ps + k * ldb + v * VW);
    }
    #pragma GCC unroll 6
    for (int i = 0; i < h; i++) {
      float x = i < 3 ? a0[k + i * lda] : a3[k + (i - 3) * lda];
      #pragma GCC unroll 8
      for (int v = 0; v < q * NV; v++) acc[i][v] += x * bv[v];
    }
  }
  #pragma GCC unroll 6
  for (int i = 0; i < h; i++) {
    #pragma GCC unroll 8
    for (int v = 0; v < q * NV; v++) {
      vf* cv = (vf*)(c + i * ldc + v * VW);
      *cv = add ? *cv + acc[i][v] : acc[i][v];
    }
  }
}
"""

ACT_SPAN = GELU16 + r"""
#if defined(__AVX512F__)
/* 1 / (1 + e^(-a v)) in 16 lanes, with exp16 and 1 / (1 + e) from rcp14 and a Newton step:
   a few float32 ulps, at ~1/3 the cost of libmvec's expf and a division (a K = 32 1x1 conv
   with SiLU took twice its time without); 0 where -a v >= 88, as the scalar forms. SiLU (a 1,
   times v), sigmoid (a 1) and quick GELU (a 1.702, times v) are built on it. */
static inline __m512 sigmoid16(__m512 v, float a) {
  __m512 t = _mm512_mul_ps(v, SPLAT(-a));
  /* a NaN stays NaN: unordered counts as live, and the clamps take t as their second operand
     (vminps / vmaxps return a NaN second operand) */
  __mmask16 live = _mm512_cmp_ps_mask(t, SPLAT(88.0f), _CMP_NGE_UQ);
  t = _mm512_max_ps(SPLAT(-88.0f), _mm512_min_ps(SPLAT(88.0f), t));  /* 1 + e^-88 is 1 */
  __m512 d = _mm512_add_ps(SPLAT(1.0f), exp16(t));
  __m512 r = _mm512_rcp14_ps(d);
  return _mm512_maskz_mov_ps(live, _mm512_fmadd_ps(_mm512_fnmadd_ps(d, r, SPLAT(1.0f)), r, r));
}

/* act(v) for the acts sigmoid16 computes: SiLU (3), sigmoid (5), quick GELU (7). */
static inline __m512 sigmoid_act16(__m512 v, int act) {
  __m512 r = sigmoid16(v, act == 7 ? 1.702f : 1.0f);
  return act == 5 ? r : _mm512_mul_ps(v, r);
}

/* act(v) in 16 lanes for every act code but tanh (ACT16_OK): in registers, for stores that
   apply the epilogue on the way out; the same forms as act_span. */
#define ACT16_OK(act) ((act) != 6)
static inline __m512 act16(__m512 v, int act) {
  switch (act) {
    case 1: return gelu16(v);
    case 2: return gelu_tanh16(v);
    case 3: case 5: case 7: return sigmoid_act16(v, act);
    case 4: return _mm512_max_ps(_mm512_setzero_ps(), v);  /* vmaxps gives a NaN 2nd operand */
    case 8: return _mm512_mul_ps(v, _mm512_mul_ps(_mm512_min_ps(_mm512_max_ps(
        _mm512_add_ps(v, SPLAT(3.0f)), _mm512_setzero_ps()), SPLAT(6.0f)), SPLAT(1.0f / 6.0f)));
    case 9: return _mm512_min_ps(SPLAT(6.0f), _mm512_max_ps(_mm512_setzero_ps(), v));
    default: return v;
  }
}

/* y[i] = (times_v ? v : 1) sigmoid16(v, a), v = x[i], over n values (y may be x). */
static inline void sigmoid_span(const float* x, float* y, int64_t n, float a, int times_v) {
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
    __m512 v = _mm512_maskz_loadu_ps(m, x + i), r = sigmoid16(v, a);
    _mm512_mask_storeu_ps(y + i, m, times_v ? _mm512_mul_ps(v, r) : r);
  }
}
#define SIGMOID_SPAN(a, times_v) { sigmoid_span(src, y, n, a, times_v); break; }
#endif
/* The act codes whose function has an exp, tanh or erf in it: ~10x a copy's work per value. */
#define ACT_HEAVY(act) ((act) == 1 || (act) == 2 || (act) == 3 || (act) == 5 || (act) == 6 || \
                        (act) == 7)
/* y[i] = act(x[i] (+ bias[i])) over n values (y may be x; bias may be NULL). The switch is
   outside the loops, so each loop vectorizes on its own (libmvec's expf / tanhf / erff; GELU
   on gelu16, the tanh GELU on gelu_tanh16, SiLU, sigmoid and quick GELU on sigmoid_span under
   AVX-512). The tanh GELU is v / (1 + e^-2u) = v sigmoid(2u): the same function at half the
   cost of tanhf, with no cancellation in the left tail. Under -ffast-math libmvec's expf
   returns NaN, not inf, past its range (e^88.7): SiLU, sigmoid, quick GELU and the tanh GELU
   select their limit (0) where exp would overflow. */
#define ACT_LOOP(EXPR) { _Pragma("omp simd") for (int64_t i = 0; i < n; i++) { \
    float v = src[i]; y[i] = (EXPR); } break; }
static void act_span(const float* x, const float* bias, float* y, int64_t n, int act) {
  const float* src = x;
  if (bias) {
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = x[i] + bias[i];
    src = y;
  }
  switch (act) {
#if defined(__AVX512F__)
    case 2: gelu_tanh_span(src, y, n); break;
    case 1: {
      for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, gelu16(_mm512_maskz_loadu_ps(m, src + i)));
      }
      break;
    }
    case 3: SIGMOID_SPAN(1.0f, 1)
    case 5: SIGMOID_SPAN(1.0f, 0)
    case 7: SIGMOID_SPAN(1.702f, 1)
    case 4: case 9:   /* act16's relu / relu6 keep a NaN (the scalar forms under fast-math not) */
      for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(y + i, m, act16(_mm512_maskz_loadu_ps(m, src + i), act));
      }
      break;
#else
    case 2: ACT_LOOP(-1.59576912160573072f * (v + 0.044715f * v * v * v) < 88.0f ?
                     v / (1.0f + expf(-1.59576912160573072f * (v + 0.044715f * v * v * v))) :
                     0.0f)
    case 1: ACT_LOOP(0.5f * v * (1.0f + erff(v * 0.70710678118654752f)))
    case 3: ACT_LOOP(v < -88.0f ? -0.0f : v / (1.0f + expf(-v)))
    case 5: ACT_LOOP(v < -88.0f ? 0.0f : 1.0f / (1.0f + expf(-v)))
    case 7: ACT_LOOP(v < -52.0f ? -0.0f : v / (1.0f + expf(-1.702f * v)))
    case 4: ACT_LOOP(v > 0.0f ? v : 0.0f)
    case 9: ACT_LOOP(v < 0.0f ? 0.0f : (v > 6.0f ? 6.0f : v))
#endif
    case 6: ACT_LOOP(tanhf(v))
    case 8: ACT_LOOP(v * fminf(fmaxf(v + 3.0f, 0.0f), 6.0f) / 6.0f)
    default: if (src != y) ACT_LOOP(v)
  }
}
"""
