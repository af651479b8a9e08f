"""braze's bf16 GEMM on AVX512-BF16 dot products (`vdpbf16ps`), for the mixed-precision policy
on CPUs with AVX512-BF16 and no AMX (AMD Zen 4 and later, Intel Cooper Lake).

There, MKL's `cblas_gemm_bf16bf16f32` does not reach the bf16 units: on the 2-core Zen 4 VM
of 2026-11-28 it ran BERT-base's GEMMs at ~145 GFLOP/s against ~200 for braze's f32 kernel,
so the bf16 policy ran slower than f32 (BERT-base b1 162 ms against 118). One `vdpbf16ps`
does 32 multiply-adds (16 lanes x a pair of k), twice an f32 FMA's, so the bf16 GEMM can
run at up to twice the f32 rate.

Layout and blocking mirror braze's f32 kernel (packed_gemm.py):
- The weight (its values bf16 numbers: the policy rounded them) is packed once into panels of
  16 columns, pairs of k interleaved per column (`[pair][column][2]`, one 64-byte vector per
  pair), K blocks of KC values outermost and the panels within, zero padded to an even k and
  a whole last panel: about the weight's bf16 size.
- A call rounds the operand to bf16 (nearest even) into a scratch of rows padded to an even
  k, or reads bf16 values handed over by the step before in place (k even).
- The output is cut into tiles (a block of up to MC rows x QP = 4 panels, 64 columns) handed
  out dynamically over the OpenMP threads. Per tile and K block the micro-kernel runs down the
  rows, MR = 6 at a time: 24 accumulators, per pair of k 4 weight vectors and one broadcast
  of the operand's pair per row, into the tile's f32 output in the thread's scratch.
- The finished tile goes to `out` through the epilogue: bias + activation (c_snippets.ACT_SPAN,
  the code every kernel uses), optionally rounded to bf16 for the next GEMM (the bf16
  hand-off: bias, GELU and rounding in one vector pass per row with the AMX kernel's
  rational erf, or the tanh GELU with a vector exp: c_snippets.BF16_ROW), or gated: act(gate) *
  up on a weight packed by packed_gemm.gate_up_pairs.

Products of bf16 values are exact in f32 and the sums run in f32 (vdpbf16ps flushes
subnormal inputs and results, as AMX's tdpbf16ps does): the policy's numbers up to the order
of the sums. Needs a CPU with AVX512-BF16 and a C compiler that targets it (`available()`).
On the Zen 4 VM it ran 330-410 GFLOP/s at BERT-base shapes (128-1024 rows; the `vdpbf16ps`
peak there is 468 on 2 threads). The micro-kernel (DP_MICRO, dot_micro.py's template) also
runs attention_dp's core and conv_dp's convs."""
from __future__ import annotations

import ctypes
import threading
from functools import cache

import numpy as np

from ..address import address
from ..codegen import cc
from ..plan import aligned_empty
from . import c_snippets
from .amx_gemm import BF16, OwnWeight, fits
from .dot_micro import DP_MICRO

__all__ = ["available", "DpWeight", "gemm", "scratch_elems", "DP_MICRO"]


SOURCE = c_snippets.ACT_SPAN.join((r"""
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#include <immintrin.h>
""" + cc.simd_math_decls() + c_snippets.TO_BF16 + c_snippets.BF16_ROW + DP_MICRO, r"""
#define NR DP_NR
#define QP DP_QP   /* panels per tile */
#define MR DP_MR
#define KC 256  /* k values per K block: a block of a tile's 4 panels is 32 KiB */
#define MC 192  /* rows per tile at most */
#define LDC_T (QP * NR + 16)   /* the tile scratch's row stride (floats) */
#define SCRATCH_FLOATS (MC * LDC_T + MC * QP * NR / 2)   /* per thread: the tile, its gates */
#define GELU_ERF """ + str(c_snippets.ACT_CODES["gelu"]) + r"""
#define GELU_APPROX """ + str(c_snippets.ACT_CODES["gelu_approx"]) + r"""

/* Where panel p's K block starting at k0 (even) starts in the packed weight (uint16 units):
   K blocks one after the other, the panels within, each [pairs][NR][2]. */
static inline int64_t panel_at(int64_t p, int64_t k0, int64_t kp, int64_t panels) {
  int64_t kc = kp - k0 < KC ? kp - k0 : KC;
  return k0 * panels * NR + p * kc * NR;
}

int64_t dp_packed_elems(int64_t k, int64_t n) {
  return (k + 1) / 2 * 2 * ((n + NR - 1) / NR * NR);
}

/* w [k, n] f32 (bf16 values; rounded to nearest even all the same) -> the packed layout. */
void dp_pack(const float* w, int64_t k, int64_t n, uint16_t* out) {
  int64_t kp = (k + 1) / 2 * 2, panels = (n + NR - 1) / NR;
  const uint32_t* u = (const uint32_t*)w;
  #pragma omp parallel for collapse(2) schedule(static)
  for (int64_t k0 = 0; k0 < kp; k0 += KC)
    for (int64_t p = 0; p < panels; p++) {
      int64_t kc = kp - k0 < KC ? kp - k0 : KC;
      uint16_t* dst = out + panel_at(p, k0, kp, panels);
      for (int64_t i = 0; i < kc / 2; i++)
        for (int64_t j = 0; j < NR; j++)
          for (int h = 0; h < 2; h++) {
            int64_t kk = k0 + 2 * i + h, col = p * NR + j;
            dst[(i * NR + j) * 2 + h] = kk < k && col < n ? to_bf16(u[kk * n + col]) : 0;
          }
    }
}

#if defined(__AVX512BF16__)
/* A tile's f32 rows (ct, row stride LDC_T, `width` columns from column j0 of the product)
   through the epilogue into out (row stride ldo, f32 or, out16, bf16): bias + act, or gated
   (the tile's panels gate / up pairs: act(gate) * up into the pair's output columns, `cols`
   of them valid from the tile's first output column; the gates of all rows gathered into
   `gates` first, so that the activation runs as one span, not 16 values at a time). */
static void epilogue(float* ct, int64_t rows, int64_t width, const float* bias, int act,
                     int gated, void* out, int out16, int64_t ldo, int64_t cols, float* gates) {
  int64_t half = width / 2;   /* a gated tile's output columns */
  if (gated && ACT16_OK(act)) {   /* one pass: act(gate) * up in registers */
    for (int64_t i = 0; i < rows; i++) {
      const float* t = ct + i * LDC_T;
      for (int64_t q = 0; q * NR < cols; q++) {
        __mmask16 m = cols - q * NR >= NR ? 0xffff : (__mmask16)((1u << (cols - q * NR)) - 1);
        __m512 g = _mm512_loadu_ps(t + 2 * q * NR), u = _mm512_loadu_ps(t + (2 * q + 1) * NR);
        if (bias) {
          g = _mm512_add_ps(g, _mm512_loadu_ps(bias + 2 * q * NR));
          u = _mm512_add_ps(u, _mm512_loadu_ps(bias + (2 * q + 1) * NR));
        }
        __m512 v = _mm512_mul_ps(act16(g, act), u);
        if (out16) _mm256_mask_storeu_epi16((uint16_t*)out + i * ldo + q * NR, m,
                                            bf16_round16(v));
        else _mm512_mask_storeu_ps((float*)out + i * ldo + q * NR, m, v);
      }
    }
    return;
  }
  if (gated) {
    for (int64_t i = 0; i < rows; i++) {
      float* t = ct + i * LDC_T;
      for (int64_t q = 0; q < half / NR; q++) {
        float* gate = t + 2 * q * NR;
        float* up = gate + NR;
        float* g = gates + i * half + q * NR;
        #pragma omp simd
        for (int c = 0; c < NR; c++) {
          g[c] = gate[c] + (bias ? bias[2 * q * NR + c] : 0.0f);
          up[c] += bias ? bias[2 * q * NR + NR + c] : 0.0f;
        }
      }
    }
    act_span(gates, 0, gates, rows * half, act);
  }
  for (int64_t i = 0; i < rows; i++) {
    float* t = ct + i * LDC_T;
    if (gated) {
      for (int64_t q = 0; q < half / NR; q++) {
        const float* g = gates + i * half + q * NR;
        const float* up = t + (2 * q + 1) * NR;
        #pragma omp simd
        for (int c = 0; c < NR; c++) t[q * NR + c] = g[c] * up[c];
      }
    } else if (out16 && (act == 0 || act == GELU_ERF || act == GELU_APPROX)) {
      uint16_t* o = (uint16_t*)out + i * ldo;   /* bias, GELU, rounding: one pass */
      if (act == GELU_ERF) gelu_row_bf16(t, bias, o, cols);
      else if (act == GELU_APPROX) gelu_tanh_row_bf16(t, bias, o, cols);
      else row_bf16(t, bias, o, cols, 0);
      continue;
    } else if (out16 || bias || act) {
      act_span(t, bias, out16 ? t : (float*)out + i * ldo, cols, act);
      if (!out16) continue;
    } else {
      memcpy((float*)out + i * ldo, t, cols * sizeof(float));
      continue;
    }
    if (out16) round_rows(t, LDC_T, 1, cols, (uint16_t*)out + i * ldo, ldo, cols, 1);
    else memcpy((float*)out + i * ldo, t, cols * sizeof(float));
  }
}
#endif

/* out[m, n_out] = act(bf16(a[m, k]) @ B + bias) (bias may be NULL; gated: B holds gate / up
   panel pairs, n = 2 ceil(n_out / NR) NR, and out gets act(gate) * up; else n_out = n). a:
   rows lda apart, f32 (a16_in 0: rounded into a16, m rows of k rounded up to even, zero
   padded) or bf16 already (a16_in 1: read in place where k is even, else copied into a16).
   out: f32, or (out16 1) bf16 rounded to nearest even. scratch: dp_scratch_floats() floats. */
void dp_gemm(const void* a, int64_t lda, int a16_in, uint16_t* a16, const uint16_t* bp,
             void* out, int out16, int64_t m, int64_t n, int64_t k, const float* bias,
             int act, int gated, int64_t n_out, float* scratch) {
#if defined(__AVX512BF16__)
  int64_t kp = (k + 1) / 2 * 2, panels = (n + NR - 1) / NR;
  int in_place = a16_in && k == kp;
  const uint16_t* aa = in_place ? (const uint16_t*)a : a16;
  int64_t ldaa = in_place ? lda : kp;
  int64_t units = (panels + QP - 1) / QP;
  int64_t rblocks = (m + MC - 1) / MC;
  int64_t rb = ((m + rblocks - 1) / rblocks + MR - 1) / MR * MR;   /* whole micro blocks */
  rblocks = (m + rb - 1) / rb;
  int64_t tiles = rblocks * units;
  #pragma omp parallel if(tiles > 1 && m * n * k > (1 << 18))
  {
    float* ct = scratch + (int64_t)omp_get_thread_num() * SCRATCH_FLOATS;
    float* gates = ct + MC * LDC_T;
    if (!in_place) {
      #pragma omp for schedule(static)
      for (int64_t r = 0; r < m; r++)
        bf16_rows(a, a16_in, r * lda, lda, 1, k, a16 + r * kp, kp, kp, 1);
    }
    #pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tiles; t++) {
      int64_t u = t % units, r0 = t / units * rb;
      int64_t p0 = u * QP, q = panels - p0 < QP ? panels - p0 : QP;
      int64_t rows = m - r0 < rb ? m - r0 : rb;
      for (int64_t k0 = 0; k0 < kp; k0 += KC) {
        int64_t kc = kp - k0 < KC ? kp - k0 : KC;
        const uint16_t* b = bp + panel_at(p0, k0, kp, panels);
        /* micro blocks of balanced heights (128 rows: 18 of 6 and 4 of 5, not 21 of 6 and
           one of 2, which runs at a third of the rate) */
        int64_t blocks = (rows + MR - 1) / MR;
        /* a model's weights come from memory (each is read once per call): while this block
           computes, fetch the next one into L2 (this tile's next K block, or the next
           tile's first), a share per micro block; 3-5% at 128 rows */
        const char* next = 0;
        int64_t lines = 0;
        if (k0 + KC < kp) {
          next = (const char*)(bp + panel_at(p0, k0 + KC, kp, panels));
          lines = q * ((kp - k0 - KC < KC ? kp - k0 - KC : KC) / 2);
        } else if (u + 1 < units) {
          next = (const char*)(bp + panel_at(p0 + QP, 0, kp, panels));
          lines = (panels - p0 - QP < QP ? panels - p0 - QP : QP) * ((kp < KC ? kp : KC) / 2);
        }
        int64_t share = (lines + blocks - 1) / blocks;
        for (int64_t blk = 0; blk < blocks; blk++) {
          for (int64_t l = blk * share; l < (blk + 1) * share && l < lines; l++)
            __builtin_prefetch(next + l * 64, 0, 2);
          int64_t i0 = blk * rows / blocks;
          int h = (int)((blk + 1) * rows / blocks - i0);
          dp_micro(h, (int)q, kc / 2, aa + (r0 + i0) * ldaa + k0, ldaa, b, kc * NR,
                ct + i0 * LDC_T, LDC_T, k0 > 0);
        }
      }
      int64_t j0 = p0 * NR, width = q * NR;
      if (gated) {
        int64_t o0 = j0 / 2, cols = n_out - o0 < width / 2 ? n_out - o0 : width / 2;
        void* o = out16 ? (void*)((uint16_t*)out + r0 * n_out + o0)
                        : (void*)((float*)out + r0 * n_out + o0);
        epilogue(ct, rows, width, bias ? bias + j0 : 0, act, 1, o, out16, n_out, cols,
                 gates);
      } else {
        int64_t cols = n - j0 < width ? n - j0 : width;
        void* o = out16 ? (void*)((uint16_t*)out + r0 * n + j0)
                        : (void*)((float*)out + r0 * n + j0);
        epilogue(ct, rows, width, bias ? bias + j0 : 0, act, 0, o, out16, n, cols, gates);
      }
    }
  }
#endif
}

int64_t dp_scratch_floats(void) { return (int64_t)SCRATCH_FLOATS * omp_get_max_threads(); }

int dp_compiled(void) {
#if defined(__AVX512BF16__)
  return 1;
#else
  return 0;
#endif
}
"""))

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {
    "dp_packed_elems": ([_I64, _I64], _I64),
    "dp_pack": [_P, _I64, _I64, _P],
    "dp_gemm": [_P, _I64, _INT, _P, _P, _P, _INT, _I64, _I64, _I64, _P, _INT, _INT, _I64, _P],
    "dp_scratch_floats": ([], _I64),
    "dp_compiled": ([], _INT),
}


@cache
def _lib():
    if "avx512_bf16" not in cc.cpu_flags():
        return None
    so = cc.load_library(SOURCE, "braze_dpbf16_gemm", _SIGNATURES)
    return so if so is not None and so.dp_compiled() else None


def available() -> bool:
    """Whether braze's AVX512-BF16 GEMM runs here."""
    return _lib() is not None


def scratch_elems(rows: int, k: int) -> int:
    """uint16 elements of the operand scratch a `rows` x `k` product needs."""
    return max(rows, 1) * (max(k, 1) + 1) // 2 * 2


class DpWeight(OwnWeight):
    """A weight packed into panels of 16 columns with pairs of k interleaved (OwnWeight)."""

    def _pack(self, w: np.ndarray) -> np.ndarray:
        packed = aligned_empty(int(_lib().dp_packed_elems(self.k, self.n)), np.uint16)
        _lib().dp_pack(address(w), self.k, self.n, address(packed))
        return packed


_SCRATCH = threading.local()


def _scratch() -> np.ndarray:
    """The calling thread's tile scratch (f32, a slice per OpenMP thread), kept for its next
    call: two Python threads may run GEMMs at once, each with its own."""
    floats = int(_lib().dp_scratch_floats())
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.size < floats:
        buf = _SCRATCH.buf = aligned_empty(floats, np.float32)
    return buf


def gemm(x: np.ndarray, w: DpWeight, out: np.ndarray, bias: np.ndarray | None, act: int,
         x16: np.ndarray) -> bool:
    """out = act(bf16(x) @ w + bias) for x [..., K] with C-contiguous rows, out [..., N]
    (bias [N] contiguous f32 or None; x16 a uint16 scratch of at least scratch_elems(rows,
    K)). x is f32 (rounded here) or bf16 (read as it is); out f32, or bf16 (the f32 result
    rounded to nearest even). On a gated weight out is [..., F] = act(gate) * up (act nonzero,
    bias in the gate / up pair layout). False, with nothing written, when the operands don't
    fit."""
    if not fits(x, w, out, bias, act, x16, scratch_elems):
        return False
    rows = x.size // max(x.shape[-1], 1)
    if rows:
        _lib().dp_gemm(address(x), w.k, x.dtype == BF16, address(x16), address(w.packed),
                       address(out), out.dtype == BF16, rows, w.n, w.k,
                       None if bias is None else address(bias), act, w.gated, w.out_cols,
                       address(_scratch()))
    return True
