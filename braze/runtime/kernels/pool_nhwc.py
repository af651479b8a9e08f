"""Pooling on channels-last activations: max pooling reading and writing NCHW or NHWC, and the
global average pool reading NHWC (its [N, C, 1, 1] output is the same in either layout).

They let the executor keep a conv's output NHWC when a pooling step reads it (the max pool
after ResNet's stem, the global average pool at the end of every CNN; runtime/layout.py):
over an NHWC row, a window's pixels are runs of contiguous channels, so both run in vectors
of channels. These kernels take a node only when one of its values is kept NHWC; otherwise
conv.py's NCHW pooling runs."""
from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

from ...ir.ops.conv import GlobalAvgPool, Pool2d, PoolKind
from ..address import address
from ..codegen import cc
from . import nhwc_io
from .registry import Dispatch, Kernel, nbytes, register_kernel

__all__ = ["lib", "channels_last_input"]

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <omp.h>
""" + cc.parallel_min_define() + r"""
#define IN_NHWC 1
#define OUT_NHWC 2

/* y = max over kh x kw windows (stride sh x sw, top / left padding pt / pl: -inf outside)
   of x [n, c, h, w] into y [n, c, ho, wo]; each NCHW or NHWC by the layout bits `lay`. A NaN
   in a window is its maximum, as NumPy's. */
void nhwc_max_pool(const float* x, float* y, int64_t n, int64_t c, int64_t h, int64_t w,
                   int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t pt, int64_t pl,
                   int64_t ho, int64_t wo, int lay) {
  int64_t xc = lay & IN_NHWC ? 1 : h * w, xp = lay & IN_NHWC ? c : 1;  /* channel, pixel */
  int64_t yc = lay & OUT_NHWC ? 1 : ho * wo, yp = lay & OUT_NHWC ? c : 1;
  #pragma omp parallel if (BRAZE_PARALLEL(n * c * ho * wo * kh * kw, BRAZE_PAR_MIN_MACS / 16))
  {
    float acc[c];
    #pragma omp for schedule(static)
    for (int64_t row = 0; row < n * ho; row++) {
      int64_t img = row / ho, oy = row % ho;
      const float* xi = x + img * c * h * w;
      float* yi = y + img * c * ho * wo;
      for (int64_t ox = 0; ox < wo; ox++) {
        for (int64_t ch = 0; ch < c; ch++) acc[ch] = -INFINITY;
        for (int64_t ky = 0; ky < kh; ky++) {
          int64_t iy = oy * sh - pt + ky;
          if (iy < 0 || iy >= h) continue;
          for (int64_t kx = 0; kx < kw; kx++) {
            int64_t ix = ox * sw - pl + kx;
            if (ix < 0 || ix >= w) continue;
            const float* s = xi + (iy * w + ix) * xp;
            #pragma omp simd
            for (int64_t ch = 0; ch < c; ch++) {
              float v = s[ch * xc];
              acc[ch] = (v > acc[ch] || v != v) ? v : acc[ch];
            }
          }
        }
        float* d = yi + (oy * wo + ox) * yp;
        for (int64_t ch = 0; ch < c; ch++) d[ch * yc] = acc[ch];
      }
    }
  }
}

/* y [n, c] = the mean of each channel of x [n, hw, c] (NHWC) over its hw pixels. */
void nhwc_channel_means(const float* x, float* y, int64_t n, int64_t hw, int64_t c) {
  int64_t blocks = (c + 63) / 64;
  #pragma omp parallel for schedule(static) if (BRAZE_PARALLEL(n * hw * c, BRAZE_PAR_MIN_MACS / 16))
  for (int64_t it = 0; it < n * blocks; it++) {
    int64_t img = it / blocks, c0 = it % blocks * 64, cn = c - c0 < 64 ? c - c0 : 64;
    float acc[64] = {0};
    const float* xi = x + img * hw * c + c0;
    for (int64_t p = 0; p < hw; p++) {
      #pragma omp simd
      for (int64_t ch = 0; ch < cn; ch++) acc[ch] += xi[p * c + ch];
    }
    for (int64_t ch = 0; ch < cn; ch++) y[img * c + c0 + ch] = acc[ch] / (float)hw;
  }
}
"""

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {"nhwc_max_pool": [_P, _P] + [_I64] * 12 + [_INT],
               "nhwc_channel_means": [_P, _P, _I64, _I64, _I64]}


@cache
def lib():
    """The compiled pooling library, or None without a C compiler."""
    return cc.load_library(SOURCE, "braze_pool_nhwc", _SIGNATURES)


def channels_last_input(node, ins, outs, ctx):
    """The input of a max pool or global average pool on f32 values where this module's
    kernels run it (so the executor may keep that value NHWC), else None."""
    op = node.op
    if lib() is None or any(s.dtype.name != "f32" for s in (*ins, *outs)):
        return None
    if isinstance(op, GlobalAvgPool) or (isinstance(op, Pool2d) and op.pool is PoolKind.MAX):
        return node.inputs[0]
    return None


def _bits(node, ctx) -> int:
    nhwc = ctx.channels_last if ctx is not None else ()
    return ((nhwc_io.IN_NHWC if node.inputs[0] in nhwc else 0) |
            (nhwc_io.OUT_NHWC if node.value in nhwc else 0))


@register_kernel(Pool2d)
def max_pool_nhwc(node, ins, outs, ctx):
    lay = _bits(node, ctx)
    if not lay or channels_last_input(node, ins, outs, ctx) is None:
        return None
    op = node.op
    n, c, h, w = (int(d) for d in ins[0].dims)
    ho, wo = (int(d) for d in outs[0].dims[2:])
    args = (n, c, h, w, *op.kernel, *op.stride, op.padding[0], op.padding[1], ho, wo, lay)

    def run(x, out):
        lib().nhwc_max_pool(address(np.ascontiguousarray(x)), address(out), *args)

    return Kernel(run, Dispatch.NATIVE, f"C max pool{nhwc_io.describe(lay)}",
                  flops=n * c * ho * wo * op.kernel[0] * op.kernel[1],
                  bytes=nbytes(ins) + nbytes(outs), channels_last=True)


@register_kernel(GlobalAvgPool)
def global_avg_pool_nhwc(node, ins, outs, ctx):
    if not _bits(node, ctx) & nhwc_io.IN_NHWC or \
            channels_last_input(node, ins, outs, ctx) is None:
        return None
    n, c, h, w = (int(d) for d in ins[0].dims)

    def run(x, out):
        lib().nhwc_channel_means(address(np.ascontiguousarray(x)), address(out), n, h * w, c)

    return Kernel(run, Dispatch.NATIVE, "C channel means, NHWC input", flops=n * c * h * w,
                  bytes=nbytes(ins) + nbytes(outs), channels_last=True)
