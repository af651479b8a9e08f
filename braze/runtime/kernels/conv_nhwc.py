"""A float32 conv path on AVX-512: conv_dp's implicit GEMM with f32 FMAs ("nhwc", one of the
conv paths measured per geometry, conv.conv_choice).

The input is copied once per call into a zero-padded NHWC f32 buffer (conv_amx's
conv_prep_f32), the weight packed once per group and tap into panels of 16 output channels
([c][16] floats, one 64-byte vector per input channel). An output tile is up to TP pixels x
64 output channels: micro blocks of up to 6 pixels (balanced) accumulate every tap in 24
registers (per tap and input channel, 4 weight vectors and one broadcast of each pixel's
value), and the tile leaves through an f32 scratch into NCHW (conv_amx's store_tile: bias,
8 x 8 transposes, residual, activation). Where the other paths leave vector lanes idle (small
planes, few output channels per tile) or re-read their input per tap, this one keeps every
tap's sum in registers; what it pays is the per-call NHWC copy."""
from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

from ..address import address
from ..codegen import cc
from ..plan import aligned_empty
from . import conv_amx, native

__all__ = ["lib", "packed_weight", "extent", "run_args", "TP"]

TP = 48  # output pixels per tile (8 micro blocks of 6)

SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#include <immintrin.h>
""" + cc.simd_math_decls() + cc.parallel_min_define() + native.ACT_SPAN + conv_amx.NHWC_IO \
    + r"""
#define TP """ + str(TP) + r"""
#define MR 6
#if defined(__AVX512F__)
/* c[h pixels, q panels of 16 channels] (row stride ldc) = sum over taps t and input channels
   of a_t @ b_t: a_t = a + a_off[t], pixels lda apart, cin channels each; b_t = b + t b_tap,
   panels [cin][16] ps floats apart. h and q are constants where it is inlined. */
static inline __attribute__((always_inline)) void f32_micro_hq(
    const int h, const int q, int64_t cin, const float* restrict a, int64_t lda,
    const float* restrict b, int64_t ps, float* restrict c, int64_t ldc, int64_t taps,
    const int64_t* a_off, int64_t b_tap) {
  __m512 acc[MR][4];
  #pragma GCC unroll 6
  for (int i = 0; i < h; i++)
    #pragma GCC unroll 4
    for (int j = 0; j < q; j++) acc[i][j] = _mm512_setzero_ps();
  for (int64_t t = 0; t < taps; t++) {
    const float* at = a + a_off[t];
    const float* bt = b + t * b_tap;
    for (int64_t ch = 0; ch < cin; ch++) {
      __m512 bv[4];
      #pragma GCC unroll 4
      for (int j = 0; j < q; j++) bv[j] = _mm512_load_ps(bt + j * ps + ch * 16);
      #pragma GCC unroll 6
      for (int i = 0; i < h; i++) {
        __m512 av = _mm512_set1_ps(at[i * lda + ch]);
        #pragma GCC unroll 4
        for (int j = 0; j < q; j++) acc[i][j] = _mm512_fmadd_ps(av, bv[j], acc[i][j]);
      }
    }
  }
  #pragma GCC unroll 6
  for (int i = 0; i < h; i++)
    #pragma GCC unroll 4
    for (int j = 0; j < q; j++) _mm512_storeu_ps(c + i * ldc + j * 16, acc[i][j]);
}

#define F32_CALL(H, Q) f32_micro_hq(H, Q, cin, a, lda, b, ps, c, ldc, taps, a_off, b_tap)
#define F32_ROWS(Q) switch (h) { case 1: F32_CALL(1, Q); break; case 2: F32_CALL(2, Q); \
    break; case 3: F32_CALL(3, Q); break; case 4: F32_CALL(4, Q); break; \
    case 5: F32_CALL(5, Q); break; default: F32_CALL(6, Q); }

static void f32_micro(int h, int q, int64_t cin, const float* a, int64_t lda, const float* b,
                      int64_t ps, float* c, int64_t ldc, int64_t taps, const int64_t* a_off,
                      int64_t b_tap) {
  if (q == 4) { F32_ROWS(4) return; }
  if (q == 3) { F32_ROWS(3) return; }
  if (q == 2) { F32_ROWS(2) return; }
  F32_ROWS(1)
}
#endif

/* y [n, o, ho, wo] = act(conv + bias (+ res)) of x [n, c, h, w]: conv_prep_f32 into xt
   [n, hp, wp, c], then tiles of up to TP pixels x 64 output channels (as conv_dp's: with
   `pitch`, positions along the padded plane's pitch; otherwise pixels of one output row) on
   the packed weight bp [groups][kh kw][panels][cg][16]; bias [o] and res may be NULL. */
void nhwc_conv_run(const float* x, float* xt, const float* bp, const float* bias,
                   const float* res, float* y, int64_t n, int64_t c, int64_t h, int64_t w,
                   int64_t o, int64_t groups, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                   int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t hp, int64_t wp,
                   int64_t ho, int64_t wo, int pitch, int act) {
#if defined(__AVX512F__)
  conv_prep_f32(x, xt, n, c, h, w, c, hp, wp, pt, pl);
  int64_t cg = c / groups, og = o / groups, panels = (og + 15) / 16, units = (panels + 3) / 4;
  int64_t taps = kh * kw, tap_w = panels * cg * 16, plane = ho * wo, step = pitch ? c : sw * c;
  int64_t blocks = pitch ? (ho * wp + TP - 1) / TP : ho * ((wo + TP - 1) / TP);
  int64_t items = n * blocks * groups * units;
  int64_t a_off[taps];   /* each tap's input pixel offset from the tile's, in floats */
  for (int64_t ky = 0; ky < kh; ky++)
    for (int64_t kx = 0; kx < kw; kx++) a_off[ky * kw + kx] = (ky * dh * wp + kx * dw) * c;
  #pragma omp parallel if (BRAZE_PARALLEL(n * o * plane * kh * kw * cg, BRAZE_PAR_MIN_MACS))
  {
    float tmp[TP * 64] __attribute__((aligned(64)));
    #pragma omp for schedule(static)
    for (int64_t it = 0; it < items; it++) {
      int64_t gu = it % (groups * units), t = it / (groups * units), g = gu / units;
      int64_t u = gu % units, blk = t % blocks, img = t / blocks;
      int64_t q0, npx, base;  /* first position, positions, A base pixel in the image */
      tile_at(blk, TP, pitch, ho, wp, wo, sh, sw, &q0, &npx, &base);
      int64_t qn = panels - 4 * u < 4 ? panels - 4 * u : 4;
      const float* a = xt + (img * hp * wp + base) * c + g * cg;
      const float* b = bp + g * taps * tap_w + 4 * u * cg * 16;
      int64_t mbs = (npx + MR - 1) / MR;   /* micro blocks of balanced heights */
      for (int64_t mb = 0; mb < mbs; mb++) {
        int64_t i0 = mb * npx / mbs, hh = (mb + 1) * npx / mbs - i0;
        f32_micro((int)hh, (int)qn, cg, a + i0 * step, step, b, cg * 16, tmp + i0 * 64, 64,
                  taps, a_off, tap_w);
      }
      int64_t chans = og - 64 * u < 64 ? og - 64 * u : 64, oc0 = g * og + 64 * u;
      store_tile(tmp, 64, npx, chans, oc0, bias, res, y, img, o, plane, q0, pitch, wp, wo,
                 act);
    }
  }
#endif
}

int nhwc_compiled(void) {
#if defined(__AVX512F__)
  return 1;
#else
  return 0;
#endif
}
"""

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {"nhwc_conv_run": [_P] * 6 + [_I64] * 18 + [_INT, _INT],
               "nhwc_compiled": ([], _INT)}


@cache
def lib():
    """The compiled NHWC f32 conv library, or None (no AVX-512, no C compiler)."""
    if "avx512f" not in cc.cpu_flags():
        return None
    so = cc.load_library(SOURCE, "braze_conv_nhwc", _SIGNATURES)
    return so if so is not None and so.nhwc_compiled() else None


def packed_weight(w: np.ndarray, groups: int = 1) -> np.ndarray:
    """A conv weight [o, cg, kh, kw] as nhwc_conv_run reads it: per group and tap, panels of
    16 output channels (the last zero padded), [groups, taps, panels, cg, 16] floats."""
    o, cg, kh, kw = w.shape
    og = o // groups
    panels = -(-og // 16)
    m = np.zeros((groups, kh * kw, panels * 16, cg), np.float32)
    m[:, :, :og, :] = np.asarray(w, np.float32).reshape(groups, og, cg, kh * kw) \
        .transpose(0, 3, 1, 2)
    m = m.reshape(groups, kh * kw, panels, 16, cg).transpose(0, 1, 2, 4, 3)
    out = aligned_empty(m.size, np.float32)
    out[...] = m.ravel()
    return out


def extent(geo) -> tuple[int, int, bool]:
    """The padded input's rows and columns and whether tiles run along its pitch."""
    return conv_amx.nhwc_extent(geo, 0)


def scratch_floats(geo) -> int:
    """Floats of the NHWC copy of the input (with the pitch tiles' over-read past its end)."""
    hp, wp, _ = extent(geo)
    return geo.n * hp * wp * geo.c + (TP + geo.kw * geo.dilation[1]) * geo.c


def run_args(geo, x, xt, packed, bias, res, y, act: int) -> tuple:
    """nhwc_conv_run's arguments."""
    hp, wp, pitch = extent(geo)
    (sh, sw), (dh, dw) = geo.stride, geo.dilation
    return (address(x), address(xt), address(packed), None if bias is None else address(bias),
            None if res is None else address(res), address(y), geo.n, geo.c, geo.h, geo.w,
            geo.o, geo.groups, geo.kh, geo.kw, sh, sw, dh, dw, geo.padding[0], geo.padding[1],
            hp, wp, geo.ho, geo.wo, int(pitch), act)
