"""braze's own bf16 GEMM on AMX tiles, for the mixed-precision policy beside MKL's
(bf16_gemm.py picks, per machine and weight shape, whichever measured faster: gemm_choice.py).

The weight is packed once, at its bf16 size, into VNNI tile pairs: for each block of 32
columns and 32 rows of k, two 16 x 32 bf16 tiles (pairs of k per column). A call rounds the
operand to bf16 (nearest even) into a scratch padded to 32-row / 32-column multiples and packed
tile by tile (each 16 x 32 tile in 1 KiB of its own), then accumulates 32 x 32 blocks of the
product as four 16 x 16 f32 tiles with `tdpbf16ps` over k (2 A tiles x 2 B tiles; the next B
tiles are prefetched on the first row block), stores them and applies bias + activation
(+ rounding to bf16) in one vector pass per row while the block is in cache. Threads split
the rows (a thread rounds the chunks of rows it multiplies, which stay in its L2) or, for an
operand read in place or a weight far wider than the operand, the columns; rows go in chunks
of at most 256. Products of bf16 values are exact in f32 and the tiles accumulate in f32: the
same numbers as MKL's bf16 GEMM up to the order of the sums. An operand whose values are bf16
already (the bf16 hand-off, fused.rounded_output) is read in place where k is a multiple of
32 (only the last rows short of a 32-row block are copied into the padded scratch), and the
result can leave as bf16, rounded to nearest even after bias and activation, for the next
GEMM.

Why: MKL's packed bf16 weight keeps ~4x the bf16 bytes resident, which a 128-row product
streams from memory; on the AMX Xeon VM this kernel ran 1.1-1.3x MKL's median at BERT shapes
with weights rotated past the caches. Needs a CPU with AMX-BF16, Linux's permission for tile
data (arch_prctl, once per process) and a C compiler; `BRAZE_BF16_GEMM=mkl` keeps MKL's."""
from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import cache

import ml_dtypes
import numpy as np

from ..address import address
from ..codegen import cc
from ..plan import aligned_empty
from . import c_snippets
from .packed_gemm import gate_up_pairs

__all__ = ["available", "OwnWeight", "AmxWeight", "gemm", "fits", "scratch_elems", "up32", "BF16"]

TILE_CONFIG = r"""
/* Palette 1, all 8 tiles 16 rows x 64 bytes: 16 x 16 f32 sums, 16 x 32 bf16 A tiles and
   16 pairs x 16 columns VNNI B tiles (needs <immintrin.h>, <string.h> and AMX). */
typedef struct { uint8_t palette_id; uint8_t start_row; uint8_t reserved[14];
                 uint16_t colsb[16]; uint8_t rows[16]; } tile_config;

static void configure_tiles(void) {
  tile_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int i = 0; i < 8; i++) { cfg.colsb[i] = 64; cfg.rows[i] = 16; }
  _tile_loadconfig(&cfg);
}
"""

SOURCE = c_snippets.ACT_SPAN.join(("""
#define _GNU_SOURCE   /* syscall() under -std=c11 (an implicit declaration: an error in GCC 14) */
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <immintrin.h>
""" + cc.simd_math_decls() + c_snippets.TO_BF16, r"""
#define MC 256  /* rows per chunk: 256 x k bf16 stays in L2 across the column blocks */
#define PF 4    /* B tiles prefetched this many k blocks ahead */
#define GELU_ERF """ + str(c_snippets.ACT_CODES["gelu"]) + r"""

/* Linux's permission to use AMX tile data in this process: 0 on success. */
int amx_enable(void) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  return (int)syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */);
#else
  return -1;
#endif
}

/* w [k, n] f32 -> packed [NB][KB][2][16][32] bf16 (VNNI pairs of k per column), zero padded. */
void amx_pack(const float* w, int64_t k, int64_t n, uint16_t* out) {
  int64_t kb_n = (k + 31) / 32, nb_n = (n + 31) / 32;
  const uint32_t* u = (const uint32_t*)w;
  #pragma omp parallel for schedule(static)
  for (int64_t nb = 0; nb < nb_n; nb++)
    for (int64_t kb = 0; kb < kb_n; kb++)
      for (int t = 0; t < 2; t++) {
        uint16_t* tile = out + ((nb * kb_n + kb) * 2 + t) * 512;
        for (int r = 0; r < 16; r++)
          for (int c = 0; c < 16; c++)
            for (int j = 0; j < 2; j++) {
              int64_t kk = kb * 32 + 2 * r + j, nn = nb * 32 + t * 16 + c;
              tile[r * 32 + c * 2 + j] = (kk < k && nn < n) ? to_bf16(u[kk * n + nn]) : 0;
            }
      }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
""" + c_snippets.BF16_ROW + r"""
/* row_bf16's GELU over a block's rows (tmp, 32 apart) into out16 (rows ld apart): two full
   rows, four vectors, at a time. */
static inline void gelu_rows_bf16(const float* tmp, const float* bias, uint16_t* out16,
                                  int64_t ld, int64_t rows, int64_t cols) {
  int64_t r = 0;
  if (cols == 32)
    for (; r + 2 <= rows; r += 2) {
      __m512 v[4];
      for (int i = 0; i < 4; i++) {
        v[i] = _mm512_loadu_ps(tmp + (r + i / 2) * 32 + i % 2 * 16);
        if (bias) v[i] = _mm512_add_ps(v[i], _mm512_loadu_ps(bias + i % 2 * 16));
      }
      gelu_erf16_n(v, 4);
      for (int i = 0; i < 4; i++)
        _mm256_storeu_si256((__m256i*)(out16 + (r + i / 2) * ld + i % 2 * 16),
                            bf16_round16(v[i]));
    }
  for (; r < rows; r++) row_bf16(tmp + r * 32, bias, out16 + r * ld, cols, 1);
}

/* x[c] = GELU(x[c]) in f32 for c < 16, as row_bf16 computes it (a gated block's gate). */
static inline void gelu_gate(float* x) {
  _mm512_storeu_ps(x, gelu_erf16(_mm512_loadu_ps(x)));
}
""" + TILE_CONFIG + r"""

/* One 32 x 32 block of the product: rows r0.., columns nb*32.., from a0 (its first row of
   bf16 A, rows lda apart, kb_n blocks of 32 columns; packed: in operand_row's layout) and the
   column block's packed B; then the epilogue into out (f32) or, out16 given, out16 (rounded
   to bf16), both with row stride ld, `rows` x `cols` valid values: bias + act (cols of the
   block's 32), or gated: the block is 16 gate columns then the matching 16 up columns
   (weight packed by gate_up_pairs), bias added to both, and the output act(gate) * up (cols
   of 16). */
static void block(const uint16_t* a0, int64_t lda, int packed, int64_t kb_n,
                  const uint16_t* bcol, int prefetch, float* out, uint16_t* out16, int64_t ld,
                  int64_t rows, int64_t cols, const float* bias, int act, int gated,
                  float* tmp) {
  /* A's tiles: rows lda apart, or (packed) each 16 x 32 tile in 1 KiB of its own */
  int64_t step = packed ? 512 : 32, stride = packed ? 64 : lda * 2;
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (int64_t kb = 0; kb < kb_n; kb++) {
    if (prefetch && kb + PF < kb_n) {
      const char* pf = (const char*)(bcol + (kb + PF) * 1024);
      for (int l = 0; l < 2048; l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
    }
    _tile_loadd(4, a0 + kb * step, stride);
    _tile_loadd(5, a0 + 16 * lda + kb * step, stride);
    _tile_loadd(6, bcol + kb * 1024, 64);
    _tile_loadd(7, bcol + kb * 1024 + 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  if (!gated && !out16 && rows == 32 && cols == 32) {
    _tile_stored(0, out, ld * 4);
    _tile_stored(1, out + 16, ld * 4);
    _tile_stored(2, out + 16 * ld, ld * 4);
    _tile_stored(3, out + 16 * ld + 16, ld * 4);
    if (bias || act)
      for (int64_t r = 0; r < rows; r++) act_span(out + r * ld, bias, out + r * ld, cols, act);
    return;
  }
  _tile_stored(0, tmp, 128); _tile_stored(1, tmp + 16, 128);
  _tile_stored(2, tmp + 512, 128); _tile_stored(3, tmp + 528, 128);
  int64_t width = gated ? 16 : cols;   /* the values act applies to, per row */
  if (out16 && (act == 0 || act == GELU_ERF) && !gated) {   /* bias, GELU, rounding: 1 pass */
    if (act == GELU_ERF)
      gelu_rows_bf16(tmp, bias, out16, ld, rows, cols);
    else
      for (int64_t r = 0; r < rows; r++) row_bf16(tmp + r * 32, bias, out16 + r * ld, cols, 0);
    return;
  }
  for (int64_t r = 0; r < rows && (bias || act); r++) {
    float* t = tmp + r * 32;
    if (gated && bias) {
      #pragma omp simd
      for (int c = 0; c < 32; c++) t[c] += bias[c];
    }
    if (out16 && act == GELU_ERF) gelu_gate(t);
    else act_span(t, gated ? 0 : bias, t, width, act);
    if (gated) {
      #pragma omp simd
      for (int c = 0; c < 16; c++) t[c] *= t[16 + c];
    }
  }
  if (out16)
    round_rows(tmp, 32, rows, cols, out16, ld, cols, rows);
  else
    for (int64_t r = 0; r < rows; r++) memcpy(out + r * ld, tmp + r * 32, cols * 4);
}
#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
/* Row r of the operand, rounded from f32 (vcvtneps2bf16 where the CPU has it: the tile
   products flush what it flushes) or (bf16 in) copied, zero padded to kp columns (rows past m
   all zeros), into a16 packed for the tile loads: row i = r - direct of 16-row group i / 16
   has its 32-column pieces 512 values apart, at a16 + (i / 16) 16 kp + (i % 16) 32, so each
   16 x 32 tile is 1 KiB of consecutive memory (a tile load of rows kp apart touches 16 lines
   across the L2; f32 operands at MiniLM / BERT shapes: 0.94-0.96x the time packed). */
static inline void operand_row(const void* a, int64_t lda, int a16_in, uint16_t* a16,
                               int64_t r, int64_t direct, int64_t m, int64_t k, int64_t kp) {
  int64_t i = r - direct, at = r < m ? r * lda : 0;   /* rows past m: nothing read */
  uint16_t* dst = a16 + i / 16 * 16 * kp + i % 16 * 32;
  const float* src = (const float*)a + at;
  const uint16_t* src16 = (const uint16_t*)a + at;
  for (int64_t c = 0; c < kp; c += 16) {
    int64_t left = r < m ? k - c : 0;
    __mmask16 mk = left >= 16 ? 0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
    __m256i v = a16_in ? _mm256_maskz_loadu_epi16(mk, src16 + c)
                       : bf16_round16(_mm512_maskz_loadu_ps(mk, src + c));
    _mm256_storeu_si256((__m256i*)(dst + c / 32 * 512 + c % 32), v);
  }
}

/* Rows [m0, m1) of the product (A row r at a + (r - m0) * lda) times column blocks
   [nb0, nb1). */
static void rows_by_columns(const uint16_t* a, int64_t lda, int packed, int64_t kb_n,
                            const uint16_t* bp, int64_t m0, int64_t m1, int64_t nb0,
                            int64_t nb1, void* out, int out16, int64_t m, int64_t n_out,
                            const float* bias, int act, int gated, float* tmp) {
  for (int64_t nb = nb0; nb < nb1; nb++) {
    const uint16_t* bcol = bp + nb * kb_n * 1024;
    int64_t c0 = nb * (gated ? 16 : 32);   /* the block's first output column */
    int64_t cols = n_out - c0 < (gated ? 16 : 32) ? n_out - c0 : (gated ? 16 : 32);
    for (int64_t r0 = m0; r0 < m1; r0 += 32) {
      int64_t rows = m - r0 < 32 ? m - r0 : 32, at = r0 * n_out + c0;
      block(a + (r0 - m0) * lda, lda, packed, kb_n, bcol, r0 == m0,
            out16 ? 0 : (float*)out + at, out16 ? (uint16_t*)out + at : 0, n_out, rows, cols,
            bias ? bias + nb * 32 : 0, act, gated, tmp);
    }
  }
}

/* rows_by_columns over rows [m0, m1): those before `direct` read in place (a_in, rows lda
   apart), the rest from the packed scratch a16 (its first row is row `direct`). */
static void rows_from(const uint16_t* a_in, int64_t lda, const uint16_t* a16, int64_t kp,
                      int64_t direct, int64_t kb_n, const uint16_t* bp, int64_t m0, int64_t m1,
                      int64_t nb0, int64_t nb1, void* out, int out16, int64_t m,
                      int64_t n_out, const float* bias, int act, int gated, float* tmp) {
  int64_t mid = direct < m0 ? m0 : direct < m1 ? direct : m1;
  if (mid > m0)
    rows_by_columns(a_in + m0 * lda, lda, 0, kb_n, bp, m0, mid, nb0, nb1, out, out16, m,
                    n_out, bias, act, gated, tmp);
  if (m1 > mid)
    rows_by_columns(a16 + (mid - direct) * kp, kp, 1, kb_n, bp, mid, m1, nb0, nb1, out,
                    out16, m, n_out, bias, act, gated, tmp);
}
#endif

/* out[m, n] = act(bf16(a[m, k]) @ B + bias), bias may be NULL. a: rows lda apart, f32 (a16_in
   0: rounded into the scratch a16, ceil(m/32)*32 x ceil(k/32)*32, zero padded) or bf16 values
   already (a16_in 1: read in place where k is a multiple of 32, but for the last rows short of
   32, which are copied into a16 zero padded; else all copied). out: f32, or (out16 1) bf16
   rounded to nearest even from the f32 result. gated: B holds gate / up column pairs (n =
   2 ceil(n_out / 16) * 16) and out [m, n_out] gets act(gate) * up (see block); else n_out = n.
*/
void amx_gemm_bias_act(const void* a, int64_t lda, int a16_in, uint16_t* a16,
                       const uint16_t* bp, void* out, int out16, int64_t m, int64_t n,
                       int64_t k, const float* bias, int act, int gated, int64_t n_out) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  int64_t kp = (k + 31) / 32 * 32, mp = (m + 31) / 32 * 32;
  int64_t kb_n = kp / 32, nb_n = (n + 31) / 32;
  /* rows [0, direct) are read where they are (bf16 in, k a multiple of 32), the rest from a16 */
  int64_t direct = a16_in && k == kp ? m / 32 * 32 : 0;
  const uint16_t* a_in = (const uint16_t*)a;
  #pragma omp parallel
  {
    int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    /* With at least two 32-row blocks per thread, each thread takes its own rows, all
       columns: the rows it rounds (or copies) into a16 stay in its core's L2, and rows read in
       place are the ones the same thread's previous kernel wrote, the split being the same
       contiguous halves (static, in row order) as the AMX attention core's batch order and
       the GEMM before. Split by columns, each thread read every row, half of them from the
       other core's cache (1024 x 768 x 768: 0.90x the time by rows). MiniLM b8 bf16 0.89x
       and BERT b8 0.97x with operands read in place split by rows too and static chunks (each
       alone: 0.95x, 1.00x). A weight far wider than the operand is tall keeps the column
       split (BERT-base at 128 rows: 1.05x by rows). */
    int by_rows = mp / 32 >= 2 * nt && 4 * m >= n;
    configure_tiles();
    float tmp[32 * 32];
    if (by_rows) {
      /* chunks of rows (about 2 per thread, at most MC), each thread's a contiguous run: a
         thread prepares a chunk's rows and multiplies them by every column block */
      int64_t size = (mp / (2 * nt) + 31) / 32 * 32;
      size = size < 32 ? 32 : size > MC ? MC : size;
      #pragma omp for schedule(static) nowait
      for (int64_t m0 = 0; m0 < mp; m0 += size) {
        int64_t m1 = m0 + size < mp ? m0 + size : mp;
        for (int64_t r = direct > m0 ? direct : m0; r < m1; r++)
          operand_row(a, lda, a16_in, a16, r, direct, m, k, kp);
        rows_from(a_in, lda, a16, kp, direct, kb_n, bp, m0, m1, 0, nb_n, out, out16, m, n_out,
                  bias, act, gated, tmp);
      }
    } else {
      #pragma omp for schedule(static)
      for (int64_t r = direct; r < mp; r++)
        operand_row(a, lda, a16_in, a16, r, direct, m, k, kp);
      for (int64_t m0 = 0; m0 < mp; m0 += MC) {   /* this thread's share of the columns */
        int64_t m1 = m0 + MC < mp ? m0 + MC : mp;
        rows_from(a_in, lda, a16, kp, direct, kb_n, bp, m0, m1, nb_n * t / nt,
                  nb_n * (t + 1) / nt, out, out16, m, n_out, bias, act, gated, tmp);
      }
    }
    _tile_release();
  }
#endif
}
"""))

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {
    "amx_enable": ([], ctypes.c_int),
    "amx_pack": [_P, _I64, _I64, _P],
    "amx_gemm_bias_act": [_P, _I64, _INT, _P, _P, _P, _INT, _I64, _I64, _I64, _P, _INT, _INT,
                          _I64],
}


@cache
def _lib():
    if not {"amx_tile", "amx_bf16"} <= cc.cpu_flags():
        return None
    so = cc.load_library(SOURCE, "braze_amx_gemm", _SIGNATURES)
    if so is None or so.amx_enable() != 0:  # no AMX code compiled, or Linux refused tiles
        return None
    return so


def available() -> bool:
    """Whether braze's AMX bf16 GEMM runs here."""
    return _lib() is not None


def up32(x: int) -> int:
    """x rounded up to a multiple of 32 (a tile's k pairs or a block of columns)."""
    return (x + 31) // 32 * 32


def scratch_elems(rows: int, k: int) -> int:
    """uint16 elements of the operand scratch a `rows` x `k` product needs."""
    return up32(max(rows, 1)) * up32(max(k, 1))


class OwnWeight:
    """A [K, N] weight whose values are bf16 numbers, packed once for one of braze's bf16
    GEMMs (a subclass's `_pack`). With `gate_first` set, w is [K, 2F], the gate and up
    projections side by side (gate first or second), packed as gate / up pairs of 16 columns
    (packed_gemm.gate_up_pairs: n = 2 ceil(F / 16) * 16) for the gated epilogue, whose output
    has out_cols = F columns."""

    def __init__(self, w: np.ndarray, gate_first: bool | None = None):
        self.gated = gate_first is not None
        self.out_cols = int(w.shape[1]) // 2 if self.gated else int(w.shape[1])
        if self.gated:
            w = gate_up_pairs(np.asarray(w, np.float32), gate_first)
        self.k, self.n = (int(x) for x in w.shape)
        self.packed = self._pack(np.ascontiguousarray(w, np.float32))

    def _pack(self, w: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class AmxWeight(OwnWeight):
    """A weight packed into VNNI tile pairs for the AMX kernel (OwnWeight)."""

    def _pack(self, w: np.ndarray) -> np.ndarray:
        packed = aligned_empty(up32(self.n) * up32(self.k), np.uint16)
        _lib().amx_pack(address(w), self.k, self.n, address(packed))
        return packed


BF16 = np.dtype(ml_dtypes.bfloat16)


def fits(x: np.ndarray, w: OwnWeight, out: np.ndarray, bias: np.ndarray | None, act: int,
         x16: np.ndarray, scratch: Callable[[int, int], int]) -> bool:
    """Whether the operands fit a bf16 GEMM on braze's weight `w`: x [..., K] f32 or bf16 and
    out [..., out_cols] f32 or bf16, C-contiguous, as many rows; bias [n] contiguous f32 or
    None; act nonzero on a gated weight; x16 uint16 of at least scratch(rows, K) elements."""
    k = x.shape[-1] if x.ndim else 0
    if x.ndim < 1 or k != w.k or out.shape[-1] != w.out_cols or \
            x.dtype not in (np.float32, BF16) or (w.gated and not act):
        return False
    if not x.flags.c_contiguous or not out.flags.c_contiguous or \
            out.dtype not in (np.float32, BF16):
        return False
    rows = x.size // max(k, 1)
    if out.size != rows * w.out_cols or x16.dtype != np.uint16 or \
            x16.size < scratch(rows, k):
        return False
    return bias is None or (bias.dtype == np.float32 and bias.shape == (w.n,)
                            and bias.flags.c_contiguous)


def gemm(x: np.ndarray, w: AmxWeight, out: np.ndarray, bias: np.ndarray | None, act: int,
         x16: np.ndarray) -> bool:
    """out = act(bf16(x) @ w + bias) for x [..., K] with C-contiguous rows, out [..., N]
    (bias [N] contiguous f32 or None; x16 a uint16 scratch of at least scratch_elems(rows, K)).
    x is f32 (rounded here) or bf16 (read as it is); out f32, or bf16 (the f32 result rounded
    to nearest even). On a gated weight out is [..., F] = act(gate) * up (act nonzero, bias
    in the gate / up pair layout). False, with nothing written, when the operands don't
    fit."""
    if not fits(x, w, out, bias, act, x16, scratch_elems):
        return False
    k = x.shape[-1]
    rows = x.size // max(k, 1)
    if rows:
        _lib().amx_gemm_bias_act(address(x), k, x.dtype == BF16, address(x16),
                                 address(w.packed), address(out), out.dtype == BF16,
                                 rows, w.n, k, None if bias is None else address(bias), act,
                                 w.gated, w.out_cols)
    return True
