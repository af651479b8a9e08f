"""C loops (float32, NCHW) for the convolution family's work that is not a GEMM: im2col and
col2im around the GEMM of conv / transposed conv (a gather with the bias where the transposed
conv's windows do not overlap), the per-channel bias + activation epilogue, depthwise
convolution as a direct loop (bias and activation fused; strided ones read a ring of padded
rows), max / average pooling, nearest gathers (repeated rows copied) and separable resampling
(each output index reads a few consecutive source indices, with weights taken from the op's
own interpolation matrices). OpenMP over images x channels; stride-1 inner
loops vectorize. Compiled once per machine by codegen.cc; `lib()` is None without a compiler."""
from __future__ import annotations

import ctypes
from functools import cache, partial

import numpy as np

from ...ir.ops.elementwise import UnaryFn
from ..codegen import cc
from . import c_snippets

__all__ = ["c_kernel", "contiguous", "lib", "ACTIVATIONS", "packed_call", "packed_wrappers",
           "with_packed", "VALID_RANGE"]

# The activations the C epilogue applies (code passed as `act`: c_snippets.ACT_CODES, run by
# c_snippets.ACT_SPAN with the switch outside its vector loops); others run in NumPy after it.
ACTIVATIONS = {None: 0, **{fn: c_snippets.ACT_CODES[fn.value] for fn in UnaryFn
                           if fn.value in c_snippets.ACT_CODES}}

VALID_RANGE = r"""
/* First and one-past-last output index o with 0 <= o * s + off < n (off may be negative). */
static inline void valid_range(int64_t off, int64_t s, int64_t n, int64_t n_out,
                               int64_t* lo, int64_t* hi) {
  int64_t a = off >= 0 ? 0 : (-off + s - 1) / s;
  int64_t b = n - 1 - off < 0 ? 0 : (n - 1 - off) / s + 1;
  *lo = a < n_out ? a : n_out;
  *hi = b < n_out ? b : n_out;
  if (*hi < *lo) *hi = *lo;
}
"""

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

""" + cc.simd_math_decls() + cc.parallel_min_define() + c_snippets.ACT_SPAN \
    + c_snippets.NAN_BITS + r"""
/* Loops with less work than this (multiply-adds or copies, 2^18: a sixteenth of a GEMM's bar,
   as these loops are not blocked for cache) run on one thread: waking the other threads and
   meeting them at the end costs more than they save (far more when the machine is busy and a
   woken thread waits for a core). */
#define PARALLEL(work) BRAZE_PARALLEL(work, BRAZE_PAR_MIN_MACS / 16)

""" + VALID_RANGE + r"""
/* cols[(c * kh + ky) * kw + kx, oy * wo + ox] = x[c, oy*sh + ky*dh - pt, ox*sw + kx*dw - pl]
   (0 outside the image), for one image's `channels` planes of [h, w]. */
void im2col(const float* x, float* cols, int64_t channels, int64_t h, int64_t w, int64_t kh,
            int64_t kw, int64_t sh, int64_t sw, int64_t pt, int64_t pl, int64_t dh, int64_t dw,
            int64_t ho, int64_t wo) {
  #pragma omp parallel for collapse(2) schedule(static) \
      if (PARALLEL(channels * kh * kw * ho * wo))
  for (int64_t c = 0; c < channels; c++) {
    for (int64_t k = 0; k < kh * kw; k++) {
      int64_t ky = k / kw, kx = k % kw;
      const float* plane = x + c * h * w;
      float* row = cols + (c * kh * kw + k) * ho * wo;
      int64_t lo, hi;
      valid_range(kx * dw - pl, sw, w, wo, &lo, &hi);
      for (int64_t oy = 0; oy < ho; oy++) {
        int64_t iy = oy * sh + ky * dh - pt;
        float* dst = row + oy * wo;
        if (iy < 0 || iy >= h) { memset(dst, 0, wo * sizeof(float)); continue; }
        const float* src = plane + iy * w + kx * dw - pl;
        for (int64_t ox = 0; ox < lo; ox++) dst[ox] = 0.0f;
        if (sw == 1) {
          memcpy(dst + lo, src + lo, (hi - lo) * sizeof(float));
        } else {
          for (int64_t ox = lo; ox < hi; ox++) dst[ox] = src[ox * sw];
        }
        for (int64_t ox = hi; ox < wo; ox++) dst[ox] = 0.0f;
      }
    }
  }
}

/* y[i] = act(y[i] + b (+ res[i])) over n values in place (act: c_snippets.ACT_CODES; res, a
   residual, may be NULL). */
static inline void plane_act(float* y, int64_t n, float b, const float* res, int act) {
  if (b != 0.0f) {
    #pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] += b;
  }
  act_span(y, res, y, n, act);
}

/* y[p, i] = act(y[p, i] + bias[p % channels] (+ res[p, i])) over `planes` planes of `hw`
   values, in place; bias and res may be NULL. */
void channel_epilogue(float* y, const float* bias, const float* res, int64_t planes,
                      int64_t channels, int64_t hw, int act) {
  #pragma omp parallel for schedule(static) \
      if (PARALLEL(planes * hw * (act ? 8 : 1 + (res != 0))))
  for (int64_t p = 0; p < planes; p++)
    plane_act(y + p * hw, hw, bias ? bias[p % channels] : 0.0f, res ? res + p * hw : 0, act);
}

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float*, int, const float*,
                         int, float, float*, int);
typedef int (*local_threads_fn)(int);

/* A whole conv in one call: per image and group, im2col into cols (skipped when `direct`: a
   1x1 stride-1 unpadded conv reads the image as its columns), then the GEMM
   y[i, g*og:(g+1)*og] [og, ho*wo] = w[g] [og, k] @ cols [k, ho*wo] through `sgemm`
   (cblas_sgemm, row-major), then bias (+ the residual res, may be NULL) + activation in
   place. A GEMM of fewer than
   BRAZE_PAR_MIN_MACS multiply-adds (codegen.cc) runs on the calling thread alone, set through
   MKL's thread-local count (`local_threads`, may be NULL): waking a second thread for a
   0.05 ms GEMM costs more than it saves, and far more when the machine is busy. */
void conv_gemm(sgemm_fn sgemm, local_threads_fn local_threads, const float* x, const float* wt,
               const float* bias, const float* res, float* y, float* cols, int64_t n,
               int64_t c, int64_t h,
               int64_t w, int64_t o, int64_t groups, int64_t kh, int64_t kw, int64_t sh,
               int64_t sw, int64_t pt, int64_t pl, int64_t dh, int64_t dw, int64_t ho,
               int64_t wo, int direct, int act) {
  int64_t cg = c / groups, og = o / groups, k = cg * kh * kw, hw = ho * wo;
  int single = local_threads != NULL && !BRAZE_PARALLEL(og * hw * k, BRAZE_PAR_MIN_MACS);
  int before = single ? local_threads(1) : 0;
  for (int64_t i = 0; i < n; i++) {
    for (int64_t g = 0; g < groups; g++) {
      const float* image = x + (i * c + g * cg) * h * w;
      const float* src = image;
      if (!direct) {
        im2col(image, cols, cg, h, w, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo);
        src = cols;
      }
      sgemm(101, 111, 111, (int)og, (int)hw, (int)k, 1.0f, wt + g * og * k, (int)k, src,
            (int)hw, 0.0f, y + (i * o + g * og) * hw, (int)hw);
    }
  }
  if (single) local_threads(before);
  if (bias || act || res) channel_epilogue(y, bias, res, n * o, o, hw, act);
}

/* For each of a padded row's sw column phases ph, the indices [lo, hi) that read the image
   (0 <= i * sw + ph - pl < w): bounds[2 ph], bounds[2 ph + 1]. */
static void phase_bounds(int64_t w, int64_t pl, int64_t sw, int64_t phase, int64_t* bounds) {
  for (int64_t ph = 0; ph < sw; ph++)
    valid_range(ph - pl, sw, w, phase, bounds + 2 * ph, bounds + 2 * ph + 1);
}

/* Row r of one [h, w] plane padded for a window loop: input row r - pt (fill outside the
   image), column j of it (input column j - pl) at phase j % sw, index j / sw, each phase
   `phase` floats long (dst: sw * phase floats; bounds: phase_bounds'). A tap of an output
   row then reads one unit-stride run with no bounds tests, strided or not. Stride 2 has its
   own loop: a constant stride lets the compiler split the row with vector permutes. */
static void pad_row(const float* plane, int64_t h, int64_t w, int64_t r, int64_t pt,
                    int64_t pl, int64_t sw, int64_t phase, const int64_t* bounds, float fill,
                    float* restrict dst) {
  int64_t iy = r - pt;
  if (iy < 0 || iy >= h) {
    for (int64_t j = 0; j < sw * phase; j++) dst[j] = fill;
    return;
  }
  const float* restrict src = plane + iy * w;
  for (int64_t ph = 0; ph < sw; ph++) {
    float* restrict d = dst + ph * phase;
    const float* restrict s = src + ph - pl;
    int64_t lo = bounds[2 * ph], hi = bounds[2 * ph + 1];
    for (int64_t i = 0; i < lo; i++) d[i] = fill;
    if (sw == 1) {
      for (int64_t i = lo; i < hi; i++) d[i] = s[i];
    } else if (sw == 2) {
      for (int64_t i = lo; i < hi; i++) d[i] = s[2 * i];
    } else {
      for (int64_t i = lo; i < hi; i++) d[i] = s[i * sw];
    }
    for (int64_t i = hi; i < phase; i++) d[i] = fill;
  }
}

/* Rows [0, hp) of one [h, w] plane padded for a window loop (pad_row each; pad: hp * sw *
   phase floats; bounds: phase_bounds'). */
static void pad_plane(const float* plane, int64_t h, int64_t w, int64_t pt, int64_t pl,
                      int64_t sw, int64_t hp, int64_t phase, const int64_t* bounds, float fill,
                      float* pad) {
  for (int64_t r = 0; r < hp; r++)
    pad_row(plane, h, w, r, pt, pl, sw, phase, bounds, fill, pad + r * sw * phase);
}

#if defined(__AVX512F__)
#define VW 16
#else
#define VW 8
#endif
typedef float vf __attribute__((vector_size(VW * 4), aligned(4)));

/* One output row of a depthwise conv: dst[ox] = b + sum over the taps t of f[t] * tap[t][ox]
   for ox < n (n a multiple of VW), four vectors at a time with their sums in registers. */
static void dw_row(const float* const* tap, const float* f, int64_t taps, float b, float* dst,
                   int64_t n) {
  int64_t ox = 0;
  for (; ox + 4 * VW <= n; ox += 4 * VW) {
    vf a0 = (vf){0} + b, a1 = a0, a2 = a0, a3 = a0;
    for (int64_t t = 0; t < taps; t++) {
      const float* s = tap[t] + ox;
      vf wv = (vf){0} + f[t];
      a0 += wv * *(const vf*)s;
      a1 += wv * *(const vf*)(s + VW);
      a2 += wv * *(const vf*)(s + 2 * VW);
      a3 += wv * *(const vf*)(s + 3 * VW);
    }
    *(vf*)(dst + ox) = a0;
    *(vf*)(dst + ox + VW) = a1;
    *(vf*)(dst + ox + 2 * VW) = a2;
    *(vf*)(dst + ox + 3 * VW) = a3;
  }
  for (; ox < n; ox += VW) {
    vf a0 = (vf){0} + b;
    for (int64_t t = 0; t < taps; t++) a0 += ((vf){0} + f[t]) * *(const vf*)(tap[t] + ox);
    *(vf*)(dst + ox) = a0;
  }
}

/* Depthwise conv: output channel oc reads input channel oc / mult through its own kh x kw
   filter w[oc]; bias and a residual res of y's shape (either may be NULL), then the
   activation (c_snippets.ACT_CODES), fused. The input is read through zero-padded rows split
   into their sw column phases (pad_row: column j of a padded row at phase j % sw, index
   j / sw), so a tap of an output row reads one unit-stride run with no bounds tests, strided
   or not, and an output row is one pass of vectors that keep their sums in registers over
   all kh * kw taps. Stride 1: the whole padded plane in a per-thread buffer, one flat run
   over its rows (columns past wo computed and dropped: 10x10 3x3 uses 10 of 12, against 10
   of 16 per rounded row). Strided: only the (kh - 1) dh + 1 padded rows an output row reads,
   in a ring in L1, each padded once as the output rows move down (a copy of the whole
   plane, most of whose rows a stride skips, ran at 4-8 GB/s in the OCR detector). */
void depthwise(const float* x, const float* wt, const float* bias, const float* res, float* y,
               int64_t n,
               int64_t cin, int64_t h, int64_t w, int64_t mult, int64_t kh, int64_t kw,
               int64_t sh, int64_t sw, int64_t pt, int64_t pl, int64_t dh, int64_t dw,
               int64_t ho, int64_t wo, int act) {
  int64_t cout = cin * mult, taps = kh * kw;
  int flat = sh == 1 && sw == 1;
  int64_t wo_r = (wo + VW - 1) / VW * VW;
  int64_t phase = flat ? wo + (kw - 1) * dw : wo_r + (kw - 1) * dw / sw;  /* per column phase */
  int64_t span = (kh - 1) * dh + 1;                       /* padded rows an output row reads */
  int64_t rows = flat ? (ho - 1) * sh + span : span;      /* padded rows kept */
  int64_t row = sw * phase;
  int64_t outs = flat ? (ho * phase + VW - 1) / VW * VW : wo_r;  /* outputs per dw_row call */
  int64_t slack = flat ? (kw - 1) * dw + VW : 0;          /* zeros read past the last row */
  #pragma omp parallel if (PARALLEL(n * cout * ho * wo * (taps + (act ? 8 : 0))))
  {
    float* pad = malloc((rows * row + slack + outs) * sizeof(float) + 64);
    float* out_row = pad + rows * row + slack;
    memset(pad + rows * row, 0, slack * sizeof(float));
    const float** tap = malloc(taps * sizeof(float*));
    int64_t* col = malloc((kw + 2 * sw) * sizeof(int64_t));  /* tap column offsets, bounds */
    int64_t* bounds = col + kw;
    for (int64_t kx = 0; kx < kw; kx++) col[kx] = kx * dw % sw * phase + kx * dw / sw;
    phase_bounds(w, pl, sw, phase, bounds);
    #pragma omp for schedule(static)
    for (int64_t bc = 0; bc < n * cin; bc++) {
      const float* plane = x + bc * h * w;
      int64_t b = bc / cin, ic = bc % cin;
      if (flat) {
        pad_plane(plane, h, w, pt, pl, 1, rows, phase, bounds, 0.0f, pad);
        for (int64_t t = 0; t < taps; t++) tap[t] = pad + t / kw * dh * row + t % kw * dw;
        for (int64_t m = 0; m < mult; m++) {
          int64_t oc = ic * mult + m;
          const float* rp = res ? res + (b * cout + oc) * ho * wo : 0;
          float* out = y + (b * cout + oc) * ho * wo;
          dw_row(tap, wt + oc * taps, taps, bias ? bias[oc] : 0.0f, out_row, outs);
          for (int64_t oy = 0; oy < ho; oy++)
            act_span(out_row + oy * phase, rp ? rp + oy * wo : 0, out + oy * wo, wo, act);
        }
        continue;
      }
      int64_t next = 0, slot = 0;  /* the first padded row not in the ring yet, its slot */
      for (int64_t oy = 0; oy < ho; oy++) {
        int64_t r0 = oy * sh, first = -1;  /* first: row r0's slot */
        if (next < r0) {  /* the stride skips rows: the ring starts over */
          next = r0;
          slot = 0;
        }
        for (int64_t r = r0; r < r0 + span; r++) {
          if (r == next) {
            pad_row(plane, h, w, r, pt, pl, sw, phase, bounds, 0.0f, pad + slot * row);
            next++;
            slot = slot + 1 == span ? 0 : slot + 1;
          }
          if (r == r0) first = (slot - (next - r0) + 2 * span) % span;
        }
        for (int64_t ky = 0; ky < kh; ky++) {
          int64_t at = first + ky * dh;
          const float* prow = pad + (at >= span ? at - span : at) * row;
          for (int64_t kx = 0; kx < kw; kx++) tap[ky * kw + kx] = prow + col[kx];
        }
        for (int64_t m = 0; m < mult; m++) {
          int64_t oc = ic * mult + m, at = (b * cout + oc) * ho * wo + oy * wo;
          dw_row(tap, wt + oc * taps, taps, bias ? bias[oc] : 0.0f, out_row, wo_r);
          act_span(out_row, res ? res + at : 0, y + at, wo, act);
        }
      }
    }
    free(col);
    free(tap);
    free(pad);
  }
}

/* Transposed conv scatter: y[o, iy*sh + ky*dh - pt, ix*sw + kx*dw - pl] += cols[(o * kh + ky)
   * kw + kx, iy * w + ix] over `channels` output planes of [ho, wo] (overwritten). */
void col2im(const float* cols, float* y, int64_t channels, int64_t h, int64_t w, int64_t kh,
            int64_t kw, int64_t sh, int64_t sw, int64_t pt, int64_t pl, int64_t dh, int64_t dw,
            int64_t ho, int64_t wo) {
  #pragma omp parallel for schedule(static) if (PARALLEL(channels * kh * kw * h * w))
  for (int64_t o = 0; o < channels; o++) {
    float* out = y + o * ho * wo;
    memset(out, 0, ho * wo * sizeof(float));
    for (int64_t k = 0; k < kh * kw; k++) {
      int64_t ky = k / kw, kx = k % kw;
      const float* row = cols + (o * kh * kw + k) * h * w;
      for (int64_t iy = 0; iy < h; iy++) {
        int64_t oy = iy * sh + ky * dh - pt;
        if (oy < 0 || oy >= ho) continue;
        const float* src = row + iy * w;
        float* dst = out + oy * wo;
        int64_t off = kx * dw - pl, lo, hi;
        valid_range(off, sw, wo, w, &lo, &hi);
        for (int64_t ix = lo; ix < hi; ix++) dst[ix * sw + off] += src[ix];
      }
    }
  }
}

/* Transposed conv whose windows do not overlap (kernel == stride, no dilation): y[o, oy, ox]
   = cols[(o * kh + ky) * kw + kx, iy * w + ix] + bias[o] where oy + pt = iy * kh + ky and
   ox + pl = ix * kw + kx (bias alone past the input: output padding), over `channels` output
   planes of [ho, wo], overwritten; bias may be NULL. Each output pixel is one read, no
   zeroing and no scatter-add; kw == 2 without left padding interleaves two rows with vector
   permutes. */
void col2im_disjoint(const float* cols, const float* bias, float* y, int64_t channels,
                     int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t pt, int64_t pl,
                     int64_t ho, int64_t wo) {
  int64_t hw = h * w;
  #pragma omp parallel for collapse(2) schedule(static) if (PARALLEL(channels * ho * wo))
  for (int64_t o = 0; o < channels; o++) {
    for (int64_t oy = 0; oy < ho; oy++) {
      float b = bias ? bias[o] : 0.0f;
      float* restrict dst = y + (o * ho + oy) * wo;
      int64_t iy = (oy + pt) / kh, ky = (oy + pt) % kh;
      if (iy >= h) {
        for (int64_t ox = 0; ox < wo; ox++) dst[ox] = b;
        continue;
      }
      const float* base = cols + (o * kh + ky) * kw * hw + iy * w;
      int64_t ox = 0;
      if (kw == 2 && pl == 0) {
        const float* restrict even = base;
        const float* restrict odd = base + hw;
        int64_t pairs = w < wo / 2 ? w : wo / 2;
        for (int64_t ix = 0; ix < pairs; ix++) {
          dst[2 * ix] = even[ix] + b;
          dst[2 * ix + 1] = odd[ix] + b;
        }
        ox = 2 * pairs;
      }
      int64_t ix = (ox + pl) / kw, kx = (ox + pl) % kw;
      for (; ox < wo; ox++) {
        dst[ox] = ix < w ? base[kx * hw + ix] + b : b;
        if (++kx == kw) { kx = 0; ix++; }
      }
    }
  }
}

/* Max (is_max) or average pooling of `planes` [h, w] planes; padding never enters a max;
   an average divides by kh * kw (count_pad) or by the real elements of its window (the valid
   rows times the valid columns). Each plane is padded once (pad_plane: -inf for a max, 0 for
   a sum), then an output row takes kh * kw unit-stride vector passes over the row in L1. */
void pool2d(const float* x, float* y, int64_t planes, int64_t h, int64_t w, int64_t kh,
            int64_t kw, int64_t sh, int64_t sw, int64_t pt, int64_t pl, int64_t ho,
            int64_t wo, int is_max, int count_pad) {
  int64_t phase = wo + (kw - 1) / sw, hp = (ho - 1) * sh + kh, row = sw * phase;
  float fill = is_max ? -INFINITY : 0.0f;
  #pragma omp parallel if (PARALLEL(planes * ho * wo * kh * kw))
  {
    float* pad = malloc((hp * row + wo) * sizeof(float) + 64);
    float* inv_x = pad + hp * row;  /* average: 1 / valid columns of output column ox */
    int64_t* bounds = malloc(2 * sw * sizeof(int64_t));
    phase_bounds(w, pl, sw, phase, bounds);
    for (int64_t ox = 0; ox < wo; ox++) {
      int64_t x0 = ox * sw - pl, x1 = x0 + kw;
      x0 = x0 < 0 ? 0 : x0;
      x1 = x1 > w ? w : x1;
      inv_x[ox] = count_pad ? 1.0f / (float)(kh * kw) : 1.0f / (float)(x1 > x0 ? x1 - x0 : 1);
    }
    #pragma omp for schedule(static)
    for (int64_t p = 0; p < planes; p++) {
      pad_plane(x + p * h * w, h, w, pt, pl, sw, hp, phase, bounds, fill, pad);
      float* out = y + p * ho * wo;
      for (int64_t oy = 0; oy < ho; oy++) {
        float* restrict dst = out + oy * wo;
        for (int64_t t = 0; t < kh * kw; t++) {
          const float* restrict src = pad + (oy * sh + t / kw) * row + t % kw % sw * phase
                                      + t % kw / sw;
          if (t == 0) {
            for (int64_t ox = 0; ox < wo; ox++) dst[ox] = src[ox];
          } else if (is_max) {
            for (int64_t ox = 0; ox < wo; ox++) dst[ox] = max_nan(dst[ox], src[ox]);
          } else {
            for (int64_t ox = 0; ox < wo; ox++) dst[ox] += src[ox];
          }
        }
        if (!is_max) {
          int64_t y0 = oy * sh - pt, y1 = y0 + kh;
          y0 = y0 < 0 ? 0 : y0;
          y1 = y1 > h ? h : y1;
          float rows = count_pad ? 1.0f : (float)(y1 > y0 ? y1 - y0 : 1);
          for (int64_t ox = 0; ox < wo; ox++) dst[ox] = dst[ox] * inv_x[ox] / rows;
        }
      }
    }
    free(bounds);
    free(pad);
  }
}

/* Separable resampling of `planes` [h, w] planes to [ho, wo]: along W, output ox reads
   w_taps source columns from ws[ox] with weights ww[ox, :] into tmp [planes, h, wo]; then
   along H likewise (hs, hh, h_taps) into y. */
void resample(const float* x, float* y, float* tmp, int64_t planes, int64_t h, int64_t w,
              int64_t ho, int64_t wo, const int64_t* ws, const float* ww, int64_t w_taps,
              const int64_t* hs, const float* hh, int64_t h_taps) {
  #pragma omp parallel for schedule(static) \
      if (PARALLEL(planes * wo * (h * w_taps + ho * h_taps)))
  for (int64_t p = 0; p < planes; p++) {
    const float* plane = x + p * h * w;
    float* mid = tmp + p * h * wo;
    float* out = y + p * ho * wo;
    for (int64_t iy = 0; iy < h; iy++) {
      const float* r = plane + iy * w;
      for (int64_t ox = 0; ox < wo; ox++) {
        const float* src = r + ws[ox];
        const float* wt = ww + ox * w_taps;
        float acc = 0.0f;
        for (int64_t t = 0; t < w_taps; t++) acc += wt[t] * src[t];
        mid[iy * wo + ox] = acc;
      }
    }
    for (int64_t oy = 0; oy < ho; oy++) {
      float* dst = out + oy * wo;
      const float* wt = hh + oy * h_taps;
      const float* base = mid + hs[oy] * wo;
      #pragma omp simd
      for (int64_t ox = 0; ox < wo; ox++) dst[ox] = wt[0] * base[ox];
      for (int64_t t = 1; t < h_taps; t++) {
        const float* r = base + t * wo;
        #pragma omp simd
        for (int64_t ox = 0; ox < wo; ox++) dst[ox] += wt[t] * r[ox];
      }
    }
  }
}

/* y[p] = mean of x[p, :] over `planes` rows of hw values (global average pooling). */
void plane_means(const float* x, float* y, int64_t planes, int64_t hw) {
  #pragma omp parallel for schedule(static) if (PARALLEL(planes * hw))
  for (int64_t p = 0; p < planes; p++) {
    const float* r = x + p * hw;
    float acc = 0.0f;
    #pragma omp simd reduction(+:acc)
    for (int64_t i = 0; i < hw; i++) acc += r[i];
    y[p] = acc / (float)hw;
  }
}

/* Nearest resampling: y[p, oy, ox] = x[p, hi[oy], wi[ox]]. Output rows that read the same
   source row as the row above (every second row of a 2x upsampling) are copies of the first
   of their run, which alone reads the source; `repeat` > 0 says wi[ox] = ox / repeat (an
   integer upscale along W: each source value written `repeat` times, no index gather). */
void gather2d(const float* x, float* y, int64_t planes, int64_t h, int64_t w, int64_t ho,
              int64_t wo, const int64_t* hi, const int64_t* wi, int64_t repeat) {
  #pragma omp parallel for collapse(2) schedule(static) if (PARALLEL(planes * ho * wo))
  for (int64_t p = 0; p < planes; p++) {
    for (int64_t oy = 0; oy < ho; oy++) {
      if (oy > 0 && hi[oy] == hi[oy - 1]) continue;  /* the run's first row writes it */
      const float* restrict r = x + (p * h + hi[oy]) * w;
      float* restrict dst = y + (p * ho + oy) * wo;
      if (repeat == 2) {
        for (int64_t ix = 0; ix < wo / 2; ix++) {
          dst[2 * ix] = r[ix];
          dst[2 * ix + 1] = r[ix];
        }
      } else if (repeat == 4) {
        for (int64_t ix = 0; ix < wo / 4; ix++)
          for (int64_t j = 0; j < 4; j++) dst[4 * ix + j] = r[ix];
      } else if (repeat > 0) {
        for (int64_t ix = 0; ix < wo / repeat; ix++)
          for (int64_t j = 0; j < repeat; j++) dst[ix * repeat + j] = r[ix];
      } else {
        for (int64_t ox = 0; ox < wo; ox++) dst[ox] = r[wi[ox]];
      }
      for (int64_t oz = oy + 1; oz < ho && hi[oz] == hi[oy]; oz++)
        memcpy(y + (p * ho + oz) * wo, dst, wo * sizeof(float));
    }
  }
}
"""

_I, _P, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
_SIGNATURES = {
    "im2col": [_P, _P] + [_I] * 13,
    "col2im": [_P, _P] + [_I] * 13,
    "col2im_disjoint": [_P, _P, _P] + [_I] * 9,
    "channel_epilogue": [_P, _P, _P, _I, _I, _I, _INT],
    "depthwise": [_P] * 5 + [_I] * 15 + [_INT],
    "conv_gemm": [_P] * 8 + [_I] * 16 + [_INT, _INT],
    "pool2d": [_P, _P] + [_I] * 11 + [_INT, _INT],
    "resample": [_P, _P, _P, _I, _I, _I, _I, _I, _P, _P, _I, _P, _P, _I],
    "gather2d": [_P, _P, _I, _I, _I, _I, _I, _P, _P, _I],
    "plane_means": [_P, _P, _I, _I],
}


def _void(signatures: dict) -> dict:
    """The functions of `signatures` that return nothing (an argtypes list, not an (argtypes,
    restype) pair): the kernel entry points a bound step calls."""
    return {name: args for name, args in signatures.items() if isinstance(args, list)}


def packed_wrappers(signatures: dict) -> str:
    """For each void function F of `signatures` (name -> ctypes argtypes), `F_packed(const
    int64_t* a)`: F called with its arguments read from one array of words (pointers and
    sizes). A bound step passes one pointer through ctypes instead of converting up to 27
    Python ints on every call."""
    out = []
    for name, args in _void(signatures).items():
        cast = ["(void*)(intptr_t)" if t is _P else "(int)" if t is _INT else ""
                for t in args]
        call = ", ".join(f"{c}a[{i}]" for i, c in enumerate(cast))
        out.append(f"void {name}_packed(const int64_t* a) {{ {name}({call}); }}")
    return "\n".join(out) + "\n"


def with_packed(signatures: dict) -> dict:
    """`signatures` and their void functions' `_packed` twins' (packed_wrappers)."""
    return {**signatures, **{name + "_packed": [_P] for name in _void(signatures)}}


@cache
def lib():
    """The compiled conv-family library, or None when no C compiler is available."""
    return cc.load_library(SOURCE + packed_wrappers(_SIGNATURES), "braze_conv",
                           with_packed(_SIGNATURES))


def packed_call(fn, args: tuple, library=None):
    """A zero-argument call of C function `fn` (from `library`, this module's `lib()` by
    default; built with packed_wrappers) with `args` (ints or None) fixed: the arguments are
    packed once into an int64 array that `fn`'s `_packed` twin reads."""
    words = np.array([0 if a is None else int(a) for a in args], dtype=np.int64)
    twin = getattr(library or lib(), fn.__name__ + "_packed")
    address = words.ctypes.data

    def call():
        twin(address)

    call.words = words  # keeps the array alive as long as the call
    return call


def contiguous(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def c_kernel(c_call, out: int = -1, library=None):
    """(run, bind) for a kernel that is one C call: `c_call(*arrays)` gives the C function and
    its arguments (pointers, sizes) for C-contiguous arrays. `run` makes its inputs contiguous
    on every call (the copies held until the call returns: c_call keeps only their addresses;
    a strided output, `arrays[out]`, gets the result copied back); `bind` computes the call
    once (the executor's arrays never move), its arguments packed into one array
    (packed_call). `library`: the one `c_call`'s functions come from, built with
    packed_wrappers (this module's by default)."""

    def run(*arrays):
        held = [contiguous(a) for a in arrays]
        fn, args = c_call(*held)
        fn(*args)
        if held[out] is not arrays[out]:
            np.copyto(arrays[out], held[out])

    def bind(*arrays):
        if not all(a.flags.c_contiguous for a in arrays):
            return partial(run, *arrays)
        return packed_call(*c_call(*arrays), library=library)

    return {"run": run, "bind": bind}
