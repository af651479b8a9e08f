"""The float32 conv on NHWC activations (AVX-512): conv_dp's implicit GEMM with f32 FMAs.

It runs the convs whose input, output or residual the executor keeps NHWC (channels last,
runtime/layout.py): dense or grouped convs with a weight known when the program is built.
The input is read in place where it is NHWC and the conv reads no padding, stride or taps
(a 1x1 conv is then a plain GEMM over pixel rows); otherwise it is copied once per call into a
zero-padded NHWC f32 buffer (nhwc_io's conv_prep_f32, from NCHW or NHWC). The weight is packed
once per tap into panels of 16 output channels ([c][16] floats, one 64-byte vector per input
channel). An output tile is up to TP consecutive output pixels (across rows: each pixel reads
its window at its own offset, so no padding positions are computed and a stride-2 tile is
not cut at a row's end) x 64 output channels: micro blocks of up to 6 pixels (balanced)
accumulate every tap in 24 registers (per tap and input channel, 4 weight vectors and one
broadcast of each pixel's value), and the tile leaves through an f32 scratch
(nhwc_io's store_tile: bias, residual, activation; NHWC rows, or NCHW through 8 x 8
transposes). Tried as a fourth measured path on NCHW activations it won on the ResNet block
but not on whole networks: its two per-conv copies (in and out) ate the gain; with the
activations kept NHWC between convs there are no such copies."""
from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

from ..address import address
from ..codegen import cc
from ..plan import aligned_empty
from . import c_snippets, conv_native, nhwc_io

__all__ = ["lib", "packed_weight", "takes", "kernel_fields", "TP", "MIN_MACS"]

TP = 48  # output pixels per tile at most (tiles of balanced sizes)
# Dense convs under this many multiply-adds keep NCHW and the NCHW kernels: the OCR direction
# classifier's (0.15-1.2M each) ran 1.4x slower NHWC, two OpenMP regions and a padded copy
# costing more than the layout saves; MobileNetV2's smallest are 7.5M. Depthwise convs have
# no such limit: MobileNetV2's at 14 x 14 and 7 x 7 (0.4-0.7M) sit inside its NHWC chains,
# and with them NCHW the network ran 11.3 ms instead of 5.9.
MIN_MACS = 1 << 21

SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#include <immintrin.h>
""" + cc.simd_math_decls() + cc.parallel_min_define() + c_snippets.ACT_SPAN + nhwc_io.NHWC_IO \
    + r"""
#define TP """ + str(TP) + r"""
#define MR 6
#if defined(__AVX512F__)
/* c[h pixels, q panels of 16 channels] (row stride ldc) = (add ? c : 0) + sum over taps t
   and input channels of a_t @ b_t: pixel i of a_t at a + ro[i] + a_off[t] (ro NULL: i lda),
   cin channels; b_t = b + t b_tap, panels [cin][16] ps floats apart. h and q are constants
   where it is inlined. */
static inline __attribute__((always_inline)) void f32_micro_hq(
    const int h, const int q, int64_t cin, const float* restrict a, int64_t lda,
    const int64_t* ro, const float* restrict b, int64_t ps, float* restrict c, int64_t ldc,
    int add, int64_t taps, const int64_t* a_off, int64_t b_tap) {
  __m512 acc[MR][4];
  const float* ar[MR];
  #pragma GCC unroll 6
  for (int i = 0; i < h; i++) {
    ar[i] = a + (ro ? ro[i] : i * lda);
    #pragma GCC unroll 4
    for (int j = 0; j < q; j++)
      acc[i][j] = add ? _mm512_loadu_ps(c + i * ldc + j * 16) : _mm512_setzero_ps();
  }
  for (int64_t t = 0; t < taps; t++) {
    const float* bt = b + t * b_tap;
    const int64_t at = a_off[t];
    for (int64_t ch = 0; ch < cin; ch++) {
      __m512 bv[4];
      #pragma GCC unroll 4
      for (int j = 0; j < q; j++) bv[j] = _mm512_load_ps(bt + j * ps + ch * 16);
      #pragma GCC unroll 6
      for (int i = 0; i < h; i++) {
        __m512 av = _mm512_set1_ps(ar[i][at + ch]);
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

#define F32_CALL(H, Q) f32_micro_hq(H, Q, cin, a, lda, ro, b, ps, c, ldc, add, taps, a_off, \
                                    b_tap)
#define F32_ROWS(Q) switch (h) { case 1: F32_CALL(1, Q); break; case 2: F32_CALL(2, Q); \
    break; case 3: F32_CALL(3, Q); break; case 4: F32_CALL(4, Q); break; \
    case 5: F32_CALL(5, Q); break; default: F32_CALL(6, Q); }

static void f32_micro(int h, int q, int64_t cin, const float* a, int64_t lda,
                      const int64_t* ro, const float* b, int64_t ps, float* c, int64_t ldc,
                      int add, int64_t taps, const int64_t* a_off, int64_t b_tap) {
  if (q == 4) { F32_ROWS(4) return; }
  if (q == 3) { F32_ROWS(3) return; }
  if (q == 2) { F32_ROWS(2) return; }
  F32_ROWS(1)
}

NHWC_CONV(f32_conv, float, 1, MR, f32_micro)
#endif

/* y = act(conv + bias (+ res)) of x (each NCHW or NHWC by the layout bits `lay`): x copied
   by conv_prep_f32 into xt [n, hp, wp, c] unless xt is x (an NHWC input read in place), then
   f32_conv's tiles on the packed weight bp [groups][kh kw][panels][cg][16]. */
void nhwc_conv_run(const float* x, const float* xt, const float* bp, const float* bias,
                   const float* res, float* y, int64_t n, int64_t c, int64_t h, int64_t w,
                   int64_t o, int64_t groups, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                   int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t hp, int64_t wp,
                   int64_t ho, int64_t wo, int pitch, int act, int lay) {
#if defined(__AVX512F__)
  if (xt != x) conv_prep_f32(x, (float*)xt, n, c, h, w, c, hp, wp, pt, pl, lay & IN_NHWC);
  (void)pitch;   /* the depthwise prep path's; these tiles need none */
  f32_conv(xt, bp, bias, res, y, n, o, c, groups, c / groups, kh, kw, sh, sw, dh, dw, hp, wp,
           ho, wo, act, lay);
#endif
}

#if defined(__AVX512F__)
/* nhwc_depthwise_run on an NHWC input, read in place: tiles of up to TP pixels of one output
   row x 64 channels, each tap's pixel read where it lies in the image (no padded copy: on the
   small planes of a MobileNetV3-style net the copy cost more than the taps). Interior pixels
   (every tap inside the image) go DW_PX at a time with no bounds tests: DW_PX independent
   FMA chains instead of one (one chain of 9 dependent FMAs per pixel left EfficientNet's 3x3
   depthwise convs at 16-23 GFLOP/s); the edges one by one. */
#define DW_PX 4
static void dw_direct(const float* x, const float* wk, const float* bias, const float* res,
                      float* y, int64_t n, int64_t c, int64_t h, int64_t w, int64_t cp,
                      int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                      int64_t pt, int64_t pl, int64_t ho, int64_t wo, int act, int lay) {
  int64_t taps = kh * kw, units = (cp + 63) / 64, plane = ho * wo;
  int64_t per = (wo + TP - 1) / TP, tp = (wo + per - 1) / per, items = n * ho * per * units;
  int64_t a_off[taps];  /* each tap's input offset from the window's first pixel, in floats */
  for (int64_t ky = 0; ky < kh; ky++)
    for (int64_t kx = 0; kx < kw; kx++) a_off[ky * kw + kx] = (ky * dh * w + kx * dw) * c;
  #pragma omp parallel if (BRAZE_PARALLEL(n * cp * plane * taps * 16, BRAZE_PAR_MIN_MACS))
  {
    float tmp[TP * 64] __attribute__((aligned(64)));
    __m512 wv[taps];
    #pragma omp for schedule(static)
    for (int64_t it = 0; it < items; it++) {
      int64_t u = it % units, t = it / units, x0 = t % per * tp, r = t / per;
      int64_t oy = r % ho, img = r / ho, npx = wo - x0 < tp ? wo - x0 : tp;
      int64_t chans = c - 64 * u < 64 ? c - 64 * u : 64;
      const float* xi = x + img * h * w * c;
      for (int64_t j = 0; j < (chans + 15) / 16; j++) {
        int64_t ch0 = 64 * u + 16 * j, left = c - ch0;
        __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        for (int64_t k = 0; k < taps; k++) wv[k] = _mm512_load_ps(wk + k * cp + ch0);
        int64_t iy0 = oy * sh - pt;
        if (iy0 >= 0 && iy0 + (kh - 1) * dh < h)  /* interior pixels, DW_PX at a time */
          for (int64_t p = 0; p + DW_PX <= npx; p += DW_PX) {
            int64_t ix0 = (x0 + p) * sw - pl;
            if (ix0 < 0 || ix0 + (DW_PX - 1) * sw + (kw - 1) * dw >= w) continue;
            const float* b0 = xi + (iy0 * w + ix0) * c + ch0;
            __m512 acc[DW_PX];
            for (int i = 0; i < DW_PX; i++) acc[i] = _mm512_setzero_ps();
            for (int64_t k = 0; k < taps; k++) {
              const float* bk = b0 + a_off[k];
              for (int i = 0; i < DW_PX; i++)
                acc[i] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, bk + i * sw * c), wv[k],
                                         acc[i]);
            }
            for (int i = 0; i < DW_PX; i++) _mm512_store_ps(tmp + (p + i) * 64 + 16 * j, acc[i]);
          }
        for (int64_t p = 0; p < npx; p++) {  /* the rest, one by one */
          int64_t ix0 = (x0 + p) * sw - pl;
          if (p % DW_PX == 0 && p + DW_PX <= npx && iy0 >= 0 && iy0 + (kh - 1) * dh < h &&
              ix0 >= 0 && ix0 + (DW_PX - 1) * sw + (kw - 1) * dw < w) {
            p += DW_PX - 1;  /* done in the interior pass */
            continue;
          }
          __m512 acc = _mm512_setzero_ps();
          for (int64_t ky = 0; ky < kh; ky++) {
            int64_t iy = iy0 + ky * dh;
            if (iy < 0 || iy >= h) continue;
            for (int64_t kx = 0; kx < kw; kx++) {
              int64_t ix = ix0 + kx * dw;
              if (ix < 0 || ix >= w) continue;
              __m512 v = _mm512_maskz_loadu_ps(m, xi + (iy * w + ix) * c + ch0);
              acc = _mm512_fmadd_ps(v, wv[ky * kw + kx], acc);
            }
          }
          _mm512_store_ps(tmp + p * 64 + 16 * j, acc);
        }
      }
      store_tile(tmp, 64, npx, chans, 64 * u, bias, res, y, img, c, plane, oy * wo + x0, 0, 0,
                 wo, act, lay);
    }
  }
}
#endif

/* The depthwise conv (one filter per channel) of x (NCHW or NHWC by `lay`) into y, the weight
   wk [kh kw][cp] (channels zero padded to cp, a multiple of 16). An NHWC x is read in place
   (dw_direct); an NCHW one is copied by conv_prep_f32 into xt [n, hp, wp, cp], then tiles as
   NHWC_CONV's (up to TP pixels x 64 channels), each vector of 16 channels summed over the
   taps with the taps' weights held in registers. */
void nhwc_depthwise_run(const float* x, float* xt, const float* wk, const float* bias,
                        const float* res, float* y, int64_t n, int64_t c, int64_t h, int64_t w,
                        int64_t cp, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh,
                        int64_t dw, int64_t pt, int64_t pl, int64_t hp, int64_t wp, int64_t ho,
                        int64_t wo, int pitch, int act, int lay) {
#if defined(__AVX512F__)
  if (lay & IN_NHWC) {
    dw_direct(x, wk, bias, res, y, n, c, h, w, cp, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo,
              act, lay);
    return;
  }
  conv_prep_f32(x, xt, n, c, h, w, cp, hp, wp, pt, pl, 0);
  int64_t taps = kh * kw, units = (cp + 63) / 64, plane = ho * wo, step = pitch ? cp : sw * cp;
  int64_t span = pitch ? ho * wp : wo, per = (span + TP - 1) / TP, tp = (span + per - 1) / per;
  int64_t blocks = pitch ? per : ho * per, items = n * blocks * units;
  int64_t a_off[taps];
  for (int64_t ky = 0; ky < kh; ky++)
    for (int64_t kx = 0; kx < kw; kx++) a_off[ky * kw + kx] = (ky * dh * wp + kx * dw) * cp;
  #pragma omp parallel if (BRAZE_PARALLEL(n * cp * plane * taps * 16, BRAZE_PAR_MIN_MACS))
  {
    float tmp[TP * 64] __attribute__((aligned(64)));
    __m512 wv[taps];
    #pragma omp for schedule(static)
    for (int64_t it = 0; it < items; it++) {
      int64_t u = it % units, t = it / units, blk = t % blocks, img = t / blocks;
      int64_t q0, npx, base;
      tile_at(blk, tp, pitch, ho, wp, wo, sh, sw, &q0, &npx, &base);
      int64_t nv = (cp - 64 * u) / 16 < 4 ? (cp - 64 * u) / 16 : 4;
      const float* a = xt + (img * hp * wp + base) * cp + 64 * u;
      for (int64_t j = 0; j < nv; j++) {
        for (int64_t k = 0; k < taps; k++) wv[k] = _mm512_load_ps(wk + k * cp + 64 * u + 16 * j);
        for (int64_t p = 0; p < npx; p += DW_PX) {  /* DW_PX pixels' chains at a time */
          const float* ap = a + p * step + 16 * j;
          int64_t np_ = npx - p < DW_PX ? npx - p : DW_PX;
          __m512 acc[DW_PX];
          for (int i = 0; i < DW_PX; i++) acc[i] = _mm512_setzero_ps();
          for (int64_t k = 0; k < taps; k++)
            for (int i = 0; i < np_; i++)
              acc[i] = _mm512_fmadd_ps(_mm512_loadu_ps(ap + i * step + a_off[k]), wv[k], acc[i]);
          for (int i = 0; i < np_; i++) _mm512_store_ps(tmp + (p + i) * 64 + 16 * j, acc[i]);
        }
      }
      int64_t chans = c - 64 * u < 64 ? c - 64 * u : 64;
      store_tile(tmp, 64, npx, chans, 64 * u, bias, res, y, img, c, plane, q0, pitch, wp, wo,
                 act, lay);
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
_SIGNATURES = {"nhwc_conv_run": [_P] * 6 + [_I64] * 18 + [_INT] * 3,
               "nhwc_depthwise_run": [_P] * 6 + [_I64] * 17 + [_INT] * 3,
               "nhwc_compiled": ([], _INT)}


@cache
def lib():
    """The compiled NHWC f32 conv library, or None (no AVX-512, no C compiler)."""
    if "avx512f" not in cc.cpu_flags():
        return None
    so = cc.load_library(SOURCE + conv_native.packed_wrappers(_SIGNATURES), "braze_conv_nhwc",
                         conv_native.with_packed(_SIGNATURES))
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


def depthwise_weight(w: np.ndarray) -> np.ndarray:
    """A depthwise weight [c, 1, kh, kw] as nhwc_depthwise_run reads it: [kh kw, cp] floats,
    the channels zero padded to cp (a multiple of 16)."""
    c, _, kh, kw = w.shape
    out = aligned_empty(kh * kw * _up16(c), np.float32).reshape(kh * kw, _up16(c))
    out[...] = 0.0
    out[:, :c] = np.asarray(w, np.float32).reshape(c, kh * kw).T
    return out.ravel()


def _up16(c: int) -> int:
    return -(-c // 16) * 16


def _one_per_channel(geo) -> bool:
    """A depthwise conv of one filter per channel (MobileNet's)."""
    return geo.depthwise and geo.o == geo.c


def takes(node, geo, ins, outs, ctx) -> np.ndarray | None:
    """The packed weight where the conv `node` (geometry `geo`, a conv.ConvGeometry) runs
    here: AVX-512 and a C compiler, f32 arrays, one group, groups of whole panels (16 output
    channels, 8 input channels at least: RegNet's 64-channel groups) or one filter per channel
    (depthwise), a 4-d weight known when the program is built; else None. A bf16 output is
    the conv's result rounded (conv.rounded_output: the layout bits say OUT_BF16)."""
    dense = geo.groups == 1 or (geo.og % 16 == 0 and geo.cg >= 8)
    if ctx is None or not (dense or _one_per_channel(geo)) or lib() is None or \
            not all(s.dtype.name == "f32" for s in ins) or \
            outs[0].dtype.name not in ("f32", "bf16"):
        return None
    w = ctx.static.get(node.inputs[1])
    if w is None or w.dtype != np.float32 or w.ndim != 4:
        return None
    key = ("conv nhwc weight", node.inputs[1])
    if key not in ctx.prepared:
        ctx.prepared[key] = packed_weight(w, geo.groups) if dense else depthwise_weight(w)
    return ctx.prepared[key]


def kernel_fields(geo, packed: np.ndarray, lay: int, code: int, has_bias: bool,
                  residual: bool, out_at: int) -> dict:
    """The Kernel fields (run, bind, scratch) of the conv with the layout bits `lay` (nhwc_io):
    on nhwc_depthwise_run for one filter per channel, else nhwc_conv_run, the output at
    `out_at` among the step's arrays. An NHWC input is read
    in place by a depthwise conv, and by others reading no padding, stride, dilation or taps;
    otherwise it goes through a padded copy in the scratch."""
    depthwise = geo.groups > 1 and _one_per_channel(geo)
    in_place = bool(lay & nhwc_io.IN_NHWC) and (depthwise or geo.direct)
    hp, wp, pitch = (geo.h, geo.w, True) if in_place and not depthwise \
        else nhwc_io.extent(geo, 0)
    (sh, sw), (dh, dw) = geo.stride, geo.dilation
    if depthwise:
        channels = _up16(geo.c)
        entry = lib().nhwc_depthwise_run
        sizes = (geo.n, geo.c, geo.h, geo.w, channels)
    else:
        channels = geo.c
        entry = lib().nhwc_conv_run
        sizes = (geo.n, geo.c, geo.h, geo.w, geo.o, geo.groups)
    window = (geo.kh, geo.kw, sh, sw, dh, dw, geo.padding[0], geo.padding[1], hp, wp, geo.ho,
              geo.wo, int(pitch), code, lay)

    def call(x, w, *rest):
        b = rest[0] if has_bias else None
        r = rest[1] if residual else None
        return entry, (address(x), address(x if in_place else rest[-1]), address(packed),
                       None if b is None else address(b), None if r is None else address(r),
                       address(rest[out_at - 2]), *sizes, *window)

    floats = geo.n * hp * wp * channels + (TP + geo.kw * dw) * channels
    return {**conv_native.c_kernel(call, out_at, library=lib()),
            "scratch": () if in_place else (((floats,), np.float32),)}
