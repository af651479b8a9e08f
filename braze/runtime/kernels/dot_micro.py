"""The register-blocked micro-kernel of braze's dot-product GEMMs, one C template for two
instructions that each multiply a 32-bit group of a row of A (broadcast) with 16 columns:
`vdpbf16ps` (a pair of bf16 k values, f32 sums: dpbf16_gemm.py, attention_dp.py, conv_dp.py)
and `vpdpbusd` (a quad of u8 k values times s8 weights, s32 sums: int8_gemm.py).

The weight is packed in panels of 16 columns, each group of k adjacent per column
(`[group][column][G]`, one 64-byte vector per group); the micro-kernel keeps h x q (up to
6 x 4) accumulators in registers, per group loads q weight vectors and broadcasts one group
of each row's operand. `micro(prefix, ...)` instantiates it: `<prefix>_micro_taps` and
`<prefix>_micro`, with the constants `<PREFIX>_NR`, `_QP` and `_MR`."""
from __future__ import annotations

__all__ = ["micro", "DP_MICRO", "VNNI_MICRO"]

_TEMPLATE = r"""
#ifndef BRAZE_@P@_MICRO
#define BRAZE_@P@_MICRO
#include <immintrin.h>
#include <string.h>
#define @P@_NR 16   /* columns per panel */
#define @P@_QP 4    /* panels per micro block at most */
#define @P@_MR 6    /* rows per micro block at most */
#if defined(@FEATURE@)
/* c[h rows, q panels] (row stride ldc) = (load ? c : 0) + sum over taps t of a_t @ b_t over
   `groups` groups of @G@ k values; a_t = a + a_off[t] (a_off NULL: one tap at a): rows lda
   apart, or (ro not NULL) row i at ro[i] (a group's values adjacent); b_t = b + t b_tap: a
   panel slice [groups][@P@_NR][@G@], the next panel's ps values further (a GEMM: one tap; an
   implicit-GEMM conv: its kernel's taps, each a shifted view of the input, and a pixel's
   window at its own offset). h and q are constants where it is inlined: the accumulators live
   in registers. */
static inline __attribute__((always_inline)) void @p@_micro_hq(
    const int h, const int q, int64_t groups, const @A@* restrict a, int64_t lda,
    const int64_t* ro, const @B@* restrict b, int64_t ps, @C@* restrict c, int64_t ldc,
    int load, int64_t taps, const int64_t* a_off, int64_t b_tap) {
  @ACC@ acc[@P@_MR][@P@_QP];
  const @A@* ar[@P@_MR];
  #pragma GCC unroll 6
  for (int i = 0; i < h; i++) {
    ar[i] = a + (ro ? ro[i] : i * lda);
    #pragma GCC unroll 4
    for (int j = 0; j < q; j++)
      acc[i][j] = load ? @LOADC@(c + i * ldc + j * @P@_NR) : @ZERO@();
  }
  for (int64_t t = 0; t < taps; t++) {
    const int64_t at = a_off ? a_off[t] : 0;
    const @B@* bt = b + t * b_tap;
    for (int64_t p = 0; p < groups; p++) {
      __m512i bv[@P@_QP];
      #pragma GCC unroll 4
      for (int j = 0; j < q; j++) bv[j] = _mm512_load_si512(bt + j * ps + p * @G@ * @P@_NR);
      #pragma GCC unroll 6
      for (int i = 0; i < h; i++) {
        int32_t group;
        memcpy(&group, ar[i] + at + @G@ * p, 4);
        __m512i av = _mm512_set1_epi32(group);
        #pragma GCC unroll 4
        for (int j = 0; j < q; j++) acc[i][j] = @DOT@;
      }
    }
  }
  #pragma GCC unroll 6
  for (int i = 0; i < h; i++)
    #pragma GCC unroll 4
    for (int j = 0; j < q; j++) @STOREC@(c + i * ldc + j * @P@_NR, acc[i][j]);
}

#define @P@_CALL(H, Q) @p@_micro_hq(H, Q, groups, a, lda, ro, b, ps, c, ldc, load, taps, \
                                    a_off, b_tap)
#define @P@_ROWS(Q) switch (h) { case 1: @P@_CALL(1, Q); break; \
    case 2: @P@_CALL(2, Q); break; case 3: @P@_CALL(3, Q); break; \
    case 4: @P@_CALL(4, Q); break; case 5: @P@_CALL(5, Q); break; default: @P@_CALL(6, Q); }

static void @p@_micro_taps(int h, int q, int64_t groups, const @A@* a, int64_t lda,
                           const int64_t* ro, const @B@* b, int64_t ps, @C@* c,
                           int64_t ldc, int load, int64_t taps, const int64_t* a_off,
                           int64_t b_tap) {
  if (q == 4) { @P@_ROWS(4) return; }
  if (q == 3) { @P@_ROWS(3) return; }
  if (q == 2) { @P@_ROWS(2) return; }
  @P@_ROWS(1)
}

/* @p@_micro_taps of one tap: c = (load ? c : 0) + a @ b. */
static inline void @p@_micro(int h, int q, int64_t groups, const @A@* a, int64_t lda,
                             const @B@* b, int64_t ps, @C@* c, int64_t ldc, int load) {
  @p@_micro_taps(h, q, groups, a, lda, 0, b, ps, c, ldc, load, 1, 0, 0);
}

#endif
#endif
"""


def micro(prefix: str, *, feature: str, group: int, a_type: str, b_type: str, c_type: str,
          acc: str, zero: str, load: str, store: str, dot: str) -> str:
    """The micro-kernel's C for one dot instruction: `dot` is its expression in acc[i][j],
    av (the operand's broadcast group) and bv[j] (the weight's vector); `zero`, `load` and
    `store` make, load and store an accumulator of type `acc` at a `c_type*`."""
    text = _TEMPLATE
    for token, value in (("@P@", prefix.upper()), ("@p@", prefix), ("@FEATURE@", feature),
                         ("@G@", str(group)), ("@A@", a_type), ("@B@", b_type),
                         ("@C@", c_type), ("@ACC@", acc), ("@ZERO@", zero),
                         ("@LOADC@", load), ("@STOREC@", store), ("@DOT@", dot)):
        text = text.replace(token, value)
    return text


DP_MICRO = micro("dp", feature="__AVX512BF16__", group=2, a_type="uint16_t",
                 b_type="uint16_t", c_type="float", acc="__m512", zero="_mm512_setzero_ps",
                 load="_mm512_loadu_ps", store="_mm512_storeu_ps",
                 dot="_mm512_dpbf16_ps(acc[i][j], (__m512bh)av, (__m512bh)bv[j])")
# u8 operand (the first, unsigned source of vpdpbusd) times s8 weight, s32 sums (no saturation)
VNNI_MICRO = micro("vnni", feature="__AVX512VNNI__", group=4, a_type="uint8_t",
                   b_type="int8_t", c_type="int32_t", acc="__m512i",
                   zero="_mm512_setzero_si512", load="_mm512_loadu_si512",
                   store="_mm512_storeu_si512", dot="_mm512_dpbusd_epi32(acc[i][j], av, bv[j])")
