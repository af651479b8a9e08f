"""Convolutions under the bf16 policy on AVX512-BF16 dot products (`vdpbf16ps`), as an implicit
GEMM, for CPUs without AMX (conv_amx.py is the AMX one; both share its input copy, output
store and kernel wrapper: conv_amx.Engine).

As on AMX tiles, a conv whose input the policy rounds reads the unrounded input and copies it
once per call into a zero-padded NHWC bf16 buffer (conv_amx's conv_prep_bf16; channels padded
to even, not to 32: a 3-channel stem reads 4), and the weight is packed once: per group and
tap, panels of 16 output channels with pairs of input channels interleaved ([pair][16][2], one
64-byte vector per pair). An output tile is up to TP pixels x 64 output channels: micro blocks
of up to 6 pixels (balanced) run dpbf16_gemm's micro-kernel over every tap in registers (the
tap's A rows are the pixels' input channels in the NHWC buffer, one pixel step apart: along
the padded plane's pitch for stride 1, the stride's pixel step otherwise), the tile leaves
through an f32 scratch into NCHW as on AMX (bias, 8 x 8 transposes, residual, activation).
Products of bf16 values are exact in f32 and the sums run in f32: the policy's numbers up to
the order of the sums.

Before this, on such CPUs these convs ran braze's f32 kernels on the rounded values after two
cast passes: the bf16 policy ran CNNs slower than f32 (ResNet-50 59.7 ms against 55.2 on the
Zen 4 VM). Groups of an even number of channels run group by group; depthwise convs and
others under precision.MIN_CONV_MACS multiply-adds per output keep the f32 kernels."""
from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

from ..codegen import cc
from ..plan import aligned_empty
from . import conv_amx, dpbf16_gemm, native
from .dpbf16_gemm import DP_MICRO

__all__ = ["conv_kernel", "lib", "packed_weight", "DP"]

TP = 48  # output pixels per tile (8 micro blocks of 6)

SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#include <immintrin.h>
""" + cc.simd_math_decls() + cc.parallel_min_define() + native.ACT_SPAN + conv_amx.NHWC_IO \
    + DP_MICRO + r"""
#define TP """ + str(TP) + r"""

/* y [n, o, ho, wo] = act(conv + bias (+ res)) from conv_prep_bf16's xt (pixels cp channels
   apart) and the packed weight bp (per group and tap ky kw + kx, panels of 16 output channels
   [cg / 2 pairs][16][2]); bias [o] and res (y's shape) may be NULL. A tile is up to TP pixels
   x 64 output channels: with `pitch` (stride 1) consecutive positions q = oy wp + ox of the
   padded plane's pitch, whose input for tap (ky, kx) is the padded pixel q + ky dh wp + kx dw
   (the wp - wo positions past each row's end are computed and dropped); otherwise pixels of
   one output row, their input sw pixels apart. */
void dp_conv(const uint16_t* xt, const uint16_t* bp, const float* bias, const float* res,
             float* y, int64_t n, int64_t o, int64_t cp, int64_t groups, int64_t cg,
             int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
             int64_t hp, int64_t wp, int64_t ho, int64_t wo, int pitch, int act) {
#if defined(__AVX512BF16__)
  int64_t og = o / groups, panels = (og + 15) / 16, units = (panels + 3) / 4, taps = kh * kw;
  int64_t blocks = pitch ? (ho * wp + TP - 1) / TP : ho * ((wo + TP - 1) / TP);
  int64_t tap_w = panels * cg * 16, plane = ho * wo, step = pitch ? cp : sw * cp;
  int64_t items = n * blocks * groups * units;
  int64_t a_off[taps];   /* each tap's input pixel offset from the tile's, in elements */
  for (int64_t ky = 0; ky < kh; ky++)
    for (int64_t kx = 0; kx < kw; kx++) a_off[ky * kw + kx] = (ky * dh * wp + kx * dw) * cp;
  #pragma omp parallel if (BRAZE_PARALLEL(n * o * plane * kh * kw * cp, BRAZE_PAR_MIN_MACS))
  {
    float tmp[TP * 64] __attribute__((aligned(64)));
    #pragma omp for schedule(static)
    for (int64_t it = 0; it < items; it++) {
      int64_t gu = it % (groups * units), t = it / (groups * units), g = gu / units;
      int64_t u = gu % units, blk = t % blocks, img = t / blocks;
      int64_t q0, npx, base;  /* first position, positions, A base pixel in the image */
      tile_at(blk, TP, pitch, ho, wp, wo, sh, sw, &q0, &npx, &base);
      int64_t qn = panels - 4 * u < 4 ? panels - 4 * u : 4;
      const uint16_t* a = xt + (img * hp * wp + base) * cp + g * cg;
      const uint16_t* b = bp + g * taps * tap_w + 4 * u * cg * 16;
      int64_t mbs = (npx + DP_MR - 1) / DP_MR;   /* micro blocks of balanced heights */
      for (int64_t mb = 0; mb < mbs; mb++) {
        int64_t i0 = mb * npx / mbs, h = (mb + 1) * npx / mbs - i0;
        dp_micro_taps((int)h, (int)qn, cg / 2, a + i0 * step, step, b, cg * 16, tmp + i0 * 64,
                      64, 0, taps, a_off, tap_w);
      }
      int64_t chans = og - 64 * u < 64 ? og - 64 * u : 64, oc0 = g * og + 64 * u;
      store_tile(tmp, 64, npx, chans, oc0, bias, res, y, img, o, plane, q0, pitch, wp, wo,
                 act);
    }
  }
#endif
}

/* The conv of x [n, c, h, w]: conv_prep_bf16 into xt, then dp_conv (conv_amx's entry
   point's arguments). */
void dp_conv_run(const float* x, uint16_t* xt, const uint16_t* bp, const float* bias,
                 const float* res, float* y, int64_t n, int64_t c, int64_t h, int64_t w,
                 int64_t o, int64_t cp, int64_t groups, int64_t kh, int64_t kw, int64_t sh,
                 int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t hp,
                 int64_t wp, int64_t ho, int64_t wo, int pitch, int act) {
  conv_prep_bf16(x, xt, n, c, h, w, cp, hp, wp, pt, pl);
  dp_conv(xt, bp, bias, res, y, n, o, cp, groups, groups == 1 ? cp : c / groups, kh, kw, sh,
          sw, dh, dw, hp, wp, ho, wo, pitch, act);
}

int dp_conv_compiled(void) {
#if defined(__AVX512BF16__)
  return 1;
#else
  return 0;
#endif
}
"""

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {"dp_conv_run": [_P] * 6 + [_I64] * 19 + [_INT, _INT],
               "dp_conv_compiled": ([], _INT)}


@cache
def lib():
    """The compiled AVX512-BF16 conv library, or None (no AVX512-BF16, no C compiler)."""
    if not dpbf16_gemm.available():
        return None
    so = cc.load_library(SOURCE, "braze_conv_dp", _SIGNATURES)
    return so if so is not None and so.dp_conv_compiled() else None


def _even(c: int) -> int:
    return c + c % 2


def packed_weight(w: np.ndarray, groups: int = 1) -> np.ndarray:
    """A bf16-valued conv weight [o, cg, kh, kw] as dp_conv reads it (uint16 bf16 bits): per
    group and tap, panels of 16 output channels, pairs of input channels (zero padded to even
    for one group) interleaved: [groups, taps, panels, cg / 2, 16, 2]."""
    o, cg, kh, kw = w.shape
    og, cgp = o // groups, _even(cg) if groups == 1 else cg
    panels = -(-og // 16)
    m = np.zeros((groups, kh * kw, panels * 16, cgp), np.float32)
    m[:, :, :og, :cg] = w.reshape(groups, og, cg, kh * kw).transpose(0, 3, 1, 2)
    m = m.reshape(groups, kh * kw, panels, 16, cgp // 2, 2).transpose(0, 1, 2, 4, 3, 5)
    bits = np.ascontiguousarray(m).view(np.uint32) >> 16
    out = aligned_empty(bits.size, np.uint16)
    out[...] = bits.ravel()
    return out


DP = conv_amx.Engine(lib, "dp_conv_run", packed_weight, _even,
                     lambda groups, cg: groups == 1 or cg % 2 == 0, 0,
                     "braze AVX512-BF16 conv: implicit GEMM on NHWC bf16")


def conv_kernel(node, geo, ins, outs, ctx, act: int, has_bias: bool, residual: bool,
                numpy_act, what: str, cost: dict):
    """conv_amx.conv_kernel on the AVX512-BF16 engine."""
    return conv_amx.conv_kernel(node, geo, ins, outs, ctx, act, has_bias, residual, numpy_act,
                                what, cost, DP)
