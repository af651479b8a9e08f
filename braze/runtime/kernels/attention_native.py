"""Attention in one C call, flash-style, with braze's own register-blocked micro-kernels (no
BLAS): the work is cut into units of (batch, kv head, block of query rows), handed out
dynamically over the OpenMP threads (the query blocks that see the most keys first). A unit
walks the keys its rows see in chunks; per chunk it

- packs the chunk's k into panels of NR keys ([d][NR]: the scores micro-kernel's operand, zero
  padded) and its v into rows of dv padded to NR, once for all the query heads of the group
  (GQA shares them: a kv head's rep query heads run in the same unit);
- per query head: scores = q @ k^T over register tiles of MR rows x up to 4 NR-key panels
  (6-row halves of 6 x 64 under AVX-512: 0.79-0.93x the time of 12 x 16 tiles, the same
  bits), skipping the tiles a causal or sliding-window mask hides wholly; scale, softcap,
  mask and the online (running max) softmax over each row's visible keys (exp:
  codegen.vecmath's vector exp), probabilities left in the scores scratch; out += p @ v over
  the same tiles (up to 64 value columns), each row tile only over the keys its rows see.
  The scores never leave L1 / L2.

A row whose keys all fall in one chunk (every row, for up to KEY_BLOCK keys) has its
probabilities divided by their sum before p @ v, in the reference's order (dividing afterwards
changed the last bits, which Gemma 3 under the bf16 policy amplified to a 5e-3 output change
by flipping a bf16 rounding); other rows' running sums are divided out when the unit writes
them. A row whose keys are all -inf gives zeros (one with a NaN score among them NaN, as the
reference); a causal row that sees no key (fewer keys than
queries) the mean of v, as the reference's finite masked value does. q, k, v and the output
are strided views (batch, head and row strides in elements; rows contiguous), so a packed QKV
projection [B, S, (Hq + 2 Hkv) D] is read in place and the heads are written merged
[B, S, Hq D]: no head split or merge copies. A call of fewer than BRAZE_PAR_MIN_MACS
multiply-adds runs on the calling thread alone. The library is built
with cc.PRECISE_FLAGS (IEEE inf / NaN, as the vector exp assumes). Also here: RoPE applied in
place to the q and k heads of a packed QKV buffer."""
from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

from ..address import address
from ..codegen import cc
from ..codegen.vecmath import VECMATH_C
from .c_snippets import NAN_BITS, REGISTER_TILE, ROPE_ROW, TO_BF16, TRANSPOSE8

__all__ = ["lib", "attn_heads", "rope_packed", "head_strides", "HeadsPlan", "Bf16HeadsPlan"]

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>
""" + VECMATH_C + cc.parallel_min_define() + ROPE_ROW + TO_BF16 + TRANSPOSE8 + NAN_BITS + r"""
#if defined(__AVX512F__)
#define VW 16
#define MR 12
#else
#define VW 8
#define MR 6
#endif
#define NR 16
#define NV (NR / VW)

typedef float vf __attribute__((vector_size(VW * 4), aligned(4)));

int attn_max_threads(void) { return omp_get_max_threads(); }

""" + REGISTER_TILE + r"""
/* c[MR, q NR] = (acc ? c : 0) + a[MR, kc] @ b[kc, q NR] for 1 <= q <= QP column blocks of b
   (block u ps floats after block u - 1, row stride ldb): q @ k^T on k panels (ldb = NR, ps =
   d NR) and p @ v on v rows (ldb = the row stride, ps = NR) alike, in 6-row halves. */
static void tile_mm(int q, int64_t kc, const float* restrict a, int64_t lda,
                    const float* restrict b, int64_t ldb, int64_t ps, float* c, int64_t ldc,
                    int acc) {
  for (int half = 0; half < MR; half += 6) {
    const float* ah = a + half * lda;
    float* ch = c + half * ldc;
    const float* start = acc ? ch : 0;   /* accumulate onto c: one running sum per value */
#if QP == 4
    if (q == 4) { tile_hq(6, 4, kc, ah, lda, b, ldb, ps, ch, ldc, start, ldc, 0); continue; }
    if (q == 3) { tile_hq(6, 3, kc, ah, lda, b, ldb, ps, ch, ldc, start, ldc, 0); continue; }
    if (q == 2) { tile_hq(6, 2, kc, ah, lda, b, ldb, ps, ch, ldc, start, ldc, 0); continue; }
#endif
    tile_hq(6, 1, kc, ah, lda, b, ldb, ps, ch, ldc, start, ldc, 0);
  }
}

/* kp[j / NR][t][j % NR] = key[j * ld + t] for keys j < kc, 0 for kc <= j < kcp: k^T in the
   panels the scores tiles read. 8 x 8 blocks are transposed in registers (unpack, shuffle,
   128-bit permute), the rest element by element. */
static void pack_keys(const float* key, int64_t ld, int64_t kc, int64_t kcp, int64_t d,
                      float* kp) {
  int64_t j = 0;
  for (; d % 8 == 0 && j + 8 <= kc; j += 8) {
    float* dst = kp + j / NR * d * NR + j % NR;
    for (int64_t t = 0; t < d; t += 8) transpose8x8(key + j * ld + t, ld, dst + t * NR, NR);
  }
  for (; j < kcp; j++) {
    float* dst = kp + j / NR * d * NR + j % NR;
    for (int64_t t = 0; t < d; t++) dst[t * NR] = j < kc ? key[j * ld + t] : 0.0f;
  }
}

/* e^x for x <= 0 (NaN-free: x is a score minus its row's running max, or -inf); 0 below
   -87, where e^x would leave the normal range. */
static inline float exp_nonpos(float x) {
  float e = bz_exp_core(x < -87.0f ? -87.0f : x, -0.0f, 0);
  return x < -87.0f ? 0.0f : e;
}

/* The keys [lo, hi) query row `row` (of the whole query axis) sees. */
static inline void row_keys(int64_t row, int64_t off, int64_t sk, int causal, int64_t window,
                            int64_t* lo, int64_t* hi) {
  int64_t last = row + off;   /* the last query sees the last key */
  *hi = causal ? (last + 1 < sk ? last + 1 : sk) : sk;
  *lo = causal && window > 0 ? (last - window + 1 > 0 ? last - window + 1 : 0) : 0;
  if (*hi < *lo) *hi = *lo;
}

/* out[dv] = the mean of v's first n rows (row stride ld): a query a causal mask hides every key
   from (fewer keys than queries) has all its scores at the same finite stand-in for -inf. rnd:
   each value and the probability 1 / n rounded to bf16 first (the bf16 policy's core). */
static void mean_rows(const void* v, int v16, int64_t ld, int64_t n, int64_t dv, float* out,
                      int rnd) {
  for (int64_t t = 0; t < dv; t++) out[t] = 0.0f;
  for (int64_t j = 0; j < n; j++) {
    if (v16) {   /* bf16 values already (the AMX core's hand-off from its projection) */
      const uint16_t* vj = (const uint16_t*)v + j * ld;
      #pragma omp simd
      for (int64_t t = 0; t < dv; t++) out[t] += bf16_to_f32(vj[t]);
      continue;
    }
    const float* vj = (const float*)v + j * ld;
    #pragma omp simd
    for (int64_t t = 0; t < dv; t++) out[t] += rnd ? bf16_value(vj[t]) : vj[t];
  }
  float inv = n > 0 ? 1.0f / (float)n : 0.0f;
  inv = rnd ? bf16_value(inv) : inv;
  for (int64_t t = 0; t < dv; t++) out[t] *= inv;
}

/* A unit's n output rows of one head (row stride ldo; f32, or bf16 rounded to nearest even
   under o16) from its sums acc (row stride dvp) and running sums; a row that sees no key
   (every score the same finite stand-in) gets the mean of v (f32, or bf16 under v16; ld
   apart; rounded as the probabilities and values are under rnd). */
static void write_rows(void* oh, int o16, int64_t ldo, const float* acc, int64_t dvp,
                       const float* sum, int64_t n, int64_t q0, int64_t off, int64_t sk,
                       int causal, int64_t window, const void* vh, int v16, int64_t ldv,
                       int64_t dv, int rnd) {
  for (int64_t i = 0; i < n; i++) {
    int64_t lo, hi;
    row_keys(q0 + i, off, sk, causal, window, &lo, &hi);
    float* out = (float*)oh + i * ldo;
    uint16_t* out16 = (uint16_t*)oh + i * ldo;
    if (hi == lo) {
      float mean[dv];
      mean_rows(vh, v16, ldv, sk, dv, o16 ? mean : out, rnd);
      for (int64_t t = 0; o16 && t < dv; t++) out16[t] = f32_to_bf16(mean[t]);
      continue;
    }
    float inv = sum[i] > 0.0f ? 1.0f / sum[i] : 0.0f;
    const float* a_i = acc + i * dvp;
    if (o16) {
      #pragma omp simd
      for (int64_t t = 0; t < dv; t++) out16[t] = f32_to_bf16(a_i[t] * inv);
    } else {
      #pragma omp simd
      for (int64_t t = 0; t < dv; t++) out[t] = a_i[t] * inv;
    }
  }
}

/* The keys [c0 + *a, c0 + *z) of chunk [c0, c0 + kc) that some query row in [first, last]
   sees (*z <= *a: none). */
static inline void tile_keys(int64_t first, int64_t last, int64_t c0, int64_t kc, int64_t off,
                             int64_t sk, int causal, int64_t window, int64_t* a, int64_t* z) {
  int64_t lo, hi, unused;
  row_keys(first, off, sk, causal, window, &lo, &unused);
  row_keys(last, off, sk, causal, window, &unused, &hi);
  *a = lo - c0 > 0 ? lo - c0 : 0;
  *z = hi - c0 < kc ? hi - c0 : kc;
}

/* One row of a key chunk [c0, c0 + kc): scores -> scale, softcap, + mask, then the online
   softmax step against the row's running max *m and sum *l; keys outside [lo, hi) get p = 0.
   Returns the factor the row's output accumulator must be multiplied by (1: none). */
static inline float softmax_step(float* s, int64_t kc, int64_t c0, int64_t lo, int64_t hi,
                                 float scale, float softcap, const float* mrow, int64_t mc,
                                 float* m, float* l) {
  int64_t a = lo - c0 > 0 ? (lo - c0 < kc ? lo - c0 : kc) : 0, z = hi - c0 < kc ? hi - c0 : kc;
  for (int64_t j = 0; j < a; j++) s[j] = 0.0f;
  for (int64_t j = z > a ? z : a; j < kc; j++) s[j] = 0.0f;
  if (z <= a) return 1.0f;
  float mx = -INFINITY;
  if (softcap > 0.0f) {
    float inv_cap = 1.0f / softcap;
    #pragma omp simd
    for (int64_t j = a; j < z; j++) s[j] = softcap * bz_tanhf(s[j] * scale * inv_cap);
    scale = 1.0f;
  }
  if (mrow && mc == 1) {   /* scale, + mask and the row max in one pass */
    const float* mr = mrow + c0;
    #pragma omp simd reduction(max:mx)
    for (int64_t j = a; j < z; j++) {
      float x = s[j] * scale + mr[j];
      s[j] = x;
      mx = x > mx ? x : mx;
    }
  } else if (mrow) {
    for (int64_t j = a; j < z; j++) {
      float x = s[j] * scale + mrow[(c0 + j) * mc];
      s[j] = x;
      mx = x > mx ? x : mx;
    }
  } else {
    #pragma omp simd reduction(max:mx)
    for (int64_t j = a; j < z; j++) {
      float x = s[j] * scale;
      s[j] = x;
      mx = x > mx ? x : mx;
    }
  }
  float m_new = mx > *m ? mx : *m;
  if (m_new == -INFINITY) {   /* nothing seen yet but -inf and NaN (the max skips a NaN) */
    int nan = 0;
    for (int64_t j = a; j < z; j++) nan |= is_nan_bits(s[j]);
    for (int64_t j = a; j < z; j++) s[j] = nan ? NAN : 0.0f;   /* a NaN row stays NaN */
    return 1.0f;
  }
  float alpha = *m == -INFINITY ? 1.0f : exp_nonpos(*m - m_new);  /* nothing to rescale yet */
  float total = 0.0f;
  int tiny = 0;   /* some p in (0, 2^-100): its quotient may leave the normal range */
  #pragma omp simd reduction(+:total) reduction(|:tiny)
  for (int64_t j = a; j < z; j++) {
    float p = exp_nonpos(s[j] - m_new);
    s[j] = p;
    total += p;
    tiny |= p > 0.0f && p < 0x1p-100f;
  }
  if (lo >= c0 && hi <= c0 + kc) {   /* the row's only chunk: normalize now, as the reference */
    if (tiny) {
      #pragma omp simd
      for (int64_t j = a; j < z; j++) s[j] /= total;
    } else {
      /* p / total correctly rounded without a division per value (vdivps was a quarter of
         this function's time): q = p r with r = 1 / total rounded, then one FMA correction
         (Markstein: exact for quotients in the normal range) */
      float r = 1.0f / total;
      #pragma omp simd
      for (int64_t j = a; j < z; j++) {
        float q = s[j] * r;
        s[j] = fmaf(fmaf(-q, total, s[j]), r, q);
      }
    }
    *l = 1.0f;
  } else {
    *l = *l * alpha + total;
  }
  *m = m_new;
  return alpha;
}

/* A bf16 core's buffers in its thread's slice of the scratch (per_thread floats; sizes in
   HeadsPlan._bf16_per_thread): all 64-byte aligned but sc and acc, a few cache lines apart
   (with kb = bq = 128, sc, p16 and acc would start a multiple of 4 KiB apart, and the loads
   of one alias the stores to another). dp: a multiple of 32, dvp of 16. */
typedef struct {
  uint16_t* q16;   /* rep x bq x dp: the unit's q rows */
  uint16_t* k16;   /* kb x dp: the chunk's k^T, packed as the core reads it */
  uint16_t* v16;   /* kb x dvp: the chunk's v, packed as the core reads it */
  uint16_t* p16;   /* bq x kb: probabilities */
  float* sc;       /* bq x kb: scores, then probabilities */
  float* acc;      /* rep x bq x dvp: output sums */
  float* mx;       /* rep x bq: running max */
  float* sum;      /* rep x bq: running sum */
  uint16_t* rows;  /* 16 x dp: 16 keys rounded */
} bf16_buffers;

static bf16_buffers bf16_buffers_at(float* scratch, int64_t per_thread, int64_t rep,
                                    int64_t bq, int64_t kb, int64_t dp, int64_t dvp) {
  char* base = (char*)(scratch + (int64_t)omp_get_thread_num() * per_thread);
  base += (64 - (uintptr_t)base % 64) % 64;
  bf16_buffers f;
  f.q16 = (uint16_t*)base;
  f.k16 = f.q16 + rep * bq * dp + 64;
  f.v16 = f.k16 + kb * dp + 96;
  f.p16 = f.v16 + kb * dvp + 160;
  f.sc = (float*)(f.p16 + bq * kb + 224);
  f.acc = f.sc + bq * kb + 80;
  f.mx = f.acc + rep * bq * dvp;
  f.sum = f.mx + rep * bq;
  f.rows = (uint16_t*)(f.sum + rep * bq);
  return f;
}

/* Unit u of `blocks` query blocks (of bq rows) x nb batches x hkv kv heads: its batch *b,
   kv head *g, first query row *q0 and rows *n (the blocks that see the most keys first), and
   the keys [*lo, *hi) some row of it sees. */
static inline void unit_at(int64_t u, int64_t blocks, int64_t nb, int64_t hkv, int64_t bq,
                           int64_t sq, int64_t off, int64_t sk, int causal, int64_t window,
                           int64_t* b, int64_t* g, int64_t* q0, int64_t* n, int64_t* lo,
                           int64_t* hi) {
  int64_t blk = blocks - 1 - u / (nb * hkv), unused;
  *b = u % (nb * hkv) / hkv;
  *g = u % hkv;
  *q0 = blk * bq;
  *n = sq - *q0 < bq ? sq - *q0 : bq;
  row_keys(*q0, off, sk, causal, window, lo, &unused);
  row_keys(*q0 + *n - 1, off, sk, causal, window, &unused, hi);
}

/* The bf16 cores' start of a unit: for each of its rep query heads, the n q rows (f32
   rounded, or bf16 under in16) into q16 (rows dp apart, zero padded to dp columns and `rows`
   rows; head r at r bq dp), and the rows' output sums, running max and sum reset. */
static void start_rows_bf16(const void* q, int in16, const int64_t* st, int64_t b, int64_t g,
                            int64_t rep, int64_t q0, int64_t n, int64_t rows, int64_t d,
                            int64_t dp, int64_t bq, int64_t dvp, uint16_t* q16, float* acc,
                            float* mx, float* sum) {
  for (int64_t r = 0; r < rep; r++) {
    bf16_rows(q, in16, b * st[0] + (g * rep + r) * st[1] + q0 * st[2], st[2], n, d,
              q16 + r * bq * dp, dp, dp, rows);
    memset(acc + r * bq * dvp, 0, rows * dvp * sizeof(float));
    for (int64_t i = 0; i < rows; i++) { mx[r * bq + i] = -INFINITY; sum[r * bq + i] = 0.0f; }
  }
}

/* softmax_step over rows [0, n) of a key chunk [c0, c0 + kc) (scores sc, rows kb apart; the
   rows' running max mx, sum `sum` and output sums acc, rows dvp apart), each row's sums
   rescaled; the probabilities then rounded to bf16 into p16 (rows kb apart, zero to kpad
   columns), or with p16 NULL and rnd rounded in place (the f32 micro-kernels' bf16 core). */
static void softmax_rows(float* sc, int64_t kb, int64_t n, int64_t q0, int64_t c0, int64_t kc,
                         int64_t off, int64_t sk, int causal, int64_t window, float scale,
                         float softcap, const float* mh, const int64_t* mst, float* mx,
                         float* sum, float* acc, int64_t dvp, uint16_t* p16, int64_t kpad,
                         int rnd) {
  for (int64_t i = 0; i < n; i++) {
    int64_t lo, hi;
    row_keys(q0 + i, off, sk, causal, window, &lo, &hi);
    float alpha = softmax_step(sc + i * kb, kc, c0, lo, hi, scale, softcap,
                               mh ? mh + (q0 + i) * mst[2] : 0, mst[3], mx + i, sum + i);
    if (alpha != 1.0f) {
      float* a_i = acc + i * dvp;
      #pragma omp simd
      for (int64_t t = 0; t < dvp; t++) a_i[t] *= alpha;
    }
    if (p16) round_rows(sc + i * kb, kb, 1, kc, p16 + i * kb, kb, kpad, 1);
    else if (rnd) round_span(sc + i * kb, kc);
  }
}

/* st: element strides (batch, head, row) of q, k, v, out; mst: (batch, head, row, col) of the
   additive mask (0 to broadcast; mask may be NULL). scratch: slots x per_thread floats (see
   HeadsPlan). bq: query rows per unit (a multiple of MR), kb: keys per chunk (of NR). rnd:
   q, k, v and the probabilities rounded to bf16 values before their products (the bf16
   policy's attention core; products of bf16 values are exact in f32). */
static void attn_core(const float* q, const float* k, const float* v, float* o,
                      const int64_t* st, int64_t nb, int64_t hq, int64_t hkv, int64_t sq,
                      int64_t sk, int64_t d, int64_t dv, float scale, float softcap, int causal,
                      int64_t window, const float* mask, const int64_t* mst, float* scratch,
                      int64_t per_thread, int64_t bq, int64_t kb, int slots, int rnd) {
  int64_t rep = hq / hkv, off = sk - sq, dvp = (dv + NR - 1) / NR * NR;
  int64_t blocks = (sq + bq - 1) / bq, units = blocks * nb * hkv;
  int team = omp_get_max_threads() < slots ? omp_get_max_threads() : slots;
  int parallel = team > 1 && units > 1
      && BRAZE_PARALLEL(nb * hq * sq * sk * (d + dv), BRAZE_PAR_MIN_MACS);
  #pragma omp parallel for schedule(dynamic, 1) num_threads(team) if(parallel)
  for (int64_t u = 0; u < units; u++) {
    int64_t b, g, q0, n, lo_all, hi_all;   /* keys some row of the unit sees */
    unit_at(u, blocks, nb, hkv, bq, sq, off, sk, causal, window, &b, &g, &q0, &n, &lo_all,
            &hi_all);
    int64_t np = (n + MR - 1) / MR * MR;
    float* w = scratch + (int64_t)omp_get_thread_num() * per_thread;
    int64_t q_rows = rnd ? bq : MR;    /* rows of q copied per head */
    float* qt = w;                      /* rep x MR x d: a short last row tile, padded (rnd:
                                           rep x bq x d, every row, rounded) */
    float* kp = qt + rep * q_rows * d;  /* kb x d: the chunk's keys in [d][NR] panels */
    float* vp = kp + kb * d;            /* kb x dvp: the chunk's values, rows padded (when
                                           dv is not a multiple of NR or rnd; else read in
                                           place) */
    int copy_v = dv != dvp || rnd;
    float* sc = vp + (copy_v ? kb * dvp : 0);  /* bq x kb: scores, then probabilities */
    float* acc = sc + bq * kb;          /* rep x bq x dvp: output sums */
    float* mx = acc + rep * bq * dvp;   /* rep x bq: running max */
    float* sum = mx + rep * bq;         /* rep x bq: running sum */
    int64_t full = rnd ? 0 : n / MR * MR;  /* rows read in place */
    for (int64_t r = 0; r < rep; r++) {
      const float* qh = q + b * st[0] + (g * rep + r) * st[1] + q0 * st[2];
      for (int64_t i = full; i < np; i++) {
        float* dst = qt + (r * q_rows + i - full) * d;
        if (i < n) memcpy(dst, qh + i * st[2], d * sizeof(float));
        else memset(dst, 0, d * sizeof(float));
        if (rnd) round_span(dst, d);
      }
      memset(acc + r * bq * dvp, 0, np * dvp * sizeof(float));
      for (int64_t i = 0; i < np; i++) { mx[r * bq + i] = -INFINITY; sum[r * bq + i] = 0.0f; }
    }
    const float* kh = k + b * st[3] + g * st[4];
    const float* vh = v + b * st[6] + g * st[7];
    for (int64_t c0 = lo_all; c0 < hi_all; c0 += kb) {
      int64_t kc = hi_all - c0 < kb ? hi_all - c0 : kb;
      pack_keys(kh + c0 * st[5], st[5], kc, (kc + NR - 1) / NR * NR, d, kp);
      if (rnd) round_span(kp, (kc + NR - 1) / NR * NR * d);
      const float* vs = vh + c0 * st[8];
      int64_t ldv = st[8];
      if (copy_v) {
        for (int64_t j = 0; j < kc; j++) {
          memcpy(vp + j * dvp, vs + j * st[8], dv * sizeof(float));
          memset(vp + j * dvp + dv, 0, (dvp - dv) * sizeof(float));
          if (rnd) round_span(vp + j * dvp, dv);
        }
        vs = vp;
        ldv = dvp;
      }
      for (int64_t r = 0; r < rep; r++) {
        int64_t h = g * rep + r;
        const float* mh = mask ? mask + b * mst[0] + h * mst[1] : 0;
        const float* qh = q + b * st[0] + h * st[1] + q0 * st[2];
        for (int64_t i0 = 0; i0 < np; i0 += MR) {   /* scores, only the tiles rows see */
          int64_t a, z;
          tile_keys(q0 + i0, q0 + (i0 + MR < n ? i0 + MR : n) - 1, c0, kc, off, sk, causal,
                    window, &a, &z);
          const float* qa = i0 < full ? qh + i0 * st[2] : qt + (r * q_rows + i0 - full) * d;
          for (int64_t j0 = a / NR * NR, q; j0 < z; j0 += q * NR) {
            q = (z - j0 + NR - 1) / NR < QP ? (z - j0 + NR - 1) / NR : QP;
            tile_mm((int)q, d, qa, i0 < full ? st[2] : d, kp + j0 * d, NR, d * NR,
                    sc + i0 * kb + j0, kb, 0);
          }
        }
        softmax_rows(sc, kb, n, q0, c0, kc, off, sk, causal, window, scale, softcap, mh, mst,
                     mx + r * bq, sum + r * bq, acc + r * bq * dvp, dvp, 0, 0, rnd);
        for (int64_t i0 = 0; i0 < np; i0 += MR) {   /* out += p @ v over the keys rows see */
          int64_t a, z;
          tile_keys(q0 + i0, q0 + (i0 + MR < n ? i0 + MR : n) - 1, c0, kc, off, sk, causal,
                    window, &a, &z);
          for (int64_t j0 = 0, q; z > a && j0 < dvp; j0 += q * NR) {
            q = (dvp - j0) / NR < QP ? (dvp - j0) / NR : QP;
            tile_mm((int)q, z - a, sc + i0 * kb + a, kb, vs + a * ldv + j0, ldv, NR,
                    acc + (r * bq + i0) * dvp + j0, dvp, 1);
          }
        }
      }
    }
    for (int64_t r = 0; r < rep; r++)
      write_rows(o + b * st[9] + (g * rep + r) * st[10] + q0 * st[11], 0, st[11],
                 acc + r * bq * dvp, dvp, sum + r * bq, n, q0, off, sk, causal, window, vh, 0,
                 st[8], dv, rnd);
  }
}

#define ATTN_ARGS const float* q, const float* k, const float* v, float* o, \
    const int64_t* st, int64_t nb, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d, \
    int64_t dv, float scale, float softcap, int causal, int64_t window, const float* mask, \
    const int64_t* mst, float* scratch, int64_t per_thread, int64_t bq, int64_t kb, int slots
#define ATTN_PASS q, k, v, o, st, nb, hq, hkv, sq, sk, d, dv, scale, softcap, causal, window, \
    mask, mst, scratch, per_thread, bq, kb, slots

void attn_heads(ATTN_ARGS) { attn_core(ATTN_PASS, 0); }

/* attn_heads with q, k, v and the probabilities rounded to bf16 values (see attn_core). */
void attn_heads_bf16(ATTN_ARGS) { attn_core(ATTN_PASS, 1); }

/* RoPE in place on heads [0, heads) of x [nb, s, row] (head h at h * d of a row), cos / sin
   [s, n_rot / 2]. */
void rope_packed(float* x, const float* cosv, const float* sinv, int64_t nb, int64_t s,
                 int64_t row, int64_t heads, int64_t d, int64_t n_rot, int interleaved) {
  int64_t half = n_rot / 2;
  #pragma omp parallel for collapse(2) schedule(static) if(nb * s * row > BRAZE_PAR_MIN)
  for (int64_t b = 0; b < nb; b++) {
    for (int64_t p = 0; p < s; p++) {
      const float* c = cosv + p * half;
      const float* sn = sinv + p * half;
      for (int64_t h = 0; h < heads; h++) {
        float* xr = x + (b * s + p) * row + h * d;
        rope_row(xr, xr, c, sn, half, interleaved);
      }
    }
  }
}
"""

_I64, _F32, _INT, _P = ctypes.c_int64, ctypes.c_float, ctypes.c_int, ctypes.c_void_p
_SIGNATURES = {
    "attn_max_threads": ([], _INT),
    "attn_heads": ([_P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _F32, _F32,
                    _INT, _I64, _P, _P, _P, _I64, _I64, _I64, _INT], None),
    "attn_heads_bf16": ([_P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _F32,
                         _F32, _INT, _I64, _P, _P, _P, _I64, _I64, _I64, _INT], None),
    "rope_packed": ([_P, _P, _P, _I64, _I64, _I64, _I64, _I64, _I64, _INT], None),
}
MR = 6        # query rows per register tile (AVX2; the C side uses 12 under AVX-512)
NR = 16       # keys / output columns per register tile
QUERY_BLOCK = 192  # query rows per unit at most
KEY_BLOCK = 256    # keys per online-softmax chunk
UNITS_PER_THREAD = 4  # query blocks shrink (to MR rows) until each thread has this many units


@cache
def lib():
    """The compiled attention library, or None (no C compiler)."""
    return cc.load_library(SOURCE, "braze_attention", _SIGNATURES, cc.PRECISE_FLAGS)


def head_strides(a: np.ndarray) -> tuple[int, int, int] | None:
    """(batch, head, row) element strides of a float32 [B, H, S, D] view whose rows are
    contiguous, or None."""
    if a.dtype != np.float32 or a.ndim != 4 or (a.shape[-1] > 1 and a.strides[-1] != 4):
        return None
    if any(st % 4 for st in a.strides[:3]):
        return None
    return tuple(st // 4 for st in a.strides[:3])


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


class HeadsPlan:
    """Unit sizes and per-thread scratch for attn_heads on q [B, Hq, Sq, D], k [B, Hkv, Sk, D],
    v [B, Hkv, Sk, Dv]: `shape` = (B, Hq, Hkv, Sq, Sk, D, Dv); `rounded`: attn_heads_bf16's
    (every q row and v chunk copied, rounded)."""

    def __init__(self, shape: tuple[int, ...], rounded: bool = False):
        b, hq, hkv, sq, sk, d, dv = shape
        mr = 2 * MR  # room for the AVX-512 build's 12-row tiles
        self._blocks(shape, mr, NR)
        rep, dvp = hq // hkv, _round_up(dv, NR)
        self.rounded = rounded
        self.kernel = lib().attn_heads_bf16 if rounded else lib().attn_heads  # same arguments
        self.extra: tuple[int, ...] = ()  # arguments a subclass's kernel takes after those
        q_rows = max(self.bq, mr) if rounded else mr
        copy_v = dv != dvp or rounded
        self.per_thread = (rep * q_rows * d + self.kb * d + (self.kb * dvp if copy_v else 0)
                           + self.bq * self.kb + rep * self.bq * dvp + 2 * rep * self.bq)
        self.scratch_shape = (self.slots, self.per_thread)

    def _bf16_per_thread(self, dp: int, dvp: int) -> int:
        """Floats per thread of a bf16 core's buffers (bf16_buffers_at in the C source), with
        q rows padded to dp and value columns to dvp."""
        rep = self.shape[1] // self.shape[2]
        bf16 = rep * self.bq * dp + self.kb * dp + self.kb * dvp + self.bq * self.kb
        f32 = self.bq * self.kb + rep * self.bq * dvp + 2 * rep * self.bq + 8 * dp
        return _round_up(bf16 // 2 + f32 + 16 + 352, 16)   # alignment, gaps

    def _blocks(self, shape: tuple[int, ...], rows: int, keys: int) -> None:
        """shape, slots, and the query rows per unit (bq, a multiple of `rows`, small enough
        that each thread gets UNITS_PER_THREAD units) and keys per chunk (kb, of `keys`)."""
        b, _, hkv, sq, sk, _, _ = shape
        self.shape = shape
        self.slots = max(1, int(lib().attn_max_threads()))
        blocks = -(-UNITS_PER_THREAD * self.slots // max(1, b * hkv))
        self.bq = max(rows, min(_round_up(QUERY_BLOCK, rows), _round_up(-(-sq // blocks), rows)))
        self.kb = min(_round_up(KEY_BLOCK, keys), _round_up(max(sk, 1), keys))


class Bf16HeadsPlan(HeadsPlan):
    """HeadsPlan for a bf16 core (attention_amx's, attention_dp's): query blocks of whole
    `rows`, key chunks of whole `keys`, the bf16 buffers (bf16_buffers_at) in per_thread, and
    the core's extra arguments: `in16` (q, k and v come as bf16 values: the block's
    projections wrote them so) and `out16` (the output leaves rounded to bf16)."""

    rows, keys = 16, 32  # a subclass's core's

    def __init__(self, shape: tuple[int, ...], in16: bool = False, out16: bool = False):
        self._blocks(shape, self.rows, self.keys)
        d, dv = shape[5], shape[6]
        self.rounded, self.kernel = True, self._core()
        self.extra = (int(in16), int(out16))
        self.per_thread = self._bf16_per_thread(_round_up(d, 32), _round_up(dv, 16))
        self.scratch_shape = (self.slots, self.per_thread)

    def _core(self):
        raise NotImplementedError


def attn_heads(plan: HeadsPlan, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray,
               strides: tuple[int, ...], scale: float, softcap: float, causal: bool,
               window: int, mask, mask_strides: tuple[int, ...], scratch: np.ndarray) -> None:
    """Run the plan's C kernel (attn_heads, attn_heads_bf16 or AMX's). `strides`: 12 element strides
    (batch, head, row of q, k, v, out); `mask` a float32 array or None with its 4 element
    strides (0 where it broadcasts)."""
    st = np.asarray(strides, np.int64)
    mst = np.asarray(mask_strides, np.int64)
    plan.kernel(address(q), address(k), address(v), address(out), address(st), *plan.shape,
                scale, softcap, int(causal), window, None if mask is None else address(mask),
                address(mst), address(scratch), plan.per_thread, plan.bq, plan.kb, plan.slots,
                *plan.extra)


def rope_packed(qkv: np.ndarray, cos: np.ndarray, sin: np.ndarray, heads: int, d: int,
                n_rot: int, interleaved: bool) -> None:
    """RoPE in place on the first `heads` heads of each row of a contiguous [B, S, W] buffer."""
    b, s, w = qkv.shape
    lib().rope_packed(address(qkv), address(cos), address(sin), b, s, w, heads, d,
                      n_rot, int(interleaved))
