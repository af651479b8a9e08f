"""braze's own float32 GEMM on weights packed once: out = act(x @ w + bias).

A static 2-D weight w [k, n] (any strides: stored, or a transposed view) is copied once, when
the program is built, into panels of NR = 16 columns (rows of 16 contiguous floats; K blocks
of 256 rows outermost, the panels within), the last panel zero padded: ceil(n / 16) * 16 * k
floats, about 1.0x the weight (MKL's cblas_sgemm_pack took ~4x per tile slab). A call then

- cuts the output into tiles (a block of rows x a group of panels) handed out dynamically over
  the OpenMP threads (a thread the OS delays on a busy machine leaves its tiles to the others);
- per tile and K block of KC = 256 rows runs the register-blocked micro-kernel over the tile:
  MR x 16 accumulators (6 x two 8-float vectors under AVX2, 12 x one 16-float vector under
  AVX-512) fed by one broadcast of x (read in place; a short last row block is copied, zero
  padded) and the 16 weights of the panel per k;
- starts the accumulators from the bias, and applies the activation to the finished tile while
  it is in cache, with the executor's activation code (native.ACT_SPAN: the same exp / erf /
  tanh the other kernels use and the tests check).

The kernel is GCC vector extensions (no intrinsics), compiled with codegen.cc's flags
(-march=native): AVX2 / AVX-512 / plain SSE machines all get a correct build. `lib()` is None
without a C compiler; callers keep their BLAS path then, and for whatever `gemm` declines.
The executor uses it by default; BRAZE_PACKED_GEMM=0 opts out (see fused.packed_weight)."""
from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

from ..codegen import cc
from . import native

__all__ = ["PackedWeight", "lib", "pack", "gemm", "PANEL"]

PANEL = 16  # columns per packed panel (NR)

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>
""" + cc.simd_math_decls() + cc.parallel_min_define() + native.ACT_SPAN + r"""
#if defined(__AVX512F__)
#define VW 16
#define MR 12
#else
#define VW 8
#define MR 6
#endif
#define NR 16
#define NV (NR / VW)
#define KC 256
#define MC 144  /* rows per tile at most (balanced over the row blocks) */

typedef float vf __attribute__((vector_size(VW * 4), aligned(4)));

/* c[MR, NR] (row stride ldc) = (load ? c : bias row or 0) + a @ bp over kc: a is MR rows of x
   (row stride lda, read in place: packing x cost ~10% when every tile repacked it), bp a panel
   slice [kc][NR] of the packed weight. Rows are addressed from two bases, so the compiler keeps
   them in registers (base + lda * {0, 1, 2}). */
static void micro(int64_t kc, const float* restrict a, int64_t lda, const float* restrict bp,
                  float* c, int64_t ldc, int load, const float* bias) {
  const float* a0 = a;
  const float* a3 = a + 3 * lda;
  vf acc[MR][NV], b0[NV];
  #pragma GCC unroll 4
  for (int v = 0; v < NV; v++) b0[v] = bias ? *(const vf*)(bias + v * VW) : (vf){0};
  #pragma GCC unroll 16
  for (int i = 0; i < MR; i++) {
    #pragma GCC unroll 4
    for (int v = 0; v < NV; v++) acc[i][v] = load ? *(const vf*)(c + i * ldc + v * VW) : b0[v];
  }
  #pragma GCC unroll 4
  for (int64_t k = 0; k < kc; k++) {
    vf b[NV];
    #pragma GCC unroll 4
    for (int v = 0; v < NV; v++) b[v] = *(const vf*)(bp + k * NR + v * VW);
    #pragma GCC unroll 16
    for (int i = 0; i < MR; i++) {
      float x = i < 3 ? a0[k + i * lda] : a3[k + (i - 3) * lda];
      #pragma GCC unroll 4
      for (int v = 0; v < NV; v++) acc[i][v] += x * b[v];
    }
  }
  #pragma GCC unroll 16
  for (int i = 0; i < MR; i++) {
    #pragma GCC unroll 4
    for (int v = 0; v < NV; v++) *(vf*)(c + i * ldc + v * VW) = acc[i][v];
  }
}

int64_t pg_packed_floats(int64_t k, int64_t n) { return (n + NR - 1) / NR * NR * k; }

/* Where panel p's rows [k0, k0 + KC) start in the packed weight: K blocks of KC rows one after
   the other, inside a block the panels one after the other, so a tile's walk over its panels
   in one K block reads one contiguous stream. */
static inline int64_t panel_at(int64_t p, int64_t k0, int64_t k, int64_t n) {
  int64_t kc = k - k0 < KC ? k - k0 : KC;
  return k0 * ((n + NR - 1) / NR * NR) + p * kc * NR;
}

/* w[kk, j] = w[kk * s0 + j * s1] (k x n) -> the packed layout above (rows of NR floats per
   panel, the last panel zero padded). */
void pg_pack(const float* w, int64_t s0, int64_t s1, int64_t k, int64_t n, float* bp) {
  int64_t panels = (n + NR - 1) / NR;
  #pragma omp parallel for collapse(2) schedule(static)
  for (int64_t k0 = 0; k0 < k; k0 += KC) {
    for (int64_t p = 0; p < panels; p++) {
      int64_t kc = k - k0 < KC ? k - k0 : KC;
      float* dst = bp + panel_at(p, k0, k, n);
      for (int64_t kk = 0; kk < kc; kk++)
        for (int64_t j = 0; j < NR; j++) {
          int64_t col = p * NR + j;
          dst[kk * NR + j] = col < n ? w[(k0 + kk) * s0 + col * s1] : 0.0f;
        }
    }
  }
}

/* out[m, n] (C-contiguous) = act(a[m, k] (row stride lda) @ w + bias), w packed by pg_pack;
   bias may be NULL. Tiles of up to MC rows (balanced, a multiple of MR) x `group` panels,
   about 4 per thread, at most 16 panels wide. */
void pg_gemm(const float* a, int64_t lda, const float* bp, float* out, int64_t m, int64_t n,
             int64_t k, const float* bias, int act) {
  int64_t panels = (n + NR - 1) / NR, nt = omp_get_max_threads();
  int64_t rblocks = (m + MC - 1) / MC;
  int64_t rb = ((m + rblocks - 1) / rblocks + MR - 1) / MR * MR;
  rblocks = (m + rb - 1) / rb;
  int64_t group = panels * rblocks / (4 * nt);
  group = group > 16 ? 16 : group < 1 ? 1 : group;
  int64_t groups = (panels + group - 1) / group, tiles = rblocks * groups;
  #pragma omp parallel if(tiles > 1 && BRAZE_PARALLEL(m * n * k, BRAZE_PAR_MIN_MACS))
  {
    float tail[MR * KC], tmp[MR * NR], pad_bias[NR];
    #pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tiles; t++) {
      int64_t r0 = t / groups * rb, p0 = t % groups * group;
      int64_t rows = m - r0 < rb ? m - r0 : rb, p1 = p0 + group < panels ? p0 + group : panels;
      int64_t full = rows / MR * MR, mr = rows - full;  /* the last mr rows: a short block */
      for (int64_t k0 = 0; k0 < k; k0 += KC) {
        int64_t kc = k - k0 < KC ? k - k0 : KC;
        if (mr) {  /* copied once per K block, zero padded to MR rows */
          memset(tail, 0, sizeof tail);
          for (int64_t i = 0; i < mr; i++)
            memcpy(tail + i * KC, a + (r0 + full + i) * lda + k0, kc * sizeof(float));
        }
        for (int64_t p = p0; p < p1; p++) {
          int64_t j0 = p * NR, nr = n - j0 < NR ? n - j0 : NR;
          const float* bpp = bp + panel_at(p, k0, k, n);
          const float* bb = 0;
          if (bias && k0 == 0) {
            if (nr == NR) {
              bb = bias + j0;
            } else {
              for (int64_t j = 0; j < NR; j++) pad_bias[j] = j < nr ? bias[j0 + j] : 0.0f;
              bb = pad_bias;
            }
          }
          /* the weights come from memory in a model (each is read once per call): while this
             panel's rows compute, fetch the next panel's block (kc lines) into L2, a share
             per row block */
          const char* next = (const char*)(bpp + kc * NR);
          int64_t lines = p + 1 < p1 ? kc : 0, share = (lines * MR + rows - 1) / rows + 1;
          for (int64_t i0 = 0; i0 < rows; i0 += MR) {
            for (int64_t l = i0 / MR * share; l < (i0 / MR + 1) * share && l < lines; l++)
              __builtin_prefetch(next + l * 64, 0, 2);
            int64_t h = i0 < full ? MR : mr;
            const float* ai = i0 < full ? a + (r0 + i0) * lda + k0 : tail;
            int64_t ld = i0 < full ? lda : KC;
            float* c = out + (r0 + i0) * n + j0;
            if (h == MR && nr == NR) {
              micro(kc, ai, ld, bpp, c, n, k0 > 0, bb);
              continue;
            }
            if (k0 > 0) for (int64_t i = 0; i < h; i++) memcpy(tmp + i * NR, c + i * n, nr * 4);
            micro(kc, ai, ld, bpp, tmp, NR, k0 > 0, bb);
            for (int64_t i = 0; i < h; i++) memcpy(c + i * n, tmp + i * NR, nr * 4);
          }
        }
      }
      if (act) {
        int64_t j0 = p0 * NR, j1 = p1 * NR < n ? p1 * NR : n;
        for (int64_t r = r0; r < r0 + rows; r++)
          act_span(out + r * n + j0, 0, out + r * n + j0, j1 - j0, act);
      }
    }
  }
}
"""

_I64, _INT, _P = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
_SIGNATURES = {
    "pg_packed_floats": ([_I64, _I64], _I64),
    "pg_pack": ([_P, _I64, _I64, _I64, _I64, _P], None),
    "pg_gemm": ([_P, _I64, _P, _P, _I64, _I64, _I64, _P, _INT], None),
}


@cache
def lib():
    """The compiled packed-GEMM library, or None without a C compiler."""
    return cc.load_library(SOURCE, "braze_packed_gemm", _SIGNATURES)


class PackedWeight:
    """A float32 weight [k, n] in braze's panel layout (see the module docstring). `panels`
    is the buffer (ceil(n / 16) * 16 * k floats); it does not follow later writes to the
    source weight: pack again."""

    def __init__(self, panels: np.ndarray, k: int, n: int):
        self.panels, self.k, self.n = panels, k, n

    @property
    def nbytes(self) -> int:
        return self.panels.nbytes


def pack(w: np.ndarray) -> PackedWeight | None:
    """w (float32 [k, n], any strides) packed once, or None when it can't be (no compiler,
    not 2-D float32, empty, negative strides)."""
    so = lib()
    if so is None or not isinstance(w, np.ndarray) or w.ndim != 2 or w.dtype != np.float32:
        return None
    k, n = w.shape
    if k == 0 or n == 0 or any(s < 0 or s % 4 for s in w.strides):
        return None
    size = int(so.pg_packed_floats(k, n))
    raw = np.empty(size + 16, np.float32)  # panel rows on 64-byte lines: no split loads
    start = (-raw.ctypes.data % 64) // 4
    panels = raw[start:start + size]
    so.pg_pack(w.ctypes.data, w.strides[0] // 4, w.strides[1] // 4, k, n, panels.ctypes.data)
    return PackedWeight(panels, k, n)


def gemm(x: np.ndarray, packed: PackedWeight, out: np.ndarray, bias: np.ndarray | None,
         act: int) -> bool:
    """out = act(x @ w + bias) for x [..., k] and out [..., n] (float32, C-contiguous; bias
    [n] contiguous or None; act a native.ACT_CODES value) on a weight packed by `pack`.
    False, with nothing written, when the operands don't fit."""
    so = lib()
    if so is None or x.dtype != np.float32 or out.dtype != np.float32:
        return False
    if not x.flags.c_contiguous or not out.flags.c_contiguous:
        return False
    if x.shape[-1] != packed.k or out.shape[-1] != packed.n or x.ndim < 1:
        return False
    m = x.size // packed.k
    if out.size != m * packed.n:
        return False
    if bias is not None and (bias.dtype != np.float32 or bias.shape != (packed.n,) or
                             not bias.flags.c_contiguous):
        return False
    if m:
        so.pg_gemm(x.ctypes.data, packed.k, packed.panels.ctypes.data, out.ctypes.data, m,
                   packed.n, packed.k, None if bias is None else bias.ctypes.data, act)
    return True
