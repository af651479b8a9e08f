"""braze's direct conv on a channel-blocked input (float32, one group, AVX-512): the layout
ONNX Runtime's MLAS and oneDNN run their convs in (NCHWc, 16 channels a block), here for one
conv at a time, its output written straight to NCHW.

The input is copied once per call (`blocked_prep`) into [n, cb, hp, sw, wq, 16]: blocks of
16 channels (the last zero-filled), the padding read made zeros, and each padded row split
into its sw column phases, so that the pixels a tap reads for consecutive outputs are
consecutive 64-byte runs whatever the stride. The weight is prepared once as
[o / (16 nb), cb, kh, kw, 16, 16 nb] (output channels zero-filled to a multiple of 16 nb).

A register tile is rw output pixels of one row x nb blocks of 16 output channels (rw nb <=
28 accumulators): per input channel of a tap, nb weight vectors are loaded and each pixel's
input value is broadcast into nb FMAs (about 0.57 loads per FMA at 14 x 2). The tile runs
the whole reduction (cb x kh x kw x 16) in registers, then adds the bias (and a residual)
and applies the activation as it stores its rw x 16 nb values into the NCHW output. Tiles
are numbered output-block-major and split statically over the OpenMP threads, so a thread
keeps its blocks' weights (C kh kw 16 nb floats) in its L2. One function per tile width and
block count is generated (the widths unroll into registers); a row of wo pixels is cut into
equal segments of at most 14 (nb = 2) or 7 (nb = 4, for narrow planes).

Measured on the AMX Xeon VM, one thread: 150-162 GFLOP/s on ResNet-50's 3x3 convs (56x56 to
14x14) and 137 at 7x7, against 95-128 for braze's conv tiles / pixel rows and ~155 for ONNX
Runtime's NCHWc convs on the same shapes (FMA peak 174). conv.py measures it against its other
paths per geometry (the copy of a large input can cost more than it saves on a 1x1 conv).
`lib()` is None without a C compiler or without AVX-512."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache

import numpy as np

from ..address import address
from ..codegen import cc
from . import conv_native, native
from .conv_native import VALID_RANGE

__all__ = ["lib", "Layout", "blocked_weight", "run_args", "MAX_WIDTH"]

BLOCK = 16  # channels per block: one AVX-512 vector
MAX_ACC = 28  # accumulators per tile (of 32 vector registers; the rest hold weights)
MAX_WIDTH = {2: 14, 4: 7}  # tile width (pixels) at most, per output-block count


def _tile_source(nb: int, rw: int) -> str:
    """tile_{nb}_{rw}: an rw-pixel x nb-block register tile (see the module docstring)."""
    acc = "".join(f"  __m512 a{p}_{j} = _mm512_setzero_ps();\n"
                  for p in range(rw) for j in range(nb))
    loads = "".join(f"          __m512 w{j} = _mm512_loadu_ps(wq + {BLOCK * j});\n"
                    for j in range(nb))
    fmas = "".join(f"          {{ __m512 v = _mm512_set1_ps(xq[{p * BLOCK}]); "
                   + " ".join(f"a{p}_{j} = _mm512_fmadd_ps(v, w{j}, a{p}_{j});"
                              for j in range(nb)) + " }\n"
                   for p in range(rw))
    stores = "".join(f"  _mm512_store_ps(tile + {(p * nb + j) * BLOCK}, a{p}_{j});\n"
                     for p in range(rw) for j in range(nb))
    return f"""
static void tile_{nb}_{rw}(const float* restrict x, const float* restrict w, float* tile,
                           int64_t cbn, int64_t clast, int64_t kh, int64_t kw,
                           int64_t plane, int64_t row_step, const int64_t* kx_off) {{
{acc}  for (int64_t cb = 0; cb < cbn; cb++) {{
    int64_t cn = cb == cbn - 1 ? clast : {BLOCK};
    for (int64_t ky = 0; ky < kh; ky++) {{
      const float* xr = x + cb * plane + ky * row_step;
      for (int64_t kx = 0; kx < kw; kx++, w += {BLOCK * BLOCK * nb}) {{
        const float* xk = xr + kx_off[kx];
        #pragma GCC unroll 4
        for (int64_t ci = 0; ci < cn; ci++) {{
          const float* xq = xk + ci;
          const float* wq = w + ci * {BLOCK * nb};
{loads}{fmas}        }}
      }}
    }}
  }}
{stores}}}
"""


def _tiles() -> dict[int, list[int]]:
    return {nb: list(range(1, MAX_WIDTH[nb] + 1)) for nb in MAX_WIDTH}


def _source() -> str:
    tiles = "".join(_tile_source(nb, rw) for nb, widths in _tiles().items() for rw in widths)
    tables = "".join(
        f"static const tile_fn TILES_{nb}[{MAX_WIDTH[nb] + 1}] = {{0, "
        + ", ".join(f"tile_{nb}_{rw}" for rw in widths) + "};\n"
        for nb, widths in _tiles().items())
    return r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
""" + cc.simd_math_decls() + cc.parallel_min_define() + native.ACT_SPAN + native.TRANSPOSE8 \
        + VALID_RANGE + r"""
#if !defined(__AVX512F__)
#error "the blocked conv's tiles are AVX-512 vectors"
#endif
#include <immintrin.h>
typedef void (*tile_fn)(const float*, const float*, float*, int64_t, int64_t, int64_t,
                        int64_t, int64_t, int64_t, const int64_t*);
""" + tiles + tables + r"""
/* Whether blocked_prep must fill padded row r (some output row oy < ho reads it through a
   tap ky: r = oy sh + ky dh) and column phase ph (some tap kx: (kx dw) % sw = ph): the rows
   and phases a strided conv skips (a 1x1 stride-2 conv reads a quarter of its input) are
   left unwritten. */
static int row_read(int64_t r, int64_t kh, int64_t sh, int64_t dh, int64_t ho) {
  for (int64_t ky = 0; ky < kh; ky++) {
    int64_t u = r - ky * dh;
    if (u >= 0 && u % sh == 0 && u / sh < ho) return 1;
  }
  return 0;
}
static int phase_read(int64_t ph, int64_t kw, int64_t sw, int64_t dw) {
  for (int64_t kx = 0; kx < kw; kx++)
    if ((kx * dw) % sw == ph) return 1;
  return 0;
}

/* The entries [v, hi) of one padded row's phase: channel ci's value of entry u (image column
   u sw + off) into dp[u * 16 + ci], for chans channels of planes `plane` floats apart
   starting at sp (row iy of the block's first channel). Unit and 2 strides go 8 channels x
   8 entries at a time through a register transpose (stride 2: the even lanes of 16 loaded
   floats, while those stay inside the row of w). */
static void prep_entries(const float* sp, int64_t plane, int64_t chans, int64_t sw,
                         int64_t off, int64_t w, int64_t v, int64_t hi, float* dp) {
  if (chans % 8 == 0 && sw == 1)
    for (; v + 8 <= hi; v += 8)
      for (int64_t c8 = 0; c8 < chans; c8 += 8)
        transpose8x8(sp + c8 * plane + v + off, plane, dp + v * 16 + c8, 16);
  if (chans % 8 == 0 && sw == 2) {
    const bz_v8i even = {0, 2, 4, 6, 8, 10, 12, 14};
    float block[64];
    for (; v + 8 <= hi && (v + 7) * 2 + off + 1 < w; v += 8)
      for (int64_t c8 = 0; c8 < chans; c8 += 8) {
        for (int64_t k = 0; k < 8; k++) {
          bz_v8 a, b;
          memcpy(&a, sp + (c8 + k) * plane + v * 2 + off, 32);
          memcpy(&b, sp + (c8 + k) * plane + v * 2 + off + 8, 32);
          bz_v8 e = __builtin_shuffle(a, b, even);
          memcpy(block + k * 8, &e, 32);
        }
        transpose8x8(block, 8, dp + v * 16 + c8, 16);
      }
  }
  for (int64_t ci = 0; ci < chans; ci++)
    for (int64_t u = v; u < hi; u++) dp[u * 16 + ci] = sp[ci * plane + u * sw + off];
}

/* xb [n, cbn, hp, sw, wq, 16] = x [n, c, h, w] in 16-channel blocks (channels past c zero),
   padded row r reading image row r - pt, column phase ph's v-th entry reading image column
   v * sw + ph - pl (zeros outside the image); rows and phases no tap reads are skipped. */
static void blocked_prep(const float* x, float* xb, int64_t n, int64_t c, int64_t h, int64_t w,
                         int64_t cbn, int64_t hp, int64_t sw, int64_t wq, int64_t pt,
                         int64_t pl, int64_t kh, int64_t kw, int64_t sh, int64_t dh,
                         int64_t dw, int64_t ho) {
  int64_t row = sw * wq * 16, plane = h * w;
  #pragma omp parallel for collapse(2) schedule(static) \
      if (BRAZE_PARALLEL(n * cbn * hp * row, BRAZE_PAR_MIN_MACS / 16))
  for (int64_t nc = 0; nc < n * cbn; nc++)
    for (int64_t r = 0; r < hp; r++) {
      if (!row_read(r, kh, sh, dh, ho)) continue;
      int64_t img = nc / cbn, cb = nc % cbn, iy = r - pt;
      float* restrict d = xb + (nc * hp + r) * row;
      if (iy < 0 || iy >= h) {
        memset(d, 0, (size_t)row * sizeof(float));
        continue;
      }
      int64_t chans = c - cb * 16 < 16 ? c - cb * 16 : 16;
      const float* src = x + ((img * c + cb * 16) * h + iy) * w;
      for (int64_t ph = 0; ph < sw; ph++) {
        if (!phase_read(ph, kw, sw, dw)) continue;
        int64_t lo, hi;  /* entries v with 0 <= v * sw + ph - pl < w */
        valid_range(ph - pl, sw, w, wq, &lo, &hi);
        float* restrict dp = d + ph * wq * 16;
        memset(dp, 0, (size_t)lo * 16 * sizeof(float));
        memset(dp + hi * 16, 0, (size_t)(wq - hi) * 16 * sizeof(float));
        if (chans < 16) memset(dp + lo * 16, 0, (size_t)(hi - lo) * 16 * sizeof(float));
        prep_entries(src, plane, chans, sw, ph - pl, w, lo, hi, dp);
      }
    }
}

/* Tile [width, obw] (pixel-major, channel j of pixel p at p * obw + j) into the output rows
   y[j * ld + p] of its first `chans` channels: 8 x 8 register transposes, the edges one by
   one. */
static void store_tile(const float* tile, int64_t width, int64_t obw, int64_t chans, float* y,
                       int64_t ld) {
  int64_t p8 = width / 8 * 8, j8 = chans / 8 * 8;
  for (int64_t p = 0; p < p8; p += 8)
    for (int64_t j = 0; j < j8; j += 8) transpose8x8(tile + p * obw + j, obw, y + j * ld + p, ld);
  for (int64_t j = 0; j < chans; j++) {
    const float* t = tile + j;
    float* yr = y + j * ld;
    for (int64_t p = j < j8 ? p8 : 0; p < width; p++) yr[p] = t[p * obw];
  }
}

/* y [n, o, ho, wo] = act(conv(x, w) + bias (+ res)) from blocked_prep's xb (cbn blocks in
   all, cbg per group) and the weight wb [groups, ceil(og / (16 nb)), cbg, kh, kw, 16, 16 nb]
   (og = o / groups); bias [o] and res [n, o, ho, wo] may be NULL. Tiles of rw pixels (a row
   of wo cut into nseg segments) x nb blocks of 16 channels; tap kx of pixel p reads its
   padded row at kx_off[kx] + p * 16 floats: column phase (kx dw) % sw, entry kx dw / sw.
   The last block of a group's input channels runs its clast channels only (a 3-channel
   stem conv does 3 / 16 of a full block's FMAs). The bias (and without a residual the
   activation) is applied to the tile, which is then
   stored transposed; a residual is added to the output rows, then the activation. */
static void conv_blocked(const float* xb, const float* wb, const float* bias, const float* res,
                         float* y, int64_t n, int64_t o, int64_t groups, int64_t cbn,
                         int64_t cbg, int64_t clast, int64_t kh, int64_t kw, int64_t sh,
                         int64_t sw,
                         int64_t dh, int64_t dw, int64_t hp, int64_t wq, int64_t ho,
                         int64_t wo, int64_t nb, int64_t rw, int64_t nseg, int act) {
  int64_t row = sw * wq * 16, kx_off[kw];
  for (int64_t kx = 0; kx < kw; kx++) kx_off[kx] = ((kx * dw) % sw * wq + kx * dw / sw) * 16;
  const tile_fn* tiles = nb == 4 ? TILES_4 : TILES_2;
  int64_t og = o / groups, obw = 16 * nb, obn = (og + obw - 1) / obw, out_plane = ho * wo;
  int64_t w_block = cbg * kh * kw * 16 * obw, plane = hp * row;
  int64_t items = groups * obn * n * ho * nseg;
  #pragma omp parallel for schedule(static) \
      if (BRAZE_PARALLEL(n * o * ho * wo * cbg * 16 * kh * kw, BRAZE_PAR_MIN_MACS))
  for (int64_t it = 0; it < items; it++) {
    int64_t seg = it % nseg, t = it / nseg;
    int64_t oy = t % ho, img = (t / ho) % n, gb = t / (ho * n), g = gb / obn, ob = gb % obn;
    int64_t ox = seg * rw, width = wo - ox < rw ? wo - ox : rw;
    int64_t chans = og - ob * obw < obw ? og - ob * obw : obw, oc0 = g * og + ob * obw;
    float tile[28 * 16] __attribute__((aligned(64)));
    float bt[64];
    tiles[width](xb + (img * cbn + g * cbg) * plane + oy * sh * row + ox * 16,
                 wb + gb * w_block, tile, cbg, clast, kh, kw, plane, dh * row, kx_off);
    for (int64_t j = 0; j < obw; j++) bt[j] = bias && j < chans ? bias[oc0 + j] : 0.0f;
    for (int64_t p = 0; p < width; p++) {
      float* tp = tile + p * obw;
      #pragma omp simd
      for (int64_t j = 0; j < obw; j++) tp[j] += bt[j];
    }
    if (!res && act) act_span(tile, NULL, tile, width * obw, act);
    int64_t at = ((img * o + oc0) * ho + oy) * wo + ox;
    store_tile(tile, width, obw, chans, y + at, out_plane);
    if (res)
      for (int64_t j = 0; j < chans; j++) {
        float* yr = y + at + j * out_plane;
        const float* rr = res + at + j * out_plane;
        for (int64_t p = 0; p < width; p++) yr[p] += rr[p];
        if (act) act_span(yr, NULL, yr, width, act);
      }
  }
}

/* The conv of x [n, c, h, w]: blocked_prep into xb, then conv_blocked. */
void conv_blocked_run(const float* x, float* xb, const float* wb, const float* bias,
                      const float* res, float* y, int64_t n, int64_t c, int64_t h, int64_t w,
                      int64_t o, int64_t groups, int64_t cbn, int64_t cbg, int64_t kh,
                      int64_t kw, int64_t sh, int64_t sw,
                      int64_t dh, int64_t pt, int64_t pl, int64_t hp, int64_t wq, int64_t ho,
                      int64_t wo, int64_t nb, int64_t rw, int64_t nseg, int64_t dw, int act) {
  blocked_prep(x, xb, n, c, h, w, cbn, hp, sw, wq, pt, pl, kh, kw, sh, dh, dw, ho);
  int64_t clast = c / groups - (cbg - 1) * 16;
  conv_blocked(xb, wb, bias, res, y, n, o, groups, cbn, cbg, clast, kh, kw, sh, sw, dh, dw, hp,
               wq, ho, wo, nb, rw, nseg, act);
}
"""


_I, _P, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
_SIGNATURES = {"conv_blocked_run": [_P] * 6 + [_I] * 23 + [_INT]}


@cache
def lib():
    """The compiled blocked-conv library, or None without a C compiler or AVX-512 (the source
    does not compile without it)."""
    return cc.load_library(_source() + conv_native.packed_wrappers(_SIGNATURES),
                           "braze_conv_blocked", conv_native.with_packed(_SIGNATURES))


@dataclass(frozen=True)
class Layout:
    """One conv's blocked form: input channel blocks (cbn; cbg per group), padded rows read
    (hp), column phases (sw) of wq entries, output blocks per tile (nb), tile width (rw) and
    segments per output row (nseg)."""

    cbn: int
    cbg: int
    hp: int
    sw: int
    wq: int
    nb: int
    rw: int
    nseg: int

    @classmethod
    def of(cls, geo) -> Layout:
        """geo: a conv.ConvGeometry, with one group or groups of whole blocks (`fits`)."""
        (sh, sw), (dh, dw) = geo.stride, geo.dilation
        hp = (geo.ho - 1) * sh + (geo.kh - 1) * dh + 1
        wq = geo.wo + (geo.kw - 1) * dw // sw
        nb = 4 if geo.wo <= MAX_WIDTH[4] and geo.og > 2 * BLOCK else 2
        nseg = -(-geo.wo // MAX_WIDTH[nb])
        rw = -(-geo.wo // nseg)
        return cls(-(-geo.c // BLOCK), -(-geo.cg // BLOCK), hp, sw, wq, nb, rw, nseg)

    @staticmethod
    def fits(geo) -> bool:
        """Whether the blocked conv runs `geo`: one group, or groups whose input channels are
        whole blocks of 16 (RegNet's grouped 3x3 convs of 64-channel groups)."""
        return geo.groups == 1 or geo.cg % BLOCK == 0

    def input_floats(self, geo) -> int:
        """The scratch blocked_prep fills."""
        return geo.n * self.cbn * self.hp * self.sw * self.wq * BLOCK


def blocked_weight(w: np.ndarray, layout: Layout, groups: int = 1) -> np.ndarray:
    """A conv weight [o, cg, kh, kw] as conv_blocked reads it: [groups, ceil(og / (16 nb)),
    cbg, kh, kw, 16, 16 nb] (og = o / groups), input and output channels of each group
    zero-filled to whole blocks."""
    o, cg, kh, kw = w.shape
    og, width = o // groups, BLOCK * layout.nb
    obn = -(-og // width)
    full = np.zeros((groups, obn * width, layout.cbg * BLOCK, kh, kw), np.float32)
    full[:, :og, :cg] = w.reshape(groups, og, cg, kh, kw)
    blocks = full.reshape(groups, obn, width, layout.cbg, BLOCK, kh, kw)
    return np.ascontiguousarray(blocks.transpose(0, 1, 3, 5, 6, 4, 2))


def run_args(geo, layout: Layout, x, xb, wb, bias, y, act: int, res=None) -> tuple:
    """conv_blocked_run's arguments (addresses of C-contiguous float32 arrays, or None): x
    [n, c, h, w] copied into xb (layout.input_floats floats), wb from blocked_weight, bias
    [o] or None, res a residual of y's shape or None."""
    (sh, sw), (dh, _) = geo.stride, geo.dilation
    return (address(x), address(xb), address(wb), None if bias is None else address(bias),
            None if res is None else address(res), address(y), geo.n, geo.c, geo.h, geo.w,
            geo.o, geo.groups, layout.cbn, layout.cbg, geo.kh, geo.kw, sh, sw, dh,
            geo.padding[0], geo.padding[1],
            layout.hp, layout.wq, geo.ho, geo.wo, layout.nb, layout.rw, layout.nseg,
            geo.dilation[1], act)
