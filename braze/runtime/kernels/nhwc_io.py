"""The NHWC convs' input copy and output store (the AMX and AVX512-BF16 bf16 convs, the f32 one
of conv_nhwc.py), and the layout bits their entry points take.

A conv's activation input, output and residual are each stored NCHW or NHWC (channels last:
the executor keeps a value NHWC when every step that reads it takes that layout,
runtime/layout.py). The input is copied once per call into a zero-padded NHWC buffer (bf16
rounded to nearest even, or f32 as it is): from NCHW through 8 x 8 register transposes, from
NHWC one contiguous run of channels per pixel. A finished tile (pixels x output channels, f32)
gets bias, residual and activation and is stored: into NCHW through 8 x 8 transposes, into
NHWC as one contiguous run of channels per pixel. A residual stored in the output's layout
(NCHW) joins after the store; in any other case it joins in the tile first. Under the bf16
policy's hand-off between convs (program.py) an NHWC output is stored rounded to bf16
(OUT_BF16) and an NHWC input read as the bf16 values it holds (IN_BF16)."""
from __future__ import annotations

from . import c_snippets

__all__ = ["NHWC_IO", "LAYOUT_BITS", "IN_NHWC", "OUT_NHWC", "RES_NHWC", "IN_BF16", "OUT_BF16",
           "extent", "layout_bits", "rounds_in_store", "describe"]

IN_NHWC, OUT_NHWC, RES_NHWC = 1, 2, 4  # the `lay` bits: which of the conv's arrays are NHWC
IN_BF16, OUT_BF16 = 8, 16  # and which hold bf16 values handed over between convs (NHWC)
LAYOUT_BITS = f"""
#ifndef IN_NHWC
#define IN_NHWC {IN_NHWC}
#define OUT_NHWC {OUT_NHWC}
#define RES_NHWC {RES_NHWC}
#define IN_BF16 {IN_BF16}
#define OUT_BF16 {OUT_BF16}
#endif
"""
"""The `lay` bits as C macros."""

NHWC_IO = LAYOUT_BITS + r"""
#ifndef BRAZE_NHWC_IO
#define BRAZE_NHWC_IO
""" + c_snippets.TO_BF16 + c_snippets.TRANSPOSE8 + c_snippets.BF16_ROW + r"""
/* xt [n, hp, wp, cp] = x (NCHW [n, c, h, w], or NHWC [n, h, w, c] with `nhwc` & IN_NHWC) as T
   (CONVERT: uint16_t rounded to bf16 nearest even, or float as it is), padded row r reading
   image row r - pt and column v image column v - pl, zeros outside the image and past channel
   c. With `nhwc` & IN_BF16 (T uint16_t only) x holds NHWC bf16 values, copied as they are. */
#define CONV_PREP(NAME, T, CONVERT) \
static void NAME(const float* x, T* xt, int64_t n, int64_t c, int64_t h, int64_t w, \
                 int64_t cp, int64_t hp, int64_t wp, int64_t pt, int64_t pl, int nhwc) { \
  int par = BRAZE_PARALLEL(n * hp * wp * cp, BRAZE_PAR_MIN_MACS / 16); \
  _Pragma("omp parallel for schedule(static) if (par)") \
  for (int64_t ir = 0; ir < n * hp; ir++) { \
    int64_t img = ir / hp, iy = ir % hp - pt; \
    T* d = xt + ir * wp * cp; \
    if (iy < 0 || iy >= h) { \
      memset(d, 0, (size_t)(wp * cp) * sizeof(T)); \
      continue; \
    } \
    int64_t lo = pl < 0 ? 0 : pl, hi = pl + w < wp ? pl + w : wp; \
    if (lo > hi) lo = hi; \
    memset(d, 0, (size_t)(lo * cp) * sizeof(T)); \
    memset(d + hi * cp, 0, (size_t)((wp - hi) * cp) * sizeof(T)); \
    if (c < cp) \
      for (int64_t v = lo; v < hi; v++) memset(d + v * cp + c, 0, (size_t)(cp - c) * sizeof(T)); \
    if ((nhwc & IN_BF16) && sizeof(T) == 2) {  /* bf16 handed over: rows of c as they are */ \
      const uint16_t* src = (const uint16_t*)x + ((img * h + iy) * w - pl) * c; \
      if (c == cp) { \
        memcpy(d + lo * cp, src + lo * c, (size_t)((hi - lo) * c) * 2); \
        continue; \
      } \
      for (int64_t v = lo; v < hi; v++) memcpy(d + v * cp, src + v * c, (size_t)c * 2); \
      continue; \
    } \
    if (nhwc) {  /* pixel v's channels at src + v c */ \
      const float* src = x + ((img * h + iy) * w - pl) * c; \
      for (int64_t v = lo; v < hi; v++) { \
        const float* s = src + v * c; \
        T* dp = d + v * cp; \
        _Pragma("omp simd") \
        for (int64_t k = 0; k < c; k++) dp[k] = CONVERT(s[k]); \
      } \
      continue; \
    } \
    const float* src = x + (img * c * h + iy) * w - pl;  /* channel ci at src + ci h w */ \
    int64_t c8 = c / 8 * 8, v8 = lo + (hi - lo) / 8 * 8; \
    for (int64_t ci = 0; ci < c8; ci += 8)  /* 8 channels x 8 columns through a transpose */ \
      for (int64_t v = lo; v < v8; v += 8) { \
        float blk[64]; \
        transpose8x8(src + ci * h * w + v, h * w, blk, 8); \
        for (int64_t p = 0; p < 8; p++) { \
          T* dp = d + (v + p) * cp + ci; \
          _Pragma("omp simd") \
          for (int64_t k = 0; k < 8; k++) dp[k] = CONVERT(blk[p * 8 + k]); \
        } \
      } \
    for (int64_t ci = 0; ci < c; ci++)  /* the edges one by one */ \
      for (int64_t v = ci < c8 ? v8 : lo; v < hi; v++) \
        d[v * cp + ci] = CONVERT(src[ci * h * w + v]); \
  } \
}
#define AS_IS(v) (v)
CONV_PREP(conv_prep_bf16, uint16_t, f32_to_bf16)
CONV_PREP(conv_prep_f32, float, AS_IS)

/* Pixels [0, len) of a finished tile (rows of ldt f32 channels) into the NCHW output rows
   y[j * plane + p] of its first `chans` channels (8 x 8 register transposes, the edges one by
   one), then per output row res (NCHW, may be NULL) added and the activation (0: none). */
static void store_run(const float* t, int64_t ldt, int64_t len, int64_t chans, float* yb,
                      const float* rb, int64_t plane, int act) {
  int64_t p8 = len / 8 * 8, j8 = chans / 8 * 8;
  for (int64_t p = 0; p < p8; p += 8)
    for (int64_t j = 0; j < j8; j += 8) transpose8x8(t + p * ldt + j, ldt, yb + j * plane + p,
                                                     plane);
  for (int64_t j = 0; j < chans; j++)
    for (int64_t p = j < j8 ? p8 : 0; p < len; p++) yb[j * plane + p] = t[p * ldt + j];
  if (rb || act)
    for (int64_t j = 0; j < chans; j++) {
      float* yr = yb + j * plane;
      if (rb) {
        const float* rr = rb + j * plane;
        for (int64_t p = 0; p < len; p++) yr[p] += rr[p];
      }
      if (act) act_span(yr, NULL, yr, len, act);
    }
}

/* Pixels [0, len) of a tile, image pixels at .. at + len of image img, into y [.., o] with
   the layout bits `lay`, then the activation `act` (0: none, or done in the tile already). A
   residual not stored like an NCHW output joins in the tile first; NHWC output rows are one
   copy of `chans` floats each. The activation runs over runs of contiguous values: the tile's
   rows when they are whole, else the output's. */
static void store_span(float* t, int64_t ldt, int64_t len, int64_t chans, int64_t oc0,
                       const float* res, float* y, int64_t img, int64_t o, int64_t plane,
                       int64_t at, int act, int lay) {
  int res_in_tile = res && (lay & (OUT_NHWC | RES_NHWC));
  if (res_in_tile)
    for (int64_t p = 0; p < len; p++) {
      float* tp = t + p * ldt;
      if (lay & RES_NHWC) {
        const float* rp = res + (img * plane + at + p) * o + oc0;
        #pragma omp simd
        for (int64_t j = 0; j < chans; j++) tp[j] += rp[j];
      } else {
        const float* rp = res + (img * o + oc0) * plane + at + p;
        for (int64_t j = 0; j < chans; j++) tp[j] += rp[j * plane];
      }
    }
  if (lay & OUT_NHWC) {
    if (act && chans == ldt) {
      act_span(t, NULL, t, len * ldt, act);
      act = 0;
    }
    float* yp = y + (img * plane + at) * o + oc0;
    for (int64_t p = 0; p < len; p++) memcpy(yp + p * o, t + p * ldt, (size_t)chans * 4);
    if (act && chans == o) act_span(yp, NULL, yp, len * o, act);
    else if (act)
      for (int64_t p = 0; p < len; p++) act_span(yp + p * o, NULL, yp + p * o, chans, act);
    return;
  }
  int64_t out0 = (img * o + oc0) * plane + at;
  if (res_in_tile && act && chans == ldt) {
    act_span(t, NULL, t, len * ldt, act);
    act = 0;
  }
  store_run(t, ldt, len, chans, y + out0, res && !res_in_tile ? res + out0 : NULL, plane, act);
}

/* store_span for an NHWC output (a residual, if any, NHWC too) whose activation act16 has, in
   one pass: per pixel and 16 channels, tile + bias (+ residual), the activation, the store
   (with out16: rounded to bf16 into y's uint16_t values, the next conv's operand).
   (The passes of store_span, a memcpy and an activation call per pixel, took 40% of a 16 ->
   96 1x1 conv at 112 x 112.) */
static void store_nhwc(const float* t, int64_t ldt, int64_t len, int64_t chans, int64_t oc0,
                       const float* bias, const float* res, float* y, int64_t img, int64_t o,
                       int64_t plane, int64_t at, int act, int out16) {
#if defined(__AVX512F__)
  int64_t y0 = (img * plane + at) * o + oc0;
  const float* rp = res ? res + y0 : NULL;
  const float* bp = bias ? bias + oc0 : NULL;
  for (int64_t p = 0; p < len; p++)
    for (int64_t j = 0; j < chans; j += 16) {
      __mmask16 m = chans - j >= 16 ? 0xffff : (__mmask16)((1u << (chans - j)) - 1);
      __m512 v = _mm512_maskz_loadu_ps(m, t + p * ldt + j);
      if (bp) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bp + j));
      if (rp) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, rp + p * o + j));
      v = act16(v, act);
      if (out16)
        _mm256_mask_storeu_epi16((uint16_t*)y + y0 + p * o + j, m, bf16_round16(v));
      else
        _mm512_mask_storeu_ps(y + y0 + p * o + j, m, v);
    }
#endif
}

/* A finished tile (npx pixels, rows of ldt f32 channels, `chans` of them valid, output
   channels from oc0) into y (image img, o channels, plane pixels; NCHW or NHWC by `lay`;
   bf16 values with OUT_BF16, which takes an NHWC output, residual NHWC, and act16's acts):
   bias added, the activation (after the residual where there is one), stored from its first
   position q0 (with `pitch`, positions along the padded plane's pitch: the runs inside each
   output row of wo, the rest dropped). */
static void store_tile(float* tmp, int64_t ldt, int64_t npx, int64_t chans, int64_t oc0,
                       const float* bias, const float* res, float* y, int64_t img, int64_t o,
                       int64_t plane, int64_t q0, int pitch, int64_t wp, int64_t wo, int act,
                       int lay) {
#if defined(__AVX512F__)
  int fused = (lay & OUT_NHWC) && (!res || (lay & RES_NHWC)) && ACT16_OK(act);
#else
  int fused = 0;
#endif
  int out16 = fused && (lay & OUT_BF16);
  if (fused && !pitch) {
    store_nhwc(tmp, ldt, npx, chans, oc0, bias, res, y, img, o, plane, q0, act, out16);
    return;
  }
  if (bias && !fused) {
    const float* bt = bias + oc0;
    for (int64_t p = 0; p < npx; p++) {
      float* tp = tmp + p * ldt;
      #pragma omp simd
      for (int64_t j = 0; j < chans; j++) tp[j] += bt[j];
    }
  }
  if (!res && act && chans == ldt && !fused) {  /* whole rows: one pass over the tile */
    act_span(tmp, NULL, tmp, npx * ldt, act);
    act = 0;
  }
  if (!pitch) {
    store_span(tmp, ldt, npx, chans, oc0, res, y, img, o, plane, q0, act, lay);
    return;
  }
  for (int64_t p = 0; p < npx;) {  /* runs of positions inside one output row */
    int64_t oy = (q0 + p) / wp, ox = (q0 + p) % wp;
    int64_t len = wo - ox < npx - p ? wo - ox : npx - p;
    if (len > 0 && fused) {
      store_nhwc(tmp + p * ldt, ldt, len, chans, oc0, bias, res, y, img, o, plane, oy * wo + ox,
                 act, out16);
      p += len;
    } else if (len > 0) {
      store_span(tmp + p * ldt, ldt, len, chans, oc0, res, y, img, o, plane, oy * wo + ox,
                 act, lay);
      p += len;
    }
    p += wp - ox - (len > 0 ? len : 0) < npx - p ? wp - ox - (len > 0 ? len : 0) : npx - p;
  }
}

/* Tile blk of up to tp output pixels: its first position *q0, pixels *npx and first input
   pixel *base in the padded image. With `pitch` (stride 1): positions q = oy wp + ox along
   the padded plane's pitch (ho wp of them); otherwise pixels of one output row (wo / tp
   rounded up tiles a row), their input sw pixels apart. */
static inline void tile_at(int64_t blk, int64_t tp, int pitch, int64_t ho, int64_t wp,
                           int64_t wo, int64_t sh, int64_t sw, int64_t* q0, int64_t* npx,
                           int64_t* base) {
  if (pitch) {
    *q0 = blk * tp;
    *npx = ho * wp - *q0 < tp ? ho * wp - *q0 : tp;
    *base = *q0;
    return;
  }
  int64_t xb_n = (wo + tp - 1) / tp, oy = blk / xb_n, x0 = blk % xb_n * tp;
  *q0 = oy * wo + x0;
  *npx = wo - x0 < tp ? wo - x0 : tp;
  *base = oy * sh * wp + x0 * sw;
}

/* NAME(xt, bp, bias, res, y, ...): y = act(conv + bias (+ res)) from a padded NHWC input xt
   [n, hp, wp, cp] of element type T and a weight bp packed per group and tap into panels of
   16 output channels ([cg / KU][16][KU]: KU input channels per k step, 2 for bf16 pairs),
   each of bias [o] and res (y's shape) may be NULL; the layout bits `lay` say how y and res
   are stored. Tiles of up to TP consecutive output pixels (q = oy wo + ox, across rows;
   balanced: a 7 x 7 plane is one tile of 49, not 48 and 1) x 64 output channels, handed out
   over the threads; each pixel reads its window at its own offset (ro) in xt, so no padding
   positions are computed (tiles along the padded plane's pitch computed 29% more on a padded
   7 x 7 plane) and a stride-2 tile is not cut at a row's end (7-pixel tiles on a 7 x 7
   plane, each weight read for 7 pixels). Per block of input channels (weights of all taps
   ~256 KB: they stay in L2 across the tile), micro blocks of up to MR pixels (balanced
   heights) run MICRO(h, q panels, k steps, a, 0, ro, b, panel stride, c, ldc, load c first,
   taps, a_off, tap stride) into an f32 scratch tile, which store_tile takes to y. */
#define NHWC_CONV(NAME, T, KU, MR, MICRO) \
static void NAME(const T* xt, const T* bp, const float* bias, const float* res, float* y, \
                 int64_t n, int64_t o, int64_t cp, int64_t groups, int64_t cg, int64_t kh, \
                 int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t hp, \
                 int64_t wp, int64_t ho, int64_t wo, int act, int lay) { \
  int64_t og = o / groups, panels = (og + 15) / 16, units = (panels + 3) / 4, taps = kh * kw; \
  int64_t plane = ho * wo, per = (plane + TP - 1) / TP, tp = (plane + per - 1) / per; \
  int64_t ks = cg / KU, kb = 1024 / taps < 8 ? 8 : 1024 / taps;  /* k steps, per block */ \
  int64_t tap_w = panels * cg * 16, items = n * per * groups * units; \
  /* units outer (a unit's weight panels stay in cache across its tiles, and each thread \
     streams its own units' weights) when the weight outweighs an image's input: the 7 x 7 \
     and 14 x 14 stages' convs; tiles outer otherwise (a tile's input across its units) */ \
  int uo = groups * taps * tap_w > hp * wp * cp; \
  int64_t a_off[taps];   /* each tap's input offset from its pixel's window, in elements */ \
  for (int64_t ky = 0; ky < kh; ky++) \
    for (int64_t kx = 0; kx < kw; kx++) a_off[ky * kw + kx] = (ky * dh * wp + kx * dw) * cp; \
  int par = BRAZE_PARALLEL(n * o * plane * taps * cg, BRAZE_PAR_MIN_MACS); \
  _Pragma("omp parallel if (par)") \
  { \
    float tmp[TP * 64] __attribute__((aligned(64))); \
    int64_t ro[TP];   /* the tile's pixels' windows in the image, in elements */ \
    _Pragma("omp for schedule(static)") \
    for (int64_t it = 0; it < items; it++) { \
      int64_t gu = uo ? it / (n * per) : it % (groups * units); \
      int64_t t = uo ? it % (n * per) : it / (groups * units), g = gu / units; \
      int64_t u = gu % units, q0 = t % per * tp, img = t / per; \
      int64_t npx = plane - q0 < tp ? plane - q0 : tp; \
      for (int64_t p = 0; p < npx; p++) \
        ro[p] = ((q0 + p) / wo * sh * wp + (q0 + p) % wo * sw) * cp; \
      int64_t qn = panels - 4 * u < 4 ? panels - 4 * u : 4; \
      const T* a = xt + img * hp * wp * cp + g * cg; \
      const T* b = bp + g * taps * tap_w + 4 * u * cg * 16; \
      int64_t mbs = (npx + MR - 1) / MR; \
      for (int64_t k0 = 0; k0 < ks; k0 += kb) \
        for (int64_t mb = 0; mb < mbs; mb++) { \
          int64_t i0 = mb * npx / mbs, h = (mb + 1) * npx / mbs - i0; \
          MICRO((int)h, (int)qn, ks - k0 < kb ? ks - k0 : kb, a + KU * k0, 0, ro + i0, \
                b + 16 * KU * k0, cg * 16, tmp + i0 * 64, 64, k0 > 0, taps, a_off, tap_w); \
        } \
      int64_t chans = og - 64 * u < 64 ? og - 64 * u : 64, oc0 = g * og + 64 * u; \
      store_tile(tmp, 64, npx, chans, oc0, bias, res, y, img, o, plane, q0, 0, wp, wo, act, \
                 lay); \
    } \
  } \
}
#endif
"""
"""C source the NHWC convs include (after c_snippets.ACT_SPAN and cc.parallel_min_define()):
conv_prep_bf16 / conv_prep_f32 (the input copy), store_tile (the output store), tile_at, and
NHWC_CONV, which makes a conv's tile loop from a micro-kernel (define TP first)."""


def extent(geo, tile: int) -> tuple[int, int, bool]:
    """The padded rows and columns an NHWC conv reads and whether its tiles run along the
    padded plane's pitch (stride 1); otherwise the columns have room for a `tile`-pixel
    tile's over-read past an output row's end (the tile's pixels beyond the row are
    dropped)."""
    (sh, sw), (dh, dw) = geo.stride, geo.dilation
    hp = (geo.ho - 1) * sh + (geo.kh - 1) * dh + 1
    pitch = (sh, sw) == (1, 1)
    span = -(-geo.wo // tile) * tile if tile else geo.wo
    first = geo.wo if pitch else (span - 1) * sw + 1  # columns tap 0 reads
    wp = first + (geo.kw - 1) * dw
    return hp, wp, pitch


def layout_bits(node, ctx, source=None, residual: bool = False) -> int:
    """The `lay` bits of a step: which of its input (`source`, else the node's input 0),
    output and, for a conv with one, residual (input 3) the executor keeps NHWC
    (KernelContext.channels_last)."""
    nhwc = ctx.channels_last if ctx is not None else ()
    if not nhwc:
        return 0
    src = node.inputs[0] if source is None else source
    return ((IN_NHWC if src in nhwc else 0) | (OUT_NHWC if node.value in nhwc else 0) |
            (RES_NHWC if residual and node.inputs[3] in nhwc else 0))


def rounds_in_store(lay: int, act: int, residual: bool) -> bool:
    """Whether a conv's store can write its result rounded to bf16 (OUT_BF16): store_nhwc's
    one pass, so an NHWC output, a residual (if any) NHWC too, and an activation act16 has
    (every C code but tanh's; the callers refuse one left for NumPy)."""
    return bool(lay & OUT_NHWC) and (not residual or bool(lay & RES_NHWC)) and \
        act != c_snippets.ACT_CODES["tanh"]


def describe(lay: int) -> str:
    """The layout bits for a dispatch report: '' when all NCHW."""
    parts = [name for bit, name in ((IN_NHWC, "input"), (OUT_NHWC, "output"),
                                    (RES_NHWC, "residual")) if lay & bit]
    return f", NHWC {' / '.join(parts)}" if parts else ""
