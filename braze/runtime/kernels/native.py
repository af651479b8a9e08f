"""Hand-written C kernels (float32) for what BLAS does not do: matmul epilogues (bias +
activation in place), row norms (LayerNorm / RMSNorm, with a residual add and its sum exposed),
safe softmax rows, RoPE, gated activations. Compiled once per machine by codegen.cc (OpenMP
across rows; activations through c_snippets.ACT_SPAN: AVX-512 vector math for GELU, SiLU,
sigmoid, libmvec for tanhf and elsewhere; max error a few ulp, tested against float64 and the
interpreter).
`lib()` is None without a C compiler; the kernels then fall back to NumPy."""
from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

from ..address import address
from ..codegen import cc
from .c_snippets import ACT_SPAN, NAN_BITS, ROPE_ROW, TO_BF16

__all__ = ["lib", "ptr", "fptr"]

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <float.h>
#include <omp.h>
""" + cc.simd_math_decls() + cc.parallel_min_define() + ROPE_ROW + TO_BF16 + NAN_BITS + r"""

void braze_set_threads(int n) { if (n > 0) omp_set_num_threads(n); }
int braze_max_threads(void) { return omp_get_max_threads(); }

""" + ACT_SPAN + r"""/* y[r, c] = act(y[r, c] + bias[c]), in place; bias may be NULL. */
void bias_act(float* y, const float* bias, int64_t rows, int64_t cols, int act) {
  #pragma omp parallel for schedule(static) if(rows * cols > BRAZE_PAR_MIN)
  for (int64_t r = 0; r < rows; r++) act_span(y + r * cols, bias, y + r * cols, cols, act);
}

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float*, int, const float*,
                         int, float, float*, int);

/* out[m, n] = act(a[m, k] @ b + bias) in one OpenMP region: b is [k, n] (trans_b = 0) or its
   transpose [n, k] (trans_b = 1), `gemm` a cblas_sgemm. The output is cut into tiles (row
   blocks of up to 256 rows x column blocks of n / (4 threads), >= 64 wide) handed out
   dynamically: each thread runs the (then single-threaded) sgemm on a tile and applies the
   epilogue to it while it is in cache, and a thread the OS delays on a busy machine leaves
   its tiles to the others instead of holding up a static half. Below BRAZE_PAR_MIN_MACS
   multiply-adds the calling thread runs every tile alone, MKL too (outside an active region
   MKL threads even a 16x64x64 GEMM): `local_threads` is MKL_Set_Num_Threads_Local (may be
   NULL). bias may be NULL. */
void gemm_bias_act(void* gemm, void* local_threads, const float* a, int64_t lda, const float* b,
                   int64_t ldb, int trans_b, float* out, int64_t m, int64_t n, int64_t k,
                   const float* bias, int act) {
  sgemm_fn sgemm = (sgemm_fn)gemm;
  int (*local)(int) = (int (*)(int))local_threads;
  int64_t nt = omp_get_max_threads();
  int64_t rb = m < 256 ? m : 256;
  int64_t cb = (n / (4 * nt) + 15) / 16 * 16;
  if (cb < 64) cb = 64;
  if (cb > n) cb = n;
  int64_t rows = (m + rb - 1) / rb, cols = (n + cb - 1) / cb;
  int parallel = BRAZE_PARALLEL(m * n * k, BRAZE_PAR_MIN_MACS);
  int before = !parallel && local ? local(1) : 0;
  #pragma omp parallel for schedule(dynamic, 1) if(parallel && rows * cols > 1)
  for (int64_t tile = 0; tile < rows * cols; tile++) {
    int64_t r0 = tile / cols * rb, j0 = tile % cols * cb;
    int64_t r1 = r0 + rb < m ? r0 + rb : m, j1 = j0 + cb < n ? j0 + cb : n;
    const float* bs = trans_b ? b + j0 * ldb : b + j0;
    sgemm(101, 111, trans_b ? 112 : 111, (int)(r1 - r0), (int)(j1 - j0), (int)k, 1.0f,
          a + r0 * lda, (int)lda, bs, (int)ldb, 0.0f, out + r0 * n + j0, (int)n);
    if (bias || act) {
      for (int64_t r = r0; r < r1; r++) {
        float* row = out + r * n + j0;
        act_span(row, bias ? bias + j0 : 0, row, j1 - j0, act);
      }
    }
  }
  if (!parallel && local) local(before);
}

/* out[i] = a[i] @ b[i] for i < batch (a [m, k] rows lda apart, each matrix sa floats after the
   last; b [k, n] rows ldb apart, or read transposed (trans_b: [n, k]), sb apart; out [m, n]
   contiguous, m * n apart): the batch split over the OpenMP threads, one sequential sgemm
   per matrix (attention-like products of activations: 12 heads of 128 x 64 x 256 ran as 12
   two-thread MKL calls one after another); fewer matrices than threads run gemm_bias_act's
   tiles one matrix at a time. */
void batched_gemm(void* gemm, void* local_threads, const float* a, int64_t sa, int64_t lda,
                  const float* b, int64_t sb, int64_t ldb, int trans_b, float* out, int64_t m,
                  int64_t n, int64_t k, int64_t batch) {
  sgemm_fn sgemm = (sgemm_fn)gemm;
  int (*local)(int) = (int (*)(int))local_threads;
  int64_t nt = omp_get_max_threads();
  if (batch < nt) {
    for (int64_t i = 0; i < batch; i++)
      gemm_bias_act(gemm, local_threads, a + i * sa, lda, b + i * sb, ldb, trans_b,
                    out + i * m * n, m, n, k, 0, 0);
    return;
  }
  int parallel = BRAZE_PARALLEL(batch * m * n * k, BRAZE_PAR_MIN_MACS);
  int before = local ? local(1) : 0;
  #pragma omp parallel for schedule(dynamic, 1) if(parallel)
  for (int64_t i = 0; i < batch; i++)
    sgemm(101, 111, trans_b ? 112 : 111, (int)m, (int)n, (int)k, 1.0f, a + i * sa, (int)lda,
          b + i * sb, (int)ldb, 0.0f, out + i * m * n, (int)n);
  if (local) local(before);
}

/* out = act(x) elementwise over n values; both threads from BRAZE_PAR_MIN / 8 values on for
   an activation with an exp, tanh or erf in it (compute-bound: SegFormer's 401K-value GELUs
   ran at 10 GB/s on one thread), BRAZE_PAR_MIN for the others. */
void unary_act(const float* x, float* out, int64_t n, int act) {
  int64_t chunk = 4096;
  #pragma omp parallel for schedule(static) if(BRAZE_PARALLEL(n * (ACT_HEAVY(act) ? 8 : 1), \
                                                              BRAZE_PAR_MIN))
  for (int64_t i = 0; i < n; i += chunk)
    act_span(x + i, 0, out + i, n - i < chunk ? n - i : chunk, act);
}

/* Row norm over `cols` values: s = x (+ res); LayerNorm (rms = 0) or RMSNorm (rms = 1);
   y = norm(s) * gamma + beta (gamma / beta may be NULL); sum_out (may be NULL) gets s. Row r
   reads residual row r % res_rows (a residual repeated over leading axes: res_rows < rows). */
void row_norm(const float* x, const float* res, const float* gamma, const float* beta,
              float* y, float* sum_out, int64_t rows, int64_t cols, int64_t res_rows,
              float eps, int rms) {
  #pragma omp parallel for schedule(static) if(rows * cols >= BRAZE_NORM_PAR_MIN)
  for (int64_t r = 0; r < rows; r++) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float* sr = sum_out ? sum_out + r * cols : yr;
    double mean = 0.0, sq = 0.0;
    if (res) {
      const float* rr = res + (r % res_rows) * cols;
      for (int64_t c = 0; c < cols; c++) { float s = xr[c] + rr[c]; sr[c] = s; mean += s; }
      xr = sr;
    } else {
      for (int64_t c = 0; c < cols; c++) mean += xr[c];
    }
    mean = rms ? 0.0 : mean / (double)cols;
    for (int64_t c = 0; c < cols; c++) { double d = xr[c] - mean; sq += d * d; }
    float inv = (float)(1.0 / sqrt(sq / (double)cols + (double)eps));
    float m = (float)mean;
    #pragma omp simd
    for (int64_t c = 0; c < cols; c++) {
      float v = (xr[c] - m) * inv;
      if (gamma) v *= gamma[c];
      if (beta) v += beta[c];
      yr[c] = v;
    }
  }
}

/* GroupNorm: each row of cg * spatial values (one group of one image: its cg channels'
   planes, contiguous in NCHW) normalized by its own mean and variance, then channel c =
   (r % groups) * cg + k scaled by gamma[c] and shifted by beta[c] (either may be NULL) in one
   pass: y = (x - mean) * (rstd * gamma[c]) + beta[c]. */
void group_norm(const float* x, const float* gamma, const float* beta, float* y, int64_t rows,
                int64_t groups, int64_t cg, int64_t spatial, float eps) {
  int64_t cols = cg * spatial;
  #pragma omp parallel for schedule(static) if(rows * cols >= BRAZE_NORM_PAR_MIN)
  for (int64_t r = 0; r < rows; r++) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    double mean = 0.0, sq = 0.0;
    for (int64_t i = 0; i < cols; i++) mean += xr[i];
    mean /= (double)cols;
    for (int64_t i = 0; i < cols; i++) { double d = xr[i] - mean; sq += d * d; }
    float inv = (float)(1.0 / sqrt(sq / (double)cols + (double)eps)), m = (float)mean;
    for (int64_t k = 0; k < cg; k++) {
      int64_t c = (r % groups) * cg + k;
      float a = gamma ? inv * gamma[c] : inv, b = beta ? beta[c] : 0.0f;
      const float* xs = xr + k * spatial;
      float* ys = yr + k * spatial;
      #pragma omp simd
      for (int64_t i = 0; i < spatial; i++) ys[i] = (xs[i] - m) * a + b;
    }
  }
}

/* out[o, j, i] = x[o, k, i], k = idx[o % idx_outer, j, i] (k + n when negative), for o <
   outer, j < m, i < inner: x [outer, n, inner], out [outer, m, inner], idx [idx_outer, m,
   inner] (idx_outer < outer: an index repeated over leading axes, read from cache);
   elements of `elem` bytes (4 or 8), indices int64 (idx64) or int32. Returns 0, or 1 when an
   index is outside [-n, n) (out is then incomplete). */
/* A gathered element costs ~2 ns on one core (scalar loads, the bounds test), ~8x a copied
   one: both threads from 64K elements (DeBERTa's [12, 128, 128] gathers had run on one thread
   under BRAZE_PAR_MIN, 0.37 ms each against 0.15 on two). */
#define GATHER_PAR_MIN (1LL << 16)
__attribute__((optimize("no-tree-vectorize")))  /* scalar loads: AVX-512 gathers ran slower */
int gather_elements(const void* x, const void* idx, void* out, int64_t outer, int64_t n,
                    int64_t m, int64_t inner, int elem, int idx64, int64_t idx_outer) {
  int bad = 0;
  if (inner == 1) {  /* along the last axis (DeBERTa's position scores): a row gather */
#define GATHER_ROWS(T, I) { \
    _Pragma("omp parallel for schedule(static) if(outer * m > GATHER_PAR_MIN) reduction(|:bad)") \
    for (int64_t o = 0; o < outer; o++) { \
      const T* restrict xr = (const T*)x + o * n; \
      const I* restrict ir = (const I*)idx + o % idx_outer * m; \
      T* restrict orow = (T*)out + o * m; \
      uint64_t over = 0; \
      for (int64_t j = 0; j < m; j++) { \
        int64_t k = (int64_t)ir[j]; k += (k >> 63) & n; \
        uint64_t out_of = (uint64_t)k >= (uint64_t)n; over |= out_of; \
        orow[j] = xr[out_of ? 0 : k]; } \
      bad |= over != 0; } }
    if (elem == 4 && idx64) GATHER_ROWS(uint32_t, int64_t)
    else if (elem == 4) GATHER_ROWS(uint32_t, int32_t)
    else if (idx64) GATHER_ROWS(uint64_t, int64_t)
    else GATHER_ROWS(uint64_t, int32_t)
#undef GATHER_ROWS
    return bad;
  }
  #pragma omp parallel for schedule(static) if(outer * m * inner > GATHER_PAR_MIN) \
      reduction(|:bad)
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t j = 0; j < m; j++) {
      int64_t r = (o * m + j) * inner, ri = (o % idx_outer * m + j) * inner;
      const int64_t* i64 = (const int64_t*)idx + ri;
      const int32_t* i32 = (const int32_t*)idx + ri;
      for (int64_t i = 0; i < inner; i++) {
        int64_t k = idx64 ? i64[i] : (int64_t)i32[i];
        k += k < 0 ? n : 0;
        if (k < 0 || k >= n) { bad = 1; continue; }
        int64_t at = (o * n + k) * inner + i;
        if (elem == 4) ((uint32_t*)out)[r + i] = ((const uint32_t*)x)[at];
        else ((uint64_t*)out)[r + i] = ((const uint64_t*)x)[at];
      }
    }
  }
  return bad;
}

/* Running sums along the middle axis of x viewed as [outer, n, inner] into y (not x): y at k =
   y at the previous position + x at k (exclusive: + x at the previous position, the first
   0), from the end when `reverse`. `kind`: 0 float, 1 double, 2 int32, 3 int64; integers
   add as unsigned (two's complement wrap, as NumPy's). The sums run in NumPy's order. */
void cumsum(const void* x, void* y, int64_t outer, int64_t n, int64_t inner, int kind,
            int exclusive, int reverse) {
#define CUMSUM(T, A) { const T* xs = (const T*)x; T* ys = (T*)y; \
    _Pragma("omp parallel for schedule(static) if(outer * n * inner > BRAZE_PAR_MIN)") \
    for (int64_t o = 0; o < outer; o++) { \
      const T* xo = xs + o * n * inner; T* yo = ys + o * n * inner; \
      int64_t first = reverse ? n - 1 : 0, step = reverse ? -1 : 1; \
      for (int64_t i = 0; i < inner; i++) \
        yo[first * inner + i] = exclusive ? (T)0 : xo[first * inner + i]; \
      for (int64_t t = 1; t < n; t++) { \
        int64_t k = first + t * step, p = k - step, src = exclusive ? p : k; \
        for (int64_t i = 0; i < inner; i++) \
          yo[k * inner + i] = (T)((A)yo[p * inner + i] + (A)xo[src * inner + i]); } } }
  if (n <= 0) return;
  if (kind == 0) CUMSUM(float, float)
  else if (kind == 1) CUMSUM(double, double)
  else if (kind == 2) CUMSUM(int32_t, uint32_t)
  else CUMSUM(int64_t, uint64_t)
#undef CUMSUM
}

/* Safe softmax of `rows` rows of `cols` (a row of only -inf gives zeros; a row with a NaN
   NaN, as the reference), out may be in. */
void softmax_rows(const float* x, float* y, int64_t rows, int64_t cols) {
  #pragma omp parallel for schedule(static) if(rows * cols > BRAZE_PAR_MIN)
  for (int64_t r = 0; r < rows; r++) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float mx = -INFINITY;
    for (int64_t c = 0; c < cols; c++) mx = xr[c] > mx ? xr[c] : mx;
    if (mx == -INFINITY) {   /* only -inf, or NaN among them (the max skips a NaN) */
      int nan = 0;
      for (int64_t c = 0; c < cols; c++) nan |= is_nan_bits(xr[c]);
      for (int64_t c = 0; c < cols; c++) yr[c] = nan ? NAN : 0.0f;
      continue;
    }
    float total = 0.0f;
    #pragma omp simd reduction(+:total)   /* a NaN reaches total through expf */
    for (int64_t c = 0; c < cols; c++) { float e = expf(xr[c] - mx); yr[c] = e; total += e; }
    float inv = 1.0f / total;
    #pragma omp simd
    for (int64_t c = 0; c < cols; c++) yr[c] *= inv;
  }
}

/* Safe softmax over the middle axis of x viewed as [outer, n, inner] (inner > 1: a softmax
   over a non-last axis), in blocks of up to 256 inner columns, each a vector loop over the n
   rows: a column of only -inf gives zeros, one with a NaN NaN; out may be x. */
void softmax_strided(const float* x, float* y, int64_t outer, int64_t n, int64_t inner) {
  int64_t blocks = (inner + 255) / 256;
  #pragma omp parallel for schedule(static) if(outer * n * inner > BRAZE_PAR_MIN)
  for (int64_t t = 0; t < outer * blocks; t++) {
    int64_t o = t / blocks, i0 = t % blocks * 256;
    int64_t w = inner - i0 < 256 ? inner - i0 : 256;
    const float* xo = x + o * n * inner + i0;
    float* yo = y + o * n * inner + i0;
    float mx[256], inv[256];
    int nan[256];
    for (int64_t i = 0; i < w; i++) { mx[i] = -INFINITY; inv[i] = 0.0f; nan[i] = 0; }
    for (int64_t k = 0; k < n; k++) {
      #pragma omp simd
      for (int64_t i = 0; i < w; i++) {
        float v = xo[k * inner + i];
        mx[i] = v > mx[i] ? v : mx[i];
        nan[i] |= is_nan_bits(v);
      }
    }
    for (int64_t k = 0; k < n; k++) {
      #pragma omp simd
      for (int64_t i = 0; i < w; i++) {
        float e = mx[i] == -INFINITY || nan[i] ? 0.0f : expf(xo[k * inner + i] - mx[i]);
        yo[k * inner + i] = e;
        inv[i] += e;
      }
    }
    for (int64_t i = 0; i < w; i++)
      inv[i] = nan[i] ? NAN : mx[i] == -INFINITY ? 0.0f : 1.0f / inv[i];
    for (int64_t k = 0; k < n; k++) {
      #pragma omp simd
      for (int64_t i = 0; i < w; i++) yo[k * inner + i] *= inv[i];
    }
  }
}

/* RoPE on x viewed as [outer, s, d] rows (outer = batch * heads), cos / sin [s, n_rot / 2]. */
void rope(const float* x, const float* cosv, const float* sinv, float* y, int64_t outer,
          int64_t s, int64_t d, int64_t n_rot, int interleaved) {
  int64_t h = n_rot / 2;
  #pragma omp parallel for collapse(2) schedule(static) if(outer * s * d > BRAZE_PAR_MIN)
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t p = 0; p < s; p++) {
      const float* xr = x + (o * s + p) * d;
      float* yr = y + (o * s + p) * d;
      rope_row(xr, yr, cosv + p * h, sinv + p * h, h, interleaved);
      for (int64_t i = n_rot; i < d; i++) yr[i] = xr[i];
    }
  }
}

/* out[r, :n] = act(gate) * up, the halves of h[r, :2n] (gate first or second): f32, or (out16)
   rounded to bf16 (nearest even), the bf16 policy's rounding of the next GEMM's operand. */
void gated(const float* h, void* out, int64_t rows, int64_t n, int gate_first, int act,
           int out16) {
  #pragma omp parallel if(rows * n > BRAZE_PAR_MIN)
  {
    float buf[512];
    #pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
      const float* g = h + r * 2 * n + (gate_first ? 0 : n);
      const float* u = h + r * 2 * n + (gate_first ? n : 0);
      for (int64_t c0 = 0; c0 < n; c0 += 512) {
        int64_t w = n - c0 < 512 ? n - c0 : 512;
        float* o = out16 ? buf : (float*)out + r * n + c0;
        act_span(g + c0, 0, o, w, act);
        #pragma omp simd
        for (int64_t i = 0; i < w; i++) o[i] *= u[c0 + i];
        if (out16) round_rows(buf, w, 1, w, (uint16_t*)out + r * n + c0, w, w, 1);
      }
    }
  }
}
"""

_I64, _F32, _INT, _P = ctypes.c_int64, ctypes.c_float, ctypes.c_int, ctypes.c_void_p
_SIGNATURES = {
    "braze_set_threads": [_INT],
    "braze_max_threads": ([], _INT),
    "bias_act": [_P, _P, _I64, _I64, _INT],
    "gemm_bias_act": [_P, _P, _P, _I64, _P, _I64, _INT, _P, _I64, _I64, _I64, _P, _INT],
    "batched_gemm": [_P, _P, _P, _I64, _I64, _P, _I64, _I64, _INT, _P, _I64, _I64, _I64, _I64],
    "unary_act": [_P, _P, _I64, _INT],
    "row_norm": [_P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _F32, _INT],
    "group_norm": [_P, _P, _P, _P, _I64, _I64, _I64, _I64, _F32],
    "softmax_rows": [_P, _P, _I64, _I64],
    "softmax_strided": [_P, _P, _I64, _I64, _I64],
    "cumsum": [_P, _P, _I64, _I64, _I64, _INT, _INT, _INT],
    "rope": [_P, _P, _P, _P, _I64, _I64, _I64, _I64, _INT],
    "gated": [_P, _P, _I64, _I64, _INT, _INT, _INT],
    "gather_elements": ([_P, _P, _P, _I64, _I64, _I64, _I64, _INT, _INT, _I64], _INT),
}


@cache
def lib():
    """The compiled kernel library, or None when no C compiler is available."""
    return cc.load_library(SOURCE, "braze_native", _SIGNATURES)


def ptr(a: np.ndarray | None):
    """The data pointer of a C-contiguous float32 array (None passes NULL)."""
    return None if a is None else address(a)


def fptr(a: np.ndarray | None):
    if a is None:
        return None
    if a.dtype != np.float32 or not a.flags.c_contiguous:
        raise ValueError("native kernels take C-contiguous float32 arrays")
    return address(a)
