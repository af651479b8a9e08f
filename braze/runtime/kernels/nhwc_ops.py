"""The steps between convs that take channels-last activations: max pooling and a per-channel
scale (x * s for s of [N or 1, C, 1, 1], squeeze-excitation's), each reading and writing NCHW
or NHWC, and the global average pool reading NHWC (its [N, C, 1, 1] output is the same in
either layout).

They let the executor keep a conv's output NHWC when such a step reads it (the max pool after
ResNet's stem, the global average pool at the end of every CNN, RegNet-Y's and MobileNetV3's
squeeze-excitation; runtime/layout.py): over an NHWC row, a window's pixels are runs of
contiguous channels, so they run in vectors of channels. These kernels take a node only when
one of its values is kept NHWC; otherwise the NCHW kernels run."""
from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

from ...ir.ops.conv import GlobalAvgPool, Pool2d, PoolKind
from ...ir.ops.elementwise import Binary, BinaryFn
from ..address import address
from ..codegen import cc
from . import c_snippets, nhwc_io, pool_resize  # noqa: F401  (registered first: tried first)
from .registry import Dispatch, Kernel, nbytes, register_kernel

__all__ = ["lib", "channels_last_input"]

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>
""" + cc.parallel_min_define() + nhwc_io.LAYOUT_BITS + c_snippets.NAN_BITS + r"""

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
            if (xc == 1) {   /* NHWC: contiguous channels (the strided form gathered) */
              #pragma omp simd
              for (int64_t ch = 0; ch < c; ch++) acc[ch] = max_nan(s[ch], acc[ch]);
            } else {
              #pragma omp simd
              for (int64_t ch = 0; ch < c; ch++) acc[ch] = max_nan(s[ch * xc], acc[ch]);
            }
          }
        }
        float* d = yi + (oy * wo + ox) * yp;
        if (yc == 1) memcpy(d, acc, (size_t)c * sizeof(float));
        else
          for (int64_t ch = 0; ch < c; ch++) d[ch * yc] = acc[ch];
      }
    }
  }
}

/* y = x [n, c, hw] * s [n or 1 (s_batch 0), c] per channel; x and y NCHW or NHWC by `lay`. */
void nhwc_channel_scale(const float* x, const float* s, float* y, int64_t n, int64_t c,
                        int64_t hw, int64_t s_batch, int lay) {
  int64_t xc = lay & IN_NHWC ? 1 : hw, xp = lay & IN_NHWC ? c : 1;
  int64_t yc = lay & OUT_NHWC ? 1 : hw, yp = lay & OUT_NHWC ? c : 1;
  #pragma omp parallel for schedule(static) if (BRAZE_PARALLEL(n * hw * c, BRAZE_PAR_MIN_MACS / 16))
  for (int64_t row = 0; row < n * hw; row++) {
    int64_t img = row / hw, p = row % hw;
    const float* xr = x + img * hw * c + p * xp;
    const float* sr = s + img * s_batch * c;
    float* yr = y + img * hw * c + p * yp;
    #pragma omp simd
    for (int64_t ch = 0; ch < c; ch++) yr[ch * yc] = xr[ch * xc] * sr[ch];
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
               "nhwc_channel_means": [_P, _P, _I64, _I64, _I64],
               "nhwc_channel_scale": [_P, _P, _P, _I64, _I64, _I64, _I64, _INT]}


@cache
def lib():
    """The compiled pooling library, or None without a C compiler."""
    return cc.load_library(SOURCE, "braze_nhwc_ops", _SIGNATURES)


def channels_last_input(node, ins, outs, ctx):
    """The activation a max pool, global average pool or per-channel scale on f32 values
    reads where this module's kernels run it (so the executor may keep that value NHWC), else
    None."""
    op = node.op
    if lib() is None or any(s.dtype.name != "f32" for s in (*ins, *outs)):
        return None
    if isinstance(op, GlobalAvgPool) or (isinstance(op, Pool2d) and op.pool is PoolKind.MAX):
        return node.inputs[0]
    at = _scaled(node, ins, outs)
    return None if at is None else node.inputs[at]


def _scaled(node, ins, outs) -> int | None:
    """The position of x in x * s (s of [N or 1, C, 1, 1], x of the output's 4-d shape)."""
    if not isinstance(node.op, Binary) or node.op.fn is not BinaryFn.MUL or len(ins) != 2:
        return None
    dims = [tuple(int(d) for d in s.dims) for s in ins]
    y = tuple(int(d) for d in outs[0].dims)
    for at in (0, 1):
        x, s = dims[at], dims[1 - at]
        if len(y) == 4 and x == y and len(s) == 4 and s[0] in (1, y[0]) and s[1] == y[1] \
                and s[2:] == (1, 1) and y[2:] != (1, 1):
            return at
    return None


@register_kernel(Pool2d)
def max_pool_nhwc(node, ins, outs, ctx):
    lay = nhwc_io.layout_bits(node, ctx)
    if not lay or channels_last_input(node, ins, outs, ctx) is None:
        return None
    op = node.op
    n, c, h, w = (int(d) for d in ins[0].dims)
    ho, wo = (int(d) for d in outs[0].dims[2:])
    args = (n, c, h, w, *op.kernel, *op.stride, op.padding[0], op.padding[1], ho, wo, lay)

    def run(x, out):
        x = np.ascontiguousarray(x)  # held in a name: a copy must outlive the call
        lib().nhwc_max_pool(address(x), address(out), *args)

    return Kernel(run, Dispatch.NATIVE, f"C max pool{nhwc_io.describe(lay)}",
                  flops=n * c * ho * wo * op.kernel[0] * op.kernel[1],
                  bytes=nbytes(ins) + nbytes(outs), channels_last=True)


@register_kernel(GlobalAvgPool)
def global_avg_pool_nhwc(node, ins, outs, ctx):
    if not nhwc_io.layout_bits(node, ctx) & nhwc_io.IN_NHWC or \
            channels_last_input(node, ins, outs, ctx) is None:
        return None
    n, c, h, w = (int(d) for d in ins[0].dims)

    def run(x, out):
        x = np.ascontiguousarray(x)  # held in a name: a copy must outlive the call
        lib().nhwc_channel_means(address(x), address(out), n, h * w, c)

    return Kernel(run, Dispatch.NATIVE, "C channel means, NHWC input", flops=n * c * h * w,
                  bytes=nbytes(ins) + nbytes(outs), channels_last=True)


@register_kernel(Binary)
def channel_scale_nhwc(node, ins, outs, ctx):
    at = _scaled(node, ins, outs)
    lay = nhwc_io.layout_bits(node, ctx, node.inputs[at]) if at is not None else 0
    if not lay or channels_last_input(node, ins, outs, ctx) is None:
        return None
    n, c, h, w = (int(d) for d in outs[0].dims)
    s_batch = int(int(ins[1 - at].dims[0]) == n and n > 1)

    def run(*arrays):
        # held in names: copies must outlive the call
        x, s = np.ascontiguousarray(arrays[at]), np.ascontiguousarray(arrays[1 - at])
        lib().nhwc_channel_scale(address(x), address(s), address(arrays[2]), n, c, h * w,
                                 s_batch, lay)

    return Kernel(run, Dispatch.NATIVE, f"C per-channel scale{nhwc_io.describe(lay)}",
                  flops=n * c * h * w, bytes=nbytes(ins) + nbytes(outs), channels_last=True)
