"""attention_native's flash-style attention core on AVX512-BF16 dot products (`vdpbf16ps`), for
the bf16 policy on CPUs without AMX (attention_amx.py is the AMX one): the same units (batch,
kv head, block of query rows), chunks of keys, masks and online softmax, with q @ k^T and
p @ v on dpbf16_gemm's register-blocked micro-kernel (6 rows x up to 64 columns, pairs of the
reduced axis per `vdpbf16ps`), accumulating in f32.

Rounding is attention_amx's: q, k, v and the probabilities p @ v reads are rounded to bf16
(nearest even), the running sums stay f32, so a row matches
`bf16(softmax(bf16(q) @ bf16(k)^T * scale ...)) @ bf16(v)` up to the order of the f32 sums
(and the flushing of bf16 subnormals, as the AMX core). Scale, softcap, additive mask, causal
offset, sliding window, GQA, rows with every key -inf and causal rows that see no key are
attention_native's (softmax_step, row_keys, write_rows).

Layout per thread: the unit's q rows of all rep heads rounded once into [rep][bq][dp] bf16 (d
padded to 32); per chunk k^T packed into panels of 16 keys ([d pair][key][2]: one 64-byte
vector per pair of d) and v into panels of 16 value columns ([key pair][column][2]); scores
into the f32 scratch (only the 6-row x 64-key tiles a causal or sliding-window row block sees),
probabilities rounded into [bq][kb] bf16, the output sums (f32) accumulated by the same
micro-kernel. As the AMX core, it takes q, k and v as bf16 values from the block's
projections (`in16`) and hands its output to the output projection in bf16 (`out16`) where
those run on braze's bf16 GEMMs.

Speed (the 2-core Zen 4 EPYC VM, H 12, S 128, D 64, no mask, alternating calls): B=1 0.27 ms
against 0.43 for the f32 micro-kernels on rounded values (attn_heads_bf16), B=8 2.6 against
3.8 ms. Tests: tests/runtime/test_attention_bf16_core.py (every core present)."""
from __future__ import annotations

import ctypes
from functools import cache

from ..codegen import cc
from . import attention_native, c_snippets, dpbf16_gemm
from .attention_native import Bf16HeadsPlan

__all__ = ["available", "DpHeadsPlan"]

SOURCE = attention_native.SOURCE + c_snippets.TRANSPOSE16 + dpbf16_gemm.DP_MICRO + r"""
#if defined(__AVX512BF16__)
/* k^T of keys [0, kc) (zero to a whole panel) over d (zero to dp) in panels of 16 keys: key j,
   d pair t at kt[(j / 16) dp 16 + t 32 + (j % 16) 2]: each 16-key group rounded into rows
   (16 x dp bf16, dp of 32), then its pairs of d (32-bit) transposed 16 x 16 in registers. */
static void pack_keys_dp(const void* key, int in16, int64_t ld, int64_t kc, int64_t d,
                         int64_t dp, uint16_t* kt, uint16_t* rows) {
  for (int64_t j0 = 0; j0 < kc; j0 += 16) {
    int64_t m = kc - j0 < 16 ? kc - j0 : 16;
    bf16_rows(key, in16, j0 * ld, ld, m, d, rows, dp, dp, 16);
    uint16_t* o = kt + j0 * dp;
    for (int64_t t = 0; t < dp; t += 32) {   /* 16 pairs of d x 16 keys */
      __m512i r[16];
      for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(rows + i * dp + t);
      transpose16(r);
      for (int x = 0; x < 16; x++) _mm512_store_si512(o + (t / 2 + x) * 32, r[x]);
    }
  }
}

/* 16 values of a row (f32 rounded to nearest even, or bf16 as they are), as the low halves of
   16 32-bit lanes (m: the lanes to read; the rest 0). vcvtneps2bf16 flushes values below
   2^-126 to zero, as vdpbf16ps does with what it reads. */
static inline __m512i bf16_lanes(const void* row, int in16, int64_t x, __mmask16 m) {
  if (in16) return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t*)row + x));
  __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, (const float*)row + x));
  return _mm512_cvtepu16_epi32(h);
}

/* v rows [0, kc) (zero to kcp, even) over dv columns (zero to dvp, of 16) in panels of 16
   columns: key pair pr, column x at vt[(x / 16) kcp 16 + pr 32 + (x % 16) 2 + key % 2]: per
   pair of rows and 16 columns, one 64-byte vector. */
static void pack_values_dp(const void* val, int in16, int64_t ld, int64_t kc, int64_t kcp,
                           int64_t dv, int64_t dvp, uint16_t* vt) {
  int64_t size = in16 ? 2 : 4;
  for (int64_t pr = 0; pr < kcp / 2; pr++) {
    int64_t j = 2 * pr;
    const char* lo_row = (const char*)val + j * ld * size;
    const char* hi_row = lo_row + ld * size;
    for (int64_t x = 0; x < dvp; x += 16) {
      __mmask16 m = dv - x >= 16 ? 0xffff : (__mmask16)((1u << (dv - x)) - 1);
      __m512i lo = bf16_lanes(lo_row, in16, x, m);
      __m512i hi = j + 1 < kc ? bf16_lanes(hi_row, in16, x, m) : _mm512_setzero_si512();
      _mm512_store_si512(vt + x * kcp + pr * 32, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}
#endif

/* 1 where this library has the AVX512-BF16 kernel. */
int attn_dp_compiled(void) {
#if defined(__AVX512BF16__)
  return 1;
#else
  return 0;
#endif
}

/* attn_heads's arguments and results with q, k, v and p rounded to bf16 (see the module).
   scratch: slots x per_thread floats (DpHeadsPlan); kb a multiple of 16. in16: q, k and v hold
   bf16 values (uint16); out16: o gets the result rounded to bf16 (strides in elements). */
void attn_heads_dp(const void* q, const void* k, const void* v, void* o, const int64_t* st,
                   int64_t nb, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d,
                   int64_t dv, float scale, float softcap, int causal, int64_t window,
                   const float* mask, const int64_t* mst, float* scratch, int64_t per_thread,
                   int64_t bq, int64_t kb, int slots, int in16, int out16) {
#if defined(__AVX512BF16__)
  int64_t qkv_size = in16 ? 2 : 4, o_size = out16 ? 2 : 4;   /* bytes per element */
  int64_t rep = hq / hkv, off = sk - sq, dp = (d + 31) / 32 * 32, dvp = (dv + 15) / 16 * 16;
  int64_t blocks = (sq + bq - 1) / bq, units = blocks * nb * hkv;
  int team = omp_get_max_threads() < slots ? omp_get_max_threads() : slots;
  int parallel = team > 1 && units > 1
      && BRAZE_PARALLEL(nb * hq * sq * sk * (d + dv), BRAZE_PAR_MIN_MACS);
  /* as the AMX core: one query block per (batch, head) in batch order, split evenly, so each
     thread reads the rows its own projection wrote; several blocks per head (causal) differ
     in work and are handed out one by one */
  omp_set_schedule(blocks == 1 ? omp_sched_static : omp_sched_dynamic, blocks == 1 ? 0 : 1);
  #pragma omp parallel num_threads(team) if(parallel)
  {
    bf16_buffers f = bf16_buffers_at(scratch, per_thread, rep, bq, kb, dp, dvp);
    uint16_t *q16 = f.q16, *kt = f.k16, *vt = f.v16, *p16 = f.p16, *rows = f.rows;
    float *sc = f.sc, *acc = f.acc, *mx = f.mx, *sum = f.sum;
    #pragma omp for schedule(runtime)
    for (int64_t u = 0; u < units; u++) {
      int64_t b, g, q0, n, lo_all, hi_all;   /* keys some row of the unit sees */
      unit_at(u, blocks, nb, hkv, bq, sq, off, sk, causal, window, &b, &g, &q0, &n, &lo_all,
              &hi_all);
      start_rows_bf16(q, in16, st, b, g, rep, q0, n, n, d, dp, bq, dvp, q16, acc, mx, sum);
      const char* kh = (const char*)k + (b * st[3] + g * st[4]) * qkv_size;
      const char* vh = (const char*)v + (b * st[6] + g * st[7]) * qkv_size;
      for (int64_t c0 = lo_all; c0 < hi_all; c0 += kb) {
        int64_t kc = hi_all - c0 < kb ? hi_all - c0 : kb, kcp = (kc + 1) / 2 * 2;
        pack_keys_dp(kh + c0 * st[5] * qkv_size, in16, st[5], kc, d, dp, kt, rows);
        pack_values_dp(vh + c0 * st[8] * qkv_size, in16, st[8], kc, kcp, dv, dvp, vt);
        for (int64_t r = 0; r < rep; r++) {
          int64_t h = g * rep + r;
          const float* mh = mask ? mask + b * mst[0] + h * mst[1] : 0;
          for (int64_t i0 = 0; i0 < n; i0 += DP_MR) {   /* scores, only the tiles rows see */
            int64_t a, z, rows_i = n - i0 < DP_MR ? n - i0 : DP_MR;
            tile_keys(q0 + i0, q0 + i0 + rows_i - 1, c0, kc, off, sk, causal, window, &a, &z);
            for (int64_t j0 = a / 16 * 16, qn; j0 < z; j0 += qn * 16) {
              qn = (z - j0 + 15) / 16 < DP_QP ? (z - j0 + 15) / 16 : DP_QP;
              dp_micro((int)rows_i, (int)qn, dp / 2, q16 + (r * bq + i0) * dp, dp,
                       kt + j0 * dp, 16 * dp, sc + i0 * kb + j0, kb, 0);
            }
          }
          softmax_rows(sc, kb, n, q0, c0, kc, off, sk, causal, window, scale, softcap, mh,
                       mst, mx + r * bq, sum + r * bq, acc + r * bq * dvp, dvp, p16, kcp, 1);
          for (int64_t i0 = 0; i0 < n; i0 += DP_MR) {   /* out += p @ v over the keys seen */
            int64_t a, z, rows_i = n - i0 < DP_MR ? n - i0 : DP_MR;
            tile_keys(q0 + i0, q0 + i0 + rows_i - 1, c0, kc, off, sk, causal, window, &a, &z);
            a = a / 2 * 2;
            z = (z + 1) / 2 * 2;   /* whole pairs: p is 0 outside each row's keys */
            for (int64_t x0 = 0, qn; z > a && x0 < dvp; x0 += qn * 16) {
              qn = (dvp - x0) / 16 < DP_QP ? (dvp - x0) / 16 : DP_QP;
              dp_micro((int)rows_i, (int)qn, (z - a) / 2, p16 + i0 * kb + a, kb,
                       vt + x0 * kcp + a * 16, 16 * kcp, acc + (r * bq + i0) * dvp + x0, dvp,
                       1);
            }
          }
        }
      }
      for (int64_t r = 0; r < rep; r++)
        write_rows((char*)o + (b * st[9] + (g * rep + r) * st[10] + q0 * st[11]) * o_size,
                   out16, st[11], acc + r * bq * dvp, dvp, sum + r * bq, n, q0, off, sk, causal,
                   window, vh, in16, st[8], dv, 1);
    }
  }
#endif
}
"""

_I64, _F32, _INT, _P = ctypes.c_int64, ctypes.c_float, ctypes.c_int, ctypes.c_void_p
_SIGNATURES = {
    "attn_dp_compiled": ([], _INT),
    "attn_heads_dp": ([_P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _F32,
                       _F32, _INT, _I64, _P, _P, _P, _I64, _I64, _I64, _INT, _INT, _INT],
                      None),
}
ROWS = 6    # query rows per micro block
KEYS = 16   # keys per panel


@cache
def _lib():
    if not dpbf16_gemm.available():
        return None
    so = cc.load_library(SOURCE, "braze_attention_dp", _SIGNATURES, cc.PRECISE_FLAGS)
    return so if so is not None and so.attn_dp_compiled() else None


def available() -> bool:
    """Whether the AVX512-BF16 attention kernel runs here (AVX512-BF16, a C compiler)."""
    return _lib() is not None and attention_native.lib() is not None


class DpHeadsPlan(Bf16HeadsPlan):
    """Bf16HeadsPlan for the C attn_heads_dp: query blocks of whole 6-row micro blocks, key
    chunks of 16-key panels."""

    rows, keys = ROWS, KEYS

    def _core(self):
        return _lib().attn_heads_dp
