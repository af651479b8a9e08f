"""Convolutions under the bf16 policy on AVX512-BF16 dot products (`vdpbf16ps`), as an implicit
GEMM, for CPUs without AMX (conv_amx.py is the AMX one; both share nhwc_io's input copy and
output store, and conv_amx's kernel wrapper: conv_amx.Engine).

As on AMX tiles, a conv whose input the policy rounds reads the unrounded input and copies it
once per call into a zero-padded NHWC bf16 buffer (nhwc_io's conv_prep_bf16; channels padded
to even, not to 32: a 3-channel stem reads 4), and the weight is packed once: per group and
tap, panels of 16 output channels with pairs of input channels interleaved ([pair][16][2], one
64-byte vector per pair). An output tile is up to TP pixels x 64 output channels: micro blocks
of up to 6 pixels (balanced) run dpbf16_gemm's micro-kernel over every tap in registers (the
tap's A rows are the pixels' input channels in the NHWC buffer, one pixel step apart: along
the padded plane's pitch for stride 1, the stride's pixel step otherwise; tiles of balanced
sizes, input channels in blocks whose weights stay in L2 across a tile's micro blocks), the
tile leaves through an f32 scratch as on AMX (bias, residual, activation; into NCHW through
8 x 8 transposes, or NHWC rows where the executor keeps the output channels last).
Products of bf16 values are exact in f32 and the sums run in f32: the policy's numbers up to
the order of the sums.

Before this, on such CPUs these convs ran braze's f32 kernels on the rounded values after two
cast passes: the bf16 policy ran CNNs slower than f32 (ResNet-50 59.7 ms against 55.2 on the
Zen 4 VM). Groups of an even number of channels run group by group; depthwise convs and
others the policy leaves in f32 (under precision.MIN_CONV_MACS multiply-adds per output by
default) keep the f32 kernels."""
from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

from ..codegen import cc
from ..plan import aligned_empty
from . import c_snippets, conv_amx, conv_native, dpbf16_gemm, nhwc_io
from .dpbf16_gemm import DP_MICRO

__all__ = ["conv_kernel", "lib", "packed_weight", "DP"]

TP = 48  # output pixels per tile (8 micro blocks of 6)

SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#include <immintrin.h>
""" + cc.simd_math_decls() + cc.parallel_min_define() + c_snippets.ACT_SPAN + nhwc_io.NHWC_IO \
    + DP_MICRO + r"""
#define TP """ + str(TP) + r"""

#if defined(__AVX512BF16__)
NHWC_CONV(dp_conv, uint16_t, 2, DP_MR, dp_micro_taps)
#endif

/* The conv of x [n, c, h, w]: conv_prep_bf16 into xt, then dp_conv (conv_amx's entry
   point's arguments). */
void dp_conv_run(const float* x, uint16_t* xt, const uint16_t* bp, const float* bias,
                 const float* res, float* y, int64_t n, int64_t c, int64_t h, int64_t w,
                 int64_t o, int64_t cp, int64_t groups, int64_t kh, int64_t kw, int64_t sh,
                 int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t hp,
                 int64_t wp, int64_t ho, int64_t wo, int pitch, int act, int lay) {
#if defined(__AVX512BF16__)
  if ((const void*)xt != (const void*)x)  /* else bf16 NHWC values read in place */
    conv_prep_bf16(x, xt, n, c, h, w, cp, hp, wp, pt, pl, lay & (IN_NHWC | IN_BF16));
  (void)pitch;   /* NHWC_CONV's tiles need none (conv_amx's entry point takes it) */
  dp_conv(xt, bp, bias, res, y, n, o, cp, groups, groups == 1 ? cp : c / groups, kh, kw, sh,
          sw, dh, dw, hp, wp, ho, wo, act, lay);
#endif
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
_SIGNATURES = {"dp_conv_run": [_P] * 6 + [_I64] * 19 + [_INT] * 3,
               "dp_conv_compiled": ([], _INT)}


@cache
def lib():
    """The compiled AVX512-BF16 conv library, or None (no AVX512-BF16, no C compiler)."""
    if not dpbf16_gemm.available():
        return None
    so = cc.load_library(SOURCE + conv_native.packed_wrappers(_SIGNATURES), "braze_conv_dp",
                         conv_native.with_packed(_SIGNATURES))
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
                what: str, cost: dict):
    """conv_amx.conv_kernel on the AVX512-BF16 engine."""
    return conv_amx.conv_kernel(node, geo, ins, outs, ctx, act, has_bias, residual, what,
                                cost, DP)
