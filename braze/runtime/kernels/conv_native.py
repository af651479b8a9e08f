"""C loops (float32, NCHW) for the convolution family's work that is not a GEMM: im2col and
col2im around the GEMM of conv / transposed conv, the per-channel bias + activation epilogue,
depthwise convolution as a direct loop (bias and activation fused), max / average pooling, and
separable resampling (each output index reads a few consecutive source indices, with weights
taken from the op's own interpolation matrices). OpenMP over images x channels; stride-1 inner
loops vectorize. Compiled once per machine by codegen.cc; `lib()` is None without a compiler."""
from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

from ...ir.ops.elementwise import UnaryFn
from ..codegen import cc

__all__ = ["lib", "ACTIVATIONS", "packed_call"]

# The activations the C epilogue applies (code passed as `act`); others run in NumPy after it.
ACTIVATIONS = {None: 0, UnaryFn.RELU: 1, UnaryFn.HARD_SWISH: 2, UnaryFn.SIGMOID: 3,
               UnaryFn.SILU: 4, UnaryFn.TANH: 5, UnaryFn.GELU: 6, UnaryFn.GELU_APPROX: 7,
               UnaryFn.QUICK_GELU: 8}

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>

""" + cc.parallel_min_define() + r"""
/* Loops with less work than this (multiply-adds or copies, 2^18: a sixteenth of a GEMM's bar,
   as these loops are not blocked for cache) run on one thread: waking the other threads and
   meeting them at the end costs more than they save (far more when the machine is busy and a
   woken thread waits for a core). */
#define PARALLEL(work) BRAZE_PARALLEL(work, BRAZE_PAR_MIN_MACS / 16)

static inline float epilogue(float v, int act) {
  if (act == 1) return v > 0.0f ? v : 0.0f;
  if (act == 2) return v * fminf(fmaxf(v + 3.0f, 0.0f), 6.0f) / 6.0f;
  if (act == 3) return 1.0f / (1.0f + expf(-v));
  if (act == 4) return v / (1.0f + expf(-v));
  if (act == 5) return tanhf(v);
  if (act == 6) return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  if (act == 7) return 0.5f * v * (1.0f + tanhf(0.79788456080286536f
                                               * (v + 0.044715f * v * v * v)));
  if (act == 8) return v / (1.0f + expf(-1.702f * v));
  return v;
}

/* First and one-past-last output index o with 0 <= o * s + off < n (off may be negative). */
static inline void valid_range(int64_t off, int64_t s, int64_t n, int64_t n_out,
                               int64_t* lo, int64_t* hi) {
  int64_t a = off >= 0 ? 0 : (-off + s - 1) / s;
  int64_t b = n - 1 - off < 0 ? 0 : (n - 1 - off) / s + 1;
  *lo = a < n_out ? a : n_out;
  *hi = b < n_out ? b : n_out;
  if (*hi < *lo) *hi = *lo;
}

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

/* y[p, i] = act(y[p, i] + bias[p % channels]) over `planes` planes of `hw` values, in place;
   bias may be NULL. */
void channel_epilogue(float* y, const float* bias, int64_t planes, int64_t channels,
                      int64_t hw, int act) {
  #pragma omp parallel for schedule(static) if (PARALLEL(planes * hw * (act ? 8 : 1)))
  for (int64_t p = 0; p < planes; p++) {
    float* plane = y + p * hw;
    float b = bias ? bias[p % channels] : 0.0f;
    #pragma omp simd
    for (int64_t i = 0; i < hw; i++) plane[i] = epilogue(plane[i] + b, act);
  }
}

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float*, int, const float*,
                         int, float, float*, int);
typedef int (*local_threads_fn)(int);

/* A whole conv in one call: per image and group, im2col into cols (skipped when `direct`: a
   1x1 stride-1 unpadded conv reads the image as its columns), then the GEMM
   y[i, g*og:(g+1)*og] [og, ho*wo] = w[g] [og, k] @ cols [k, ho*wo] through `sgemm`
   (cblas_sgemm, row-major), then bias + activation in place. A GEMM of fewer than
   BRAZE_PAR_MIN_MACS multiply-adds (codegen.cc) runs on the calling thread alone, set through
   MKL's thread-local count (`local_threads`, may be NULL): waking a second thread for a
   0.05 ms GEMM costs more than it saves, and far more when the machine is busy. */
void conv_gemm(sgemm_fn sgemm, local_threads_fn local_threads, const float* x, const float* wt,
               const float* bias, float* y, float* cols, int64_t n, int64_t c, int64_t h,
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
  if (bias || act) channel_epilogue(y, bias, n * o, o, hw, act);
}

/* Depthwise conv: output channel oc reads input channel oc / mult through its own kh x kw
   filter w[oc]; bias (may be NULL) and activation fused. */
void depthwise(const float* x, const float* wt, const float* bias, float* y, int64_t n,
               int64_t cin, int64_t h, int64_t w, int64_t mult, int64_t kh, int64_t kw,
               int64_t sh, int64_t sw, int64_t pt, int64_t pl, int64_t dh, int64_t dw,
               int64_t ho, int64_t wo, int act) {
  int64_t cout = cin * mult;
  #pragma omp parallel for collapse(2) schedule(static) \
      if (PARALLEL(n * cout * ho * wo * (kh * kw + (act ? 8 : 0))))
  for (int64_t b = 0; b < n; b++) {
    for (int64_t oc = 0; oc < cout; oc++) {
      const float* plane = x + (b * cin + oc / mult) * h * w;
      const float* f = wt + oc * kh * kw;
      float* out = y + (b * cout + oc) * ho * wo;
      float b0 = bias ? bias[oc] : 0.0f;
      for (int64_t oy = 0; oy < ho; oy++) {
        float* dst = out + oy * wo;
        for (int64_t ox = 0; ox < wo; ox++) dst[ox] = b0;
        for (int64_t ky = 0; ky < kh; ky++) {
          int64_t iy = oy * sh + ky * dh - pt;
          if (iy < 0 || iy >= h) continue;
          const float* src_row = plane + iy * w;
          for (int64_t kx = 0; kx < kw; kx++) {
            int64_t off = kx * dw - pl, lo, hi;
            valid_range(off, sw, w, wo, &lo, &hi);
            float wv = f[ky * kw + kx];
            const float* src = src_row + off;
            if (sw == 1) {
              #pragma omp simd
              for (int64_t ox = lo; ox < hi; ox++) dst[ox] += wv * src[ox];
            } else {
              for (int64_t ox = lo; ox < hi; ox++) dst[ox] += wv * src[ox * sw];
            }
          }
        }
        if (act) {
          #pragma omp simd
          for (int64_t ox = 0; ox < wo; ox++) dst[ox] = epilogue(dst[ox], act);
        }
      }
    }
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

/* Max (is_max) or average pooling of `planes` [h, w] planes; padding never enters a max;
   an average divides by kh * kw (count_pad) or by the real elements of its window. */
void pool2d(const float* x, float* y, int64_t planes, int64_t h, int64_t w, int64_t kh,
            int64_t kw, int64_t sh, int64_t sw, int64_t pt, int64_t pl, int64_t ho,
            int64_t wo, int is_max, int count_pad) {
  #pragma omp parallel for schedule(static) if (PARALLEL(planes * ho * wo * kh * kw))
  for (int64_t p = 0; p < planes; p++) {
    const float* plane = x + p * h * w;
    float* out = y + p * ho * wo;
    for (int64_t oy = 0; oy < ho; oy++) {
      int64_t y0 = oy * sh - pt, y1 = y0 + kh;
      y0 = y0 < 0 ? 0 : y0;
      y1 = y1 > h ? h : y1;
      for (int64_t ox = 0; ox < wo; ox++) {
        int64_t x0 = ox * sw - pl, x1 = x0 + kw;
        x0 = x0 < 0 ? 0 : x0;
        x1 = x1 > w ? w : x1;
        float acc = is_max ? -INFINITY : 0.0f;
        for (int64_t iy = y0; iy < y1; iy++) {
          const float* r = plane + iy * w;
          for (int64_t ix = x0; ix < x1; ix++) {
            if (is_max) acc = r[ix] > acc ? r[ix] : acc;
            else acc += r[ix];
          }
        }
        if (!is_max) acc /= count_pad ? (float)(kh * kw) : (float)((y1 - y0) * (x1 - x0));
        out[oy * wo + ox] = acc;
      }
    }
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

/* Nearest resampling: y[p, oy, ox] = x[p, hi[oy], wi[ox]]. */
void gather2d(const float* x, float* y, int64_t planes, int64_t h, int64_t w, int64_t ho,
              int64_t wo, const int64_t* hi, const int64_t* wi) {
  #pragma omp parallel for collapse(2) schedule(static) if (PARALLEL(planes * ho * wo))
  for (int64_t p = 0; p < planes; p++) {
    for (int64_t oy = 0; oy < ho; oy++) {
      const float* r = x + (p * h + hi[oy]) * w;
      float* dst = y + (p * ho + oy) * wo;
      for (int64_t ox = 0; ox < wo; ox++) dst[ox] = r[wi[ox]];
    }
  }
}
"""

_I, _P, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
_SIGNATURES = {
    "im2col": [_P, _P] + [_I] * 13,
    "col2im": [_P, _P] + [_I] * 13,
    "channel_epilogue": [_P, _P, _I, _I, _I, _INT],
    "depthwise": [_P, _P, _P, _P] + [_I] * 15 + [_INT],
    "conv_gemm": [_P] * 7 + [_I] * 16 + [_INT, _INT],
    "pool2d": [_P, _P] + [_I] * 11 + [_INT, _INT],
    "resample": [_P, _P, _P, _I, _I, _I, _I, _I, _P, _P, _I, _P, _P, _I],
    "gather2d": [_P, _P, _I, _I, _I, _I, _I, _P, _P],
}


def _packed_wrappers() -> str:
    """For each function F, `F_packed(const int64_t* a)`: F called with its arguments read from
    one array of words (pointers and sizes). A bound step passes one pointer through ctypes
    instead of converting up to 25 Python ints on every call."""
    out = []
    for name, args in _SIGNATURES.items():
        cast = ["(void*)(intptr_t)" if t is _P else "(int)" if t is _INT else ""
                for t in args]
        call = ", ".join(f"{c}a[{i}]" for i, c in enumerate(cast))
        out.append(f"void {name}_packed(const int64_t* a) {{ {name}({call}); }}")
    return "\n".join(out) + "\n"


@cache
def lib():
    """The compiled conv-family library, or None when no C compiler is available."""
    packed = {name + "_packed": [_P] for name in _SIGNATURES}
    return cc.load_library(SOURCE + _packed_wrappers(), "braze_conv", {**_SIGNATURES, **packed})


def packed_call(fn, args: tuple):
    """A zero-argument call of C function `fn` (from `lib()`) with `args` (ints or None) fixed:
    the arguments are packed once into an int64 array that `fn`'s `_packed` twin reads."""
    words = np.array([0 if a is None else int(a) for a in args], dtype=np.int64)
    twin, address = getattr(lib(), fn.__name__ + "_packed"), words.ctypes.data

    def call():
        twin(address)

    call.words = words  # keeps the array alive as long as the call
    return call
