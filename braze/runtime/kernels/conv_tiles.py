"""braze's own convs (float32, NCHW): a "shifted GEMM" over the padded input, in tiles of output
channels x pixels, with no im2col matrix; and a pixel-row form on braze's packed GEMM.

The im2col + BLAS path writes the whole im2col matrix to memory first (a 3x3 conv of 96
channels at 80x80: 22 MB) and applies bias and activation in a second pass over the output.
Here the input is laid out once (`conv_prep`, skipped when the conv reads no padding and no
stride) as per-channel phase planes: zero padding around the image, and for a stride s each
plane split into s x s phases, so that output pixel (oy, ox) of tap (ky, kx) reads element
(oy + ky dh / sh, ox + kx dw / sw) of one phase plane of row length wq. Numbering the output
pixels P = oy * wq + ox (columns with ox >= wo are computed and dropped: 2 of 58 for a 3x3
same conv at 56), every tap is then a plain matrix over (channel, P) with unit stride along P:
its columns are a shifted window of the plane. With the weights in [o, kh, kw, cg] order
(prepared once for a static weight, `taps_major`) the conv is one GEMM with K = kh * kw * cg.

The output is cut into tiles of up to MC output channels x NB = 64 pixels (QP panels of 16
under AVX-512), handed out dynamically over the OpenMP threads. Per tile and K block of KC
rows the tile's window is copied into a [KC][NB] block in the thread's L1 (each row one
unit-stride run, no bounds tests), and the shared register tile (c_snippets.REGISTER_TILE: 6
channels x 4 vectors of pixels, weight rows broadcast) runs down the tile's channels; the
first block's sums start from the bias, later blocks' are added (blocked summation, as the
packed GEMM). Where the tile's columns are output pixels themselves (wq == wo: 1x1 convs,
strided ones too), whole vectors of them, the micro-kernel writes the output in place and
the activation runs there; otherwise the tile goes through the thread's scratch, and bias +
activation (c_snippets.ACT_SPAN) take it to the output.

The pixel-row form (`conv_rows` / `rows_conv`, one group) is for small planes with many
channels, where 64-pixel vectors go idle (a 7x7 plane fills 49 of 64): the input is copied into
a zero-padded NHWC buffer, each output pixel's row of the transposed im2col matrix is one copy
of c floats per tap, braze's packed GEMM (packed_gemm.py, the weight packed once as [kh kw c,
o]) runs with output channels across its vectors and bias + activation in its tiles, and the
product goes back to NCHW in 16 x 16 blocks (a residual, then the activation, join there).
`lib()` is None without a C compiler; conv.py measures both forms against im2col + MKL's
sgemm per geometry (gemm_choice.choose_keyed)."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache

import numpy as np

from ..address import address
from ..codegen import cc
from . import c_snippets, conv_native
from . import packed_gemm as pg
from .conv_native import VALID_RANGE

__all__ = ["lib", "MC", "Layout", "taps_major", "run_args", "RowsLayout", "rows_weight",
           "rows_conv"]

MC = 192  # output channels per tile at most

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
""" + cc.simd_math_decls() + cc.parallel_min_define() + c_snippets.ACT_SPAN + VALID_RANGE + r"""
#if defined(__AVX512F__)
#define VW 16
#else
#define VW 8
#endif
#define MR 6
#define NR 16
#define NV (NR / VW)
#define KC 128
#define MC """ + str(MC) + r"""
typedef float vf __attribute__((vector_size(VW * 4), aligned(4)));
""" + c_snippets.REGISTER_TILE + r"""
#define NB (QP * NR)      /* pixels per tile */
#define LDC_T (NB + 16)   /* tile output rows, padded off one L1 set */
#define LDA_T (KC + 16)   /* weight rows copied when k * 4 is a multiple of 4 KB */

#define MICRO(h, q) tile_hq(h, q, kc, a, lda, bp, NB, NR, c, ldc, start, NB, add)
#define MICRO_ROWS(q) switch (h) { case 1: MICRO(1, q); break; case 2: MICRO(2, q); break; \
    case 3: MICRO(3, q); break; case 4: MICRO(4, q); break; case 5: MICRO(5, q); break; \
    default: MICRO(6, q); }

/* c[h, q NR] (row stride ldc) = (add ? c : 0) + (start or 0) + a[h, kc] (row stride lda) @
   bp[kc, q NR] (row stride NB); start: rows NB floats apart. */
static void micro(int h, int q, int64_t kc, const float* restrict a, int64_t lda,
                  const float* restrict bp, float* c, int64_t ldc, const float* start,
                  int add) {
#if QP == 4
  if (q == 4) { MICRO_ROWS(4) return; }
  if (q == 3) { MICRO_ROWS(3) return; }
  if (q == 2) { MICRO_ROWS(2) return; }
#endif
  MICRO_ROWS(1)
}

/* xq = the input as the shifted GEMM reads it: per image and channel, sh x sw phase planes
   of hq x wq (plane stride ps; phase (py, px) of channel ch at ((ch * sh + py) * sw + px) *
   ps), (u, v) of phase (py, px) being x[ch, u * sh + py - pt, v * sw + px - pl], zero outside
   the image. */
void conv_prep(const float* x, float* xq, int64_t planes, int64_t h, int64_t w, int64_t sh,
               int64_t sw, int64_t pt, int64_t pl, int64_t hq, int64_t wq, int64_t ps) {
  #pragma omp parallel for schedule(static) \
      if (BRAZE_PARALLEL(planes * sh * sw * ps, BRAZE_PAR_MIN_MACS / 16))
  for (int64_t ch = 0; ch < planes; ch++) {
    const float* plane = x + ch * h * w;
    for (int64_t py = 0; py < sh; py++)
      for (int64_t px = 0; px < sw; px++) {
        float* dst = xq + ((ch * sh + py) * sw + px) * ps;
        int64_t lo, hi;  /* v with 0 <= v * sw + px - pl < w */
        valid_range(px - pl, sw, w, wq, &lo, &hi);
        for (int64_t u = 0; u < hq; u++) {
          float* restrict d = dst + u * wq;
          int64_t iy = u * sh + py - pt;
          if (iy < 0 || iy >= h) {
            for (int64_t v = 0; v < wq; v++) d[v] = 0.0f;
            continue;
          }
          const float* restrict src = plane + iy * w + px - pl;
          for (int64_t v = 0; v < lo; v++) d[v] = 0.0f;
          if (sw == 1) {
            for (int64_t v = lo; v < hi; v++) d[v] = src[v];
          } else {
            for (int64_t v = lo; v < hi; v++) d[v] = src[v * sw];
          }
          for (int64_t v = hi; v < wq; v++) d[v] = 0.0f;
        }
      }
  }
}

/* y = act(conv(x, w) + bias (+ res)) for y [n, o, ho, wo] from xq (conv_prep's layout: phase planes
   of hq x wq, plane stride ps, or x itself when the conv reads no padding and no stride) and
   wt = w [o, cg, kh, kw] as [o, kh, kw, cg] (taps_major: K = kh * kw * cg runs over the taps'
   channels, so a K block may span taps); bias [o] or NULL; res (a residual of y's shape) or
   NULL, added to each finished tile before the activation; act a c_snippets.ACT_CODES value.
   Output pixel (oy, ox) is column P = oy * wq + ox of the GEMM (columns with ox >= wo are
   computed and dropped); tap (ky, kx) reads its phase plane's column P + (ky dh / sh) wq +
   kx dw / sw: a unit-stride run. */
void conv_shifted(const float* xq, const float* wt, const float* bias, const float* res,
                  float* y, int64_t n,
                  int64_t c, int64_t o, int64_t groups, int64_t kh, int64_t kw, int64_t sh,
                  int64_t sw, int64_t dh, int64_t dw, int64_t hq, int64_t wq, int64_t ps,
                  int64_t ho, int64_t wo, int act) {
  int64_t cg = c / groups, og = o / groups, taps = kh * kw, cs = sh * sw * ps;
  int64_t cols = (ho - 1) * wq + wo, pblocks = (cols + NB - 1) / NB, images = n * groups;
  int64_t nt = omp_get_max_threads();
  /* channel blocks of at most MC, more while there are under 2 tiles per thread */
  int64_t rblocks = (og + MC - 1) / MC;
  while (images * pblocks * rblocks < 2 * nt && (og + rblocks) / (rblocks + 1) >= 4 * MR)
    rblocks++;
  int64_t rb = ((og + rblocks - 1) / rblocks + MR - 1) / MR * MR;
  rblocks = (og + rb - 1) / rb;
  int64_t tiles = images * pblocks * rblocks;
  int64_t k = cg * taps;
  int alias = (k * 4) % 4096 == 0;  /* weight rows on one L1 set: copied, padded */
  /* where tap (ky, kx) reads in an image's first channel: its phase plane, shifted */
  int64_t* off = malloc(taps * sizeof(int64_t));
  for (int64_t tap = 0; tap < taps; tap++) {
    int64_t ky = tap / kw * dh, kx = tap % kw * dw;
    off[tap] = (ky % sh * sw + kx % sw) * ps + ky / sh * wq + kx / sw;
  }
  #pragma omp parallel if (tiles > 1 && \
      BRAZE_PARALLEL(images * og * pblocks * NB * cg * taps, BRAZE_PAR_MIN_MACS))
  {
    size_t floats = KC * NB + MR * NB + rb * LDC_T + (alias ? rb * LDA_T : 0);
    float* bp = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
    float* bstart = bp + KC * NB;
    float* ct = bstart + MR * NB;
    float* at = ct + rb * LDC_T;
    #pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tiles; t++) {
      int64_t rbi = t % rblocks, pb = t / rblocks % pblocks, ig = t / rblocks / pblocks;
      int64_t i = ig / groups, g = ig % groups;
      int64_t r0 = rbi * rb, rows = og - r0 < rb ? og - r0 : rb;
      int64_t p0 = pb * NB, np = cols - p0 < NB ? cols - p0 : NB;
      int q = (int)((np + NR - 1) / NR);
      const float* image = xq + (i * c + g * cg) * cs;
      const float* a0 = wt + (g * og + r0) * k;
      /* columns that are the output's own pixels (wq == wo), whole vectors of them: the
         micro-kernel writes them in place */
      int in_place = wq == wo && np == q * NR;
      float* cp = in_place ? y + (i * o + g * og + r0) * ho * wo + p0 : ct;
      int64_t ldc = in_place ? ho * wo : LDC_T;
      for (int64_t k0 = 0; k0 < k; k0 += KC) {
        int64_t kc = k - k0 < KC ? k - k0 : KC, tap = k0 / cg, ci = k0 % cg;
        for (int64_t kk = 0; kk < kc; kk++) {
          const float* restrict src = image + off[tap] + ci * cs + p0;
          float* restrict d = bp + kk * NB;
          for (int64_t j = 0; j < np; j++) d[j] = src[j];
          for (int64_t j = np; j < q * NR; j++) d[j] = 0.0f;
          if (++ci == cg) { ci = 0; tap++; }
        }
        const float* a = a0 + k0;
        int64_t lda = k;
        if (alias) {
          for (int64_t r = 0; r < rows; r++) memcpy(at + r * LDA_T, a + r * k, kc * sizeof(float));
          a = at;
          lda = LDA_T;
        }
        for (int64_t i0 = 0; i0 < rows; i0 += MR) {
          int h6 = rows - i0 < MR ? (int)(rows - i0) : MR;
          const float* start = 0;
          if (bias && k0 == 0) {  /* the first K block's sums start from the bias */
            for (int r = 0; r < h6; r++) {
              float b = bias[g * og + r0 + i0 + r];
              for (int64_t j = 0; j < NB; j++) bstart[r * NB + j] = b;
            }
            start = bstart;
          }
          micro(h6, q, kc, a + i0 * lda, lda, bp, cp + i0 * ldc, ldc, start, k0 > 0);
        }
      }
      /* the activation, and the tile's columns back to output pixels where it ran in the
         scratch */
      for (int64_t r = 0; r < rows; r++) {
        float* src = cp + r * ldc;
        int64_t at = (i * o + g * og + r0 + r) * ho * wo;  /* the output plane */
        if (in_place) {
          if (act || res) act_span(src, res ? res + at + p0 : 0, src, np, act);
          continue;
        }
        float* plane = y + at;
        const float* rplane = res ? res + at : 0;
        int64_t j = 0, oy = p0 / wq, ox = p0 % wq;
        while (j < np) {
          int64_t run = wq - ox < np - j ? wq - ox : np - j;
          if (ox < wo)
            act_span(src + j, rplane ? rplane + oy * wo + ox : 0, plane + oy * wo + ox,
                     (wo - ox < run ? wo - ox : run), act);
          j += run;
          oy++;
          ox = 0;
        }
      }
    }
    free(bp);
  }
  free(off);
}

/* The pixel-row form of a conv (groups 1): rows [n * ho * wo, kh * kw * c] = each image's
   im2col matrix transposed (row p = oy * wo + ox, column t * c + ci for tap t = ky * kw + kx:
   x[ci, oy*sh + ky*dh - pt, ox*sw + kx*dw - pl], 0 outside the image), built through xt, a
   zero-padded NHWC copy [n, hp, wp, c] of the input, so that each (pixel, tap) is one copy of
   c floats. With one tap read in place (a 1x1 stride-1 conv) xt is rows itself. */
void conv_rows(const float* x, float* xt, float* rows, int64_t n, int64_t c, int64_t h,
               int64_t w, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t pt,
               int64_t pl, int64_t dh, int64_t dw, int64_t hp, int64_t wp, int64_t ho,
               int64_t wo) {
  int64_t taps = kh * kw, k = taps * c, px = ho * wo;
  #pragma omp parallel for schedule(static) \
      if (BRAZE_PARALLEL(n * hp * wp * c, BRAZE_PAR_MIN_MACS / 16))
  for (int64_t iu = 0; iu < n * hp; iu++) {
    int64_t i = iu / hp, iy = iu % hp - pt;
    float* dst = xt + iu * wp * c;
    if (iy < 0 || iy >= h) {
      memset(dst, 0, wp * c * sizeof(float));
      continue;
    }
    for (int64_t v = 0; v < wp; v++) {
      int64_t ix = v - pl;
      if (ix < 0 || ix >= w) memset(dst + v * c, 0, c * sizeof(float));
    }
    int64_t lo = pl, hi = pl + w < wp ? pl + w : wp;
    for (int64_t ci = 0; ci < c; ci++) {
      const float* restrict src = x + ((i * c + ci) * h + iy) * w - pl;
      for (int64_t v = lo; v < hi; v++) dst[v * c + ci] = src[v];
    }
  }
  if (rows == xt) return;
  #pragma omp parallel for schedule(static) \
      if (BRAZE_PARALLEL(n * px * k, BRAZE_PAR_MIN_MACS / 16))
  for (int64_t ip = 0; ip < n * px; ip++) {
    int64_t i = ip / px, oy = ip % px / wo, ox = ip % wo;
    float* dst = rows + ip * k;
    for (int64_t t = 0; t < taps; t++) {
      int64_t u = oy * sh + t / kw * dh, v = ox * sw + t % kw * dw;
      memcpy(dst + t * c, xt + ((i * hp + u) * wp + v) * c, c * sizeof(float));
    }
  }
}

/* y [n, o, px] = out [n * px, o] transposed per image, in 16 x 16 blocks; with a residual
   res (y's shape) or an activation (c_snippets.ACT_CODES), y = act(y + res) on each block's
   rows as they land (res may be NULL). */
void rows_to_nchw(const float* out, float* y, const float* res, int64_t n, int64_t px,
                  int64_t o, int act) {
  int64_t pb = (px + 15) / 16, ob = (o + 15) / 16;
  #pragma omp parallel for schedule(static) if (BRAZE_PARALLEL(n * px * o, BRAZE_PAR_MIN_MACS / 16))
  for (int64_t b = 0; b < n * pb * ob; b++) {
    int64_t i = b / (pb * ob), p0 = b / ob % pb * 16, o0 = b % ob * 16;
    int64_t p1 = p0 + 16 < px ? p0 + 16 : px, o1 = o0 + 16 < o ? o0 + 16 : o;
    for (int64_t co = o0; co < o1; co++) {
      float* dst = y + (i * o + co) * px;
      for (int64_t p = p0; p < p1; p++) dst[p] = out[(i * px + p) * o + co];
      if (res || act) act_span(dst + p0, res ? res + (i * o + co) * px + p0 : 0, dst + p0,
                               p1 - p0, act);
    }
  }
}

/* wt_t [o, taps, cg] = wt [o, cg, taps]. */
static void taps_major(const float* wt, float* wt_t, int64_t o, int64_t cg, int64_t taps) {
  for (int64_t oc = 0; oc < o; oc++)
    for (int64_t t = 0; t < taps; t++)
      for (int64_t ci = 0; ci < cg; ci++)
        wt_t[(oc * taps + t) * cg + ci] = wt[(oc * cg + ci) * taps + t];
}

/* The whole conv: the weights to taps-major order (unless wt_t is wt: prepared once), the
   input to conv_prep's layout (unless xq is x: read in place), then conv_shifted. */
void conv_tiles_run(const float* x, float* xq, const float* wt, float* wt_t, const float* bias,
                    const float* res, float* y, int64_t n, int64_t c, int64_t h, int64_t w,
                    int64_t o, int64_t groups, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                    int64_t pt, int64_t pl, int64_t dh, int64_t dw, int64_t hq, int64_t wq,
                    int64_t ps, int64_t ho, int64_t wo, int act) {
  if (wt_t != wt) taps_major(wt, wt_t, o, c / groups, kh * kw);
  if (xq != x) conv_prep(x, xq, n * c, h, w, sh, sw, pt, pl, hq, wq, ps);
  conv_shifted(xq, wt_t, bias, res, y, n, c, o, groups, kh, kw, sh, sw, dh, dw, hq, wq, ps, ho,
               wo, act);
}
"""

_I, _P, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
_SIGNATURES = {"conv_tiles_run": [_P] * 7 + [_I] * 19 + [_INT],
               "conv_rows": [_P] * 3 + [_I] * 16,
               "rows_to_nchw": [_P] * 3 + [_I] * 3 + [_INT]}


@cache
def lib():
    """The compiled conv-tiles library, or None without a C compiler."""
    return cc.load_library(SOURCE + conv_native.packed_wrappers(_SIGNATURES), "braze_conv_tiles",
                           conv_native.with_packed(_SIGNATURES))


def padded_extent(geo) -> tuple[int, int]:
    """The rows and columns of the zero-padded input a conv reads (from the top-left padding
    on; the bottom / right padding read, if any, is inside)."""
    (sh, sw), (dh, dw) = geo.stride, geo.dilation
    return (geo.ho - 1) * sh + (geo.kh - 1) * dh + 1, (geo.wo - 1) * sw + (geo.kw - 1) * dw + 1


@dataclass(frozen=True)
class Layout:
    """How conv_tiles_run reads one conv's input: in place (`direct`: stride 1, no padding
    read) or through conv_prep's phase planes of hq x wq floats, ps apart."""

    direct: bool
    hq: int
    wq: int
    ps: int

    @classmethod
    def of(cls, geo) -> Layout:
        """geo: a conv.ConvGeometry."""
        (sh, sw), (hp, wp) = geo.stride, padded_extent(geo)
        if (sh, sw) == (1, 1) and geo.padding[:2] == (0, 0) and hp <= geo.h and wp <= geo.w:
            return cls(True, geo.h, geo.w, geo.h * geo.w)
        hq, wq = -(-hp // sh), -(-wp // sw)
        return cls(False, hq, wq, hq * wq)

    def input_floats(self, geo) -> int:
        """The scratch conv_prep fills (0 when direct)."""
        return 0 if self.direct else geo.n * geo.c * geo.stride[0] * geo.stride[1] * self.ps


def taps_major(w: np.ndarray) -> np.ndarray:
    """Conv weights [o, cg, kh, kw] as conv_shifted reads them: [o, kh, kw, cg]."""
    return np.ascontiguousarray(w.transpose(0, 2, 3, 1), dtype=np.float32)


def run_args(geo, layout: Layout, x, xq, w, w_t, bias, y, act: int, res=None) -> tuple:
    """conv_tiles_run's arguments (addresses of C-contiguous float32 arrays, or None; xq is x
    when direct, w_t is w when w is already taps-major; res: a residual of y's shape)."""
    (sh, sw), (dh, dw) = geo.stride, geo.dilation
    return (address(x), address(xq), address(w), address(w_t),
            None if bias is None else address(bias), None if res is None else address(res),
            address(y), geo.n, geo.c, geo.h, geo.w,
            geo.o, geo.groups, geo.kh, geo.kw, sh, sw, geo.padding[0], geo.padding[1], dh, dw,
            layout.hq, layout.wq, layout.ps, geo.ho, geo.wo, act)


@dataclass(frozen=True)
class RowsLayout:
    """The pixel-row form of a conv (groups 1, conv_rows): the padded NHWC copy's rows / columns
    read (hp, wp), and whether it is the row matrix itself (`in_place`: 1x1, stride 1, no
    padding read)."""

    hp: int
    wp: int
    in_place: bool

    @classmethod
    def of(cls, geo) -> RowsLayout:
        (sh, sw), (hp, wp) = geo.stride, padded_extent(geo)
        one = (geo.kh, geo.kw, sh, sw) == (1, 1, 1, 1) and (hp, wp) == (geo.ho, geo.wo) \
            and geo.padding[:2] == (0, 0)
        return cls(hp, wp, one)

    def scratch(self, geo) -> tuple:
        """(shape, dtype) of the NHWC copy, the row matrix (unless in place) and the product."""
        px, k = geo.n * geo.ho * geo.wo, geo.kh * geo.kw * geo.c
        out = [((geo.n * self.hp * self.wp * geo.c,), np.float32)]
        if not self.in_place:
            out.append(((px, k), np.float32))
        return (*out, ((px, geo.o), np.float32))


def rows_weight(w_t: np.ndarray):
    """A taps-major weight [o, kh, kw, c] packed for the pixel-row GEMM (rows @ w: [k, o]), or
    None without the packed GEMM."""
    o = w_t.shape[0]
    return pg.pack(w_t.reshape(o, -1).T)


def rows_conv(geo, layout: RowsLayout, packed, act: int, residual: bool = False):
    """`call(x, bias, y, *scratch, res=None)`: the conv as conv_rows, braze's packed GEMM on
    the pixel rows (bias and activation in its tiles), then the product back to NCHW; all
    arrays C-contiguous float32 (scratch as RowsLayout.scratch). With `residual`, `res` (y's
    shape) is added as the product goes back to NCHW, and the activation runs there after
    it (act(conv + bias + res)), the GEMM's tiles adding the bias alone."""
    so = lib()
    (sh, sw), (dh, dw) = geo.stride, geo.dilation
    px = geo.ho * geo.wo

    def call(x, bias, y, xt, *rest, res=None):
        rows = xt.reshape(geo.n * px, geo.c) if layout.in_place else rest[0]
        out = rest[-1]
        so.conv_rows(address(x), address(xt), address(rows), geo.n, geo.c, geo.h, geo.w,
                     geo.kh, geo.kw, sh, sw, geo.padding[0], geo.padding[1], dh, dw, layout.hp,
                     layout.wp, geo.ho, geo.wo)
        if not pg.gemm(rows, packed, out, bias, 0 if residual else act):
            raise ValueError(f"pixel-row conv: rows {rows.shape} / product {out.shape} do not "
                             f"fit the packed weight [{packed.k}, {packed.n}]")
        so.rows_to_nchw(address(out), address(y), None if res is None else address(res),
                        geo.n, px, geo.o, act if residual else 0)

    return call
