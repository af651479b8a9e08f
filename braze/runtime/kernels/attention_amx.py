"""attention_native's flash-style attention core on AMX bf16 tiles: the same units (batch, kv
head, block of query rows), chunks of keys, masks and online softmax, with q @ k^T and p @ v as
`tdpbf16ps` tile products accumulating in f32.

Rounding: q, k and v are rounded to bf16 (nearest even, c_snippets.TO_BF16), and so are the
probabilities softmax_step leaves for p @ v (divided by their sum where a row's keys all lie in
one chunk, else the unnormalized exponentials; the running sum stays f32 and is divided out at
the end). Products of bf16 numbers are exact in f32, so a row matches
`bf16(softmax(bf16(q) @ bf16(k)^T * scale ...)) @ bf16(v)` up to the order of f32 sums (and
tdpbf16ps's flushing of bf16 denormals and denormal sums, below 1.2e-38, to zero). Scale,
softcap, additive mask, causal offset (Sk - Sq), sliding window, GQA, rows with every key -inf
(zeros) and causal rows that see no key (the mean of v, rounded as the reference rounds p and
v) are attention_native's.

Layout per thread: the unit's q rows of all rep heads rounded once into [rep][bq][dp] bf16
(rows padded to 16, d to 32, zeros); per chunk k^T packed into VNNI B tiles (16 pairs of d x 16
keys) and v into VNNI B tiles (16 pairs of keys x 16 columns), zero padded to 32 keys; scores
as 2 x 2 blocks of 16 x 16 f32 tiles into the f32 scores scratch (only the tiles a causal or
sliding-window row block sees), probabilities rounded into [bq][kb] bf16, acc (f32, row stride
dvp) loaded, accumulated and stored as tiles. Needs AMX-BF16, Linux's tile permission (asked
once per process by amx_gemm) and a C compiler. A fused attention block on braze's AMX GEMMs
hands q, k and v over as bf16 values (copied, not rounded: `in16`) and takes the output back
in bf16 (`out16`) for its output projection: the same numbers at half the bytes.

Speed (the 2-core AMX Xeon VM, idle, OMP_NUM_THREADS=2, median of 300 alternating calls, H=12
S=128 D=64 with a [B, 1, 1, S] mask): B=8 attn_heads 3.7-3.9 ms, this 2.4-2.5 ms (1.5-1.6x);
B=1 0.38-0.44 ms, 0.24-0.27 ms (1.6-1.7x). softmax_step (shared with attention_native) is now
~40% of this kernel's time, q @ k^T and p @ v ~20%, the bf16 rounding and packing most of the
rest."""
from __future__ import annotations

import ctypes
from functools import cache

from ..codegen import cc
from . import amx_gemm, attention_native, c_snippets
from .attention_native import Bf16HeadsPlan

__all__ = ["available", "AmxHeadsPlan"]

SOURCE = attention_native.SOURCE + c_snippets.TRANSPOSE16 + r"""
#include <immintrin.h>
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__)
/* Tiles 0-3: 16 x 16 f32 sums; 4-5: A (16 rows x 32 bf16); 6-7: B (16 pairs x 16 columns). */
""" + amx_gemm.TILE_CONFIG + r"""

/* k^T of keys [0, kcp) (zero from kc) over d (zero from d to dp) in VNNI B tiles: tile
   (j / 16, t / 32) at ((j / 16) * dp / 32 + t / 32) * 512 holds bf16(key[j][t]) at row (t % 32)
   / 2, column j % 16, half t % 2. Per 16 keys: their rows rounded into rows (16 x dp), then
   each 16 x 16 block of d pairs transposed in registers. */
static void pack_keys_vnni(const void* key, int in16, int64_t ld, int64_t kc, int64_t kcp,
                           int64_t d, int64_t dp, uint16_t* kt, uint16_t* rows) {
  for (int64_t j0 = 0; j0 < kcp; j0 += 16) {
    int64_t m = kc - j0 < 16 ? (kc > j0 ? kc - j0 : 0) : 16;
    bf16_rows(key, in16, j0 * ld, ld, m, d, rows, dp, dp, 16);
    uint16_t* o = kt + j0 * dp;   /* the 16 keys' dp / 32 tiles */
    for (int64_t t = 0; t < dp; t += 32) {
      __m512i r[16];
      for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(rows + i * dp + t);
      transpose16(r);
      for (int x = 0; x < 16; x++) _mm512_storeu_si512(o + t * 16 + x * 32, r[x]);
    }
  }
}

/* v rows [0, kcp) (zero from kc) over dv columns (zero to dvp) in VNNI B tiles: tile
   (j / 32, x / 16) at ((j / 32) * dvp / 16 + x / 16) * 512 holds bf16(val[j][x]) at row
   (j % 32) / 2, column x % 16, half j % 2. */
static void pack_values_vnni(const void* val, int in16, int64_t ld, int64_t kc, int64_t kcp,
                             int64_t dv, int64_t dvp, uint16_t* vt) {
  uint32_t* vt32 = (uint32_t*)vt;
  for (int64_t pr = 0; pr < kcp / 2; pr++) {
    uint32_t* o = vt32 + pr / 16 * dvp * 16 + pr % 16 * 16;
    int64_t full = 2 * pr + 1 < kc ? dv / 16 * 16 : 0;
    if (in16) {   /* bf16 values already */
      const uint16_t* a = (const uint16_t*)val + 2 * pr * ld;
      const uint16_t* b = a + ld;
      for (int64_t x0 = 0; x0 < full; x0 += 16) {
        #pragma omp simd
        for (int c = 0; c < 16; c++)
          o[x0 * 16 + c] = (uint32_t)a[x0 + c] | (uint32_t)b[x0 + c] << 16;
      }
      for (int64_t x = full; x < dvp; x++) {
        uint32_t lo = 2 * pr < kc && x < dv ? a[x] : 0;
        uint32_t hi = 2 * pr + 1 < kc && x < dv ? b[x] : 0;
        o[x / 16 * 256 + x % 16] = lo | hi << 16;
      }
      continue;
    }
    const uint32_t* a = (const uint32_t*)val + 2 * pr * ld;
    const uint32_t* b = a + ld;
    for (int64_t x0 = 0; x0 < full; x0 += 16) {
      #pragma omp simd
      for (int c = 0; c < 16; c++)
        o[x0 * 16 + c] = (uint32_t)to_bf16(a[x0 + c]) | (uint32_t)to_bf16(b[x0 + c]) << 16;
    }
    for (int64_t x = full; x < dvp; x++) {
      uint32_t lo = 2 * pr < kc && x < dv ? to_bf16(a[x]) : 0;
      uint32_t hi = 2 * pr + 1 < kc && x < dv ? to_bf16(b[x]) : 0;
      o[x / 16 * 256 + x % 16] = lo | hi << 16;
    }
  }
}

/* c[16 or 32 rows, 16 or 32 columns] (f32, row stride ldc) = (acc ? c : 0) + a @ b over
   `steps` steps of 32: a's bf16 rows lda apart, step t at a + 32 t; b's VNNI tiles for step t
   at b + t * b_step, the next 16 columns' b_col on. */
static inline void tile_block(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t b_step,
                              int64_t b_col, int64_t steps, float* c, int64_t ldc, int acc,
                              int two_r, int two_c) {
  if (acc) {
    _tile_loadd(0, c, ldc * 4);
    if (two_c) _tile_loadd(1, c + 16, ldc * 4);
    if (two_r) _tile_loadd(2, c + 16 * ldc, ldc * 4);
    if (two_r && two_c) _tile_loadd(3, c + 16 * ldc + 16, ldc * 4);
  } else {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  }
  for (int64_t t = 0; t < steps; t++) {
    _tile_loadd(4, a + t * 32, lda * 2);
    _tile_loadd(6, b + t * b_step, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (two_c) { _tile_loadd(7, b + t * b_step + b_col, 64); _tile_dpbf16ps(1, 4, 7); }
    if (two_r) {
      _tile_loadd(5, a + 16 * lda + t * 32, lda * 2);
      _tile_dpbf16ps(2, 5, 6);
      if (two_c) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, ldc * 4);
  if (two_c) _tile_stored(1, c + 16, ldc * 4);
  if (two_r) _tile_stored(2, c + 16 * ldc, ldc * 4);
  if (two_r && two_c) _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
}
#endif

/* 1 where this library has the AMX kernel (the compiler knew AMX and AVX-512). */
int attn_amx_compiled(void) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__)
  return 1;
#else
  return 0;
#endif
}

/* attn_heads's arguments and results, with q, k, v and p rounded to bf16 (see the module).
   scratch: slots x per_thread floats (AmxHeadsPlan); bq a multiple of 16, kb of 32. in16: q,
   k and v hold bf16 values (uint16) instead of f32; out16: o gets the result rounded to bf16
   (strides in elements either way). */
void attn_heads_amx(const void* q, const void* k, const void* v, void* o, const int64_t* st,
                    int64_t nb, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d,
                    int64_t dv, float scale, float softcap, int causal, int64_t window,
                    const float* mask, const int64_t* mst, float* scratch, int64_t per_thread,
                    int64_t bq, int64_t kb, int slots, int in16, int out16) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__)
  int64_t qkv_size = in16 ? 2 : 4, o_size = out16 ? 2 : 4;   /* bytes per element */
  int64_t rep = hq / hkv, off = sk - sq, dp = (d + 31) / 32 * 32, dvp = (dv + 15) / 16 * 16;
  int64_t nd = dp / 32, ndv = dvp / 16;
  int64_t blocks = (sq + bq - 1) / bq, units = blocks * nb * hkv;
  int team = omp_get_max_threads() < slots ? omp_get_max_threads() : slots;
  int parallel = team > 1 && units > 1
      && BRAZE_PARALLEL(nb * hq * sq * sk * (d + dv), BRAZE_PAR_MIN_MACS);
  /* One query block per (batch, head): the units are alike, and in order of the batch; split
     evenly in that order, each thread reads the rows of q, k and v that the same thread's
     projection wrote (the GEMMs split their rows so) and writes the output rows it will
     project. Several blocks per head differ in work (causal): handed out one by one. */
  omp_set_schedule(blocks == 1 ? omp_sched_static : omp_sched_dynamic, blocks == 1 ? 0 : 1);
  #pragma omp parallel num_threads(team) if(parallel)
  {
    configure_tiles();
    bf16_buffers f = bf16_buffers_at(scratch, per_thread, rep, bq, kb, dp, dvp);
    uint16_t *q16 = f.q16, *k16 = f.k16, *v16 = f.v16, *p16 = f.p16, *rows = f.rows;
    float *sc = f.sc, *acc = f.acc, *mx = f.mx, *sum = f.sum;
    #pragma omp for schedule(runtime)
    for (int64_t u = 0; u < units; u++) {
      int64_t b, g, q0, n, lo_all, hi_all;   /* keys some row of the unit sees */
      unit_at(u, blocks, nb, hkv, bq, sq, off, sk, causal, window, &b, &g, &q0, &n, &lo_all,
              &hi_all);
      int64_t np = (n + 15) / 16 * 16;
      start_rows_bf16(q, in16, st, b, g, rep, q0, n, np, d, dp, bq, dvp, q16, acc, mx, sum);
      memset(p16 + n * kb, 0, (np - n) * kb * sizeof(uint16_t));   /* padding rows: p = 0 */
      const char* kh = (const char*)k + (b * st[3] + g * st[4]) * qkv_size;
      const char* vh = (const char*)v + (b * st[6] + g * st[7]) * qkv_size;
      for (int64_t c0 = lo_all; c0 < hi_all; c0 += kb) {
        int64_t kc = hi_all - c0 < kb ? hi_all - c0 : kb, kcp = (kc + 31) / 32 * 32;
        pack_keys_vnni(kh + c0 * st[5] * qkv_size, in16, st[5], kc, kcp, d, dp, k16, rows);
        pack_values_vnni(vh + c0 * st[8] * qkv_size, in16, st[8], kc, kcp, dv, dvp, v16);
        for (int64_t r = 0; r < rep; r++) {
          int64_t h = g * rep + r;
          const float* mh = mask ? mask + b * mst[0] + h * mst[1] : 0;
          for (int64_t i0 = 0; i0 < np; i0 += 32) {   /* scores, only the tiles rows see */
            int64_t a, z, i1 = i0 + 32 < n ? i0 + 32 : n;
            tile_keys(q0 + i0, q0 + i1 - 1, c0, kc, off, sk, causal, window, &a, &z);
            for (int64_t j0 = a / 16 * 16; j0 < z; j0 += 32)
              tile_block(q16 + (r * bq + i0) * dp, dp, k16 + j0 / 16 * nd * 512, 512, nd * 512,
                         nd, sc + i0 * kb + j0, kb, 0, i0 + 16 < np, j0 + 16 < z);
          }
          softmax_rows(sc, kb, n, q0, c0, kc, off, sk, causal, window, scale, softcap, mh,
                       mst, mx + r * bq, sum + r * bq, acc + r * bq * dvp, dvp, p16, kcp, 1);
          for (int64_t i0 = 0; i0 < np; i0 += 32) {   /* out += p @ v over the keys rows see */
            int64_t a, z, i1 = i0 + 32 < n ? i0 + 32 : n;
            tile_keys(q0 + i0, q0 + i1 - 1, c0, kc, off, sk, causal, window, &a, &z);
            for (int64_t ct = 0; z > a && ct < ndv; ct += 2)
              tile_block(p16 + i0 * kb + a / 32 * 32, kb, v16 + (a / 32 * ndv + ct) * 512,
                         ndv * 512, 512, (z + 31) / 32 - a / 32,
                         acc + (r * bq + i0) * dvp + ct * 16, dvp, 1, i0 + 16 < np,
                         ct + 1 < ndv);
          }
        }
      }
      for (int64_t r = 0; r < rep; r++)
        write_rows((char*)o + (b * st[9] + (g * rep + r) * st[10] + q0 * st[11]) * o_size,
                   out16, st[11], acc + r * bq * dvp, dvp, sum + r * bq, n, q0, off, sk, causal,
                   window, vh, in16, st[8], dv, 1);
    }
    _tile_release();
  }
#endif
}
"""

_I64, _F32, _INT, _P = ctypes.c_int64, ctypes.c_float, ctypes.c_int, ctypes.c_void_p
_SIGNATURES = {
    "attn_amx_compiled": ([], _INT),
    "attn_heads_amx": ([_P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _F32,
                        _F32, _INT, _I64, _P, _P, _P, _I64, _I64, _I64, _INT, _INT, _INT],
                       None),
}
ROWS = 16   # query rows per tile
KEYS = 32   # keys per p @ v tile step (a pair of 16-key score tiles)


@cache
def _lib():
    if not {"amx_tile", "amx_bf16", "avx512f"} <= cc.cpu_flags() or not amx_gemm.available():
        return None   # no AMX here, or Linux refused tile data (amx_gemm asks once)
    so = cc.load_library(SOURCE, "braze_attention_amx", _SIGNATURES, cc.PRECISE_FLAGS)
    return so if so is not None and so.attn_amx_compiled() else None


def available() -> bool:
    """Whether the AMX attention kernel runs here (AMX-BF16, tile permission, a C compiler)."""
    return _lib() is not None and attention_native.lib() is not None


class AmxHeadsPlan(Bf16HeadsPlan):
    """Bf16HeadsPlan for the C attn_heads_amx: query blocks of whole 16-row tiles, key chunks
    of 32-key steps."""

    rows, keys = ROWS, KEYS

    def _core(self):
        return _lib().attn_heads_amx
