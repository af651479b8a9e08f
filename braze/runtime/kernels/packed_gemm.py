"""braze's own float32 GEMM on weights packed once: out = act(x @ w + bias).

A static 2-D weight w [k, n] (any strides: stored, or a transposed view) is copied once, when
the program is built, into panels of NR = 16 columns (rows of 16 contiguous floats; K blocks
of 128 rows outermost, the panels within), the last panel zero padded: ceil(n / 16) * 16 * k
floats, about 1.0x the weight (MKL's cblas_sgemm_pack took ~4x per tile slab). A call then

- cuts the output into tiles (a block of rows x a group of panels, whole micro blocks of 4
  panels under AVX-512, split evenly, the tile count a multiple of the threads) handed out
  dynamically over the OpenMP threads (a thread the OS delays on a busy machine leaves its
  tiles to the others);
- per tile and K block of KC = 128 rows runs the register-blocked micro-kernel down the
  tile's rows of x, 6 rows at a time (a rest of 1-5 rows its own block), into the tile's
  output in the thread's scratch: 6 rows x 4 panels of 16-float vectors under AVX-512 (24
  accumulators fed per k by 4 weight vectors and one broadcast of x per row: 0.42 loads per
  FMA), 6 x two 8-float vectors (one panel) under AVX2. Each K block's sum starts from zero
  and is added to the earlier blocks' (blocked summation, as accurate as MKL's sgemm at K =
  3072). x rows a multiple of 4 KB apart (K = 1024, 2048, 3072) in place put a micro
  block's rows on one L1 set (~10% lost with 12-row blocks): such an x is copied once per call
  into rows padded by 16 floats (a per-thread buffer, up to PAD_X_FLOATS) and read there, or,
  larger, copied into the tile's padded scratch rows per K block (once per panel group: the
  down projection K = 2048 of LLaMA-small took ~6% longer that way at 128 rows);
- starts the accumulators from the bias, and applies the activation while the finished tile
  goes from scratch to `out`, with the executor's activation code (c_snippets.ACT_SPAN: the same
  vector math the other kernels use and the tests check; its tanh GELU as x sigmoid(2u) took
  GPT-2's FFN step 3.62 -> 3.25 ms on the Zen 4 VM, against ~3.1 for its down projection).

Gated mode (a gated MLP's gate / up GEMM, executor step "braze packed-weight GEMM + gated
silu"): `pack_gated` takes the [k, 2F] weight whose product fused_swiglu splits into gate and
up halves (either first) and packs gate panel j next to up panel j (gate_up_pairs, each half
zero padded to a multiple of 16 columns), the tiles split over those pairs, so a tile always
holds matching gate and up columns; its epilogue writes act(gate) * up for them (act_span's
activation, then the product) into out [m, F]. The [m, 2F] product never leaves the scratch.

The kernel is GCC vector extensions (no intrinsics), compiled with codegen.cc's flags
(-march=native): AVX2 / AVX-512 / plain SSE machines all get a correct build. `lib()` is None
without a C compiler; callers keep their BLAS path then, and for whatever `gemm` declines.
The executor uses it by default; BRAZE_PACKED_GEMM=0 opts out (see fused.packed_weight)."""
from __future__ import annotations

import ctypes
import threading
from functools import cache

import numpy as np

from ..address import address
from ..codegen import cc
from ..plan import aligned_empty
from . import c_snippets

__all__ = ["PackedWeight", "lib", "pack", "gemm", "pack_gated", "gemm_gated", "gate_up_pairs",
           "gemm_bias", "PANEL"]

PANEL = 16  # columns per packed panel (NR)

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>
""" + cc.simd_math_decls() + cc.parallel_min_define() + c_snippets.ACT_SPAN \
    + c_snippets.BF16_ROW + r"""
#if defined(__AVX512F__)
#define VW 16
#else
#define VW 8
#endif
#define MR 6
#define NR 16
#define NV (NR / VW)
#define KC 128
#define MC 144  /* rows per tile at most (balanced over the row blocks) */

typedef float vf __attribute__((vector_size(VW * 4), aligned(4)));
""" + c_snippets.REGISTER_TILE + r"""
#define MICRO(h, q) tile_hq(h, q, kc, a, lda, bp, NR, ps, c, ldc, bias, 0, load)
#define MICRO_ROWS(q) switch (h) { case 1: MICRO(1, q); break; case 2: MICRO(2, q); break; \
    case 3: MICRO(3, q); break; case 4: MICRO(4, q); break; case 5: MICRO(5, q); break; \
    default: MICRO(6, q); }

/* c[h, q NR] (row stride ldc) = (load ? c : 0) + ((bias or 0) + a @ (q panels) over kc) for
   any h in 1..MR and q in 1..QP: each K block's sum starts from zero (or the bias) and is
   added to the earlier blocks' (blocked summation: at K = 3072 the error was ~6x MKL's when
   the sum ran on from c); bp is a panel slice [kc][NR] of the packed weight, the next
   panel's ps floats further. */
static void micro(int h, int q, int64_t kc, const float* restrict a, int64_t lda,
                  const float* restrict bp, int64_t ps, float* c, int64_t ldc, int load,
                  const float* bias) {
#if QP == 4
  if (q == 4) { MICRO_ROWS(4) return; }
  if (q == 3) { MICRO_ROWS(3) return; }
  if (q == 2) { MICRO_ROWS(2) return; }
#endif
  MICRO_ROWS(1)
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

/* Scratch per thread (pg_gemm's `scratch`: this times the threads): a tile's x rows for one K
   block and its output, on rows padded so that no two rows of a micro block share an L1 set
   (rows of 3072 or 4096 floats in place all did: the micro-kernel lost ~10%). */
#define LDA_T (KC + 16)
#define LDC_T (16 * NR + 16)
#define SCRATCH_FLOATS ((MC + MR) * (LDA_T + LDC_T))

int64_t pg_scratch_floats(void) { return SCRATCH_FLOATS * (int64_t)omp_get_max_threads(); }

/* The gated epilogue of a tile: its scratch rows (row stride LDC_T) hold `pairs` pairs of
   panels, gate then up; out row i (row stride ldo) gets act(gate) * up for its first `cols`
   columns (the pairs' columns but the zero padding past the last). */
static void gated_epilogue(const float* ct, int64_t rows, int64_t pairs, float* out,
                           int64_t cols, int64_t ldo, int act) {
  float gate[8 * NR];  /* a tile has at most 16 panels */
  int64_t width = pairs * NR < cols ? pairs * NR : cols;
#if defined(__AVX512F__)
  if (NR == 16 && ACT16_OK(act)) {   /* one pass: act(gate) * up in registers */
    for (int64_t i = 0; i < rows; i++)
      for (int64_t q = 0; q * NR < width; q++) {
        const float* g = ct + i * LDC_T + 2 * q * NR;
        __mmask16 m = width - q * NR >= NR ? 0xffff : (__mmask16)((1u << (width - q * NR)) - 1);
        __m512 v = _mm512_loadu_ps(g);
        _mm512_mask_storeu_ps(out + i * ldo + q * NR, m,
                              _mm512_mul_ps(act16(v, act), _mm512_loadu_ps(g + NR)));
      }
    return;
  }
#endif
  for (int64_t i = 0; i < rows; i++) {
    const float* row = ct + i * LDC_T;
    for (int64_t q = 0; q < pairs; q++) memcpy(gate + q * NR, row + 2 * q * NR, NR * 4);
    act_span(gate, 0, gate, width, act);
    float* o = out + i * ldo;
    for (int64_t q = 0; q < pairs; q++) {
      const float* up = row + (2 * q + 1) * NR;
      int64_t c0 = q * NR, c1 = c0 + NR < width ? c0 + NR : width;
      #pragma omp simd
      for (int64_t c = c0; c < c1; c++) o[c] = gate[c] * up[c - c0];
    }
  }
}

/* out = act(x[m, k] (row stride ldx) @ w + bias) (gated = 0: out [m, n]), or act(gate) * up
   (gated = 1: out [m, n_out]; w holds gate / up column blocks of NR side by side, n = 2 *
   ceil(n_out / NR) * NR, bias in the same layout); w packed by pg_pack; bias may be NULL;
   scratch holds pg_scratch_floats() floats (64-byte aligned). The output is cut into tiles of
   up to MC rows (balanced over the row blocks, whole micro blocks) x a group of at most 16
   panels (whole micro blocks of QP panels, or gated gate / up pairs, split evenly into
   groups, the tile count a multiple of the threads), about 4 per thread, handed out
   dynamically (a thread the OS delays on a busy machine leaves its tiles to the others). Per
   tile and K block each micro block of panels runs the micro-kernel down the rows (MR-row
   blocks, a shorter last one) into the tile's scratch output, which goes to `out` through
   the epilogue when the tile is done. */
static void gemm_tiles(const float* x, int64_t ldx, const float* bp, float* out, int64_t m,
                       int64_t n, int64_t k, const float* bias, int act, float* scratch,
                       int gated, int64_t n_out, float* xpad) {
  /* x rows a multiple of 4 KB apart (K = 1024, 2048, ...): copied once, in parallel, into
     xpad (when given: m rows of k + 16 floats) and read in place there, instead of into every
     tile's scratch per K block (once per panel group) */
  int pad_x = xpad != 0 && (ldx * 4) % 4096 == 0;
  const float* a = pad_x ? xpad : x;
  int64_t lda = pad_x ? k + 16 : ldx;
  /* panels a tile keeps together: whole micro blocks of QP panels (gated: gate / up pairs) */
  int64_t unit = QP % (gated ? 2 : 1) == 0 ? QP : 2;
  int64_t panels = (n + NR - 1) / NR, units = (panels + unit - 1) / unit;
  int64_t nt = omp_get_max_threads(), rblocks = (m + MC - 1) / MC;
  int64_t rb = ((m + rblocks - 1) / rblocks + MR - 1) / MR * MR;  /* whole micro blocks */
  rblocks = (m + rb - 1) / rb;
  /* about 4 tiles per thread, but 2 where a row block of x is 1 MB or more (K >= 2048 at
     128 rows): every tile reads its row block of x whole, 6 narrow tiles per thread read 1.5
     MB six times per core against an L2 of 2 MB (128 x 3072 x 768: 0.84-0.87x the time with
     2 wider ones per thread; one thread alone had run as fast per core as at K = 768) */
  int64_t per_thread = rb * k * 4 >= (1 << 20) ? 2 : 4;
  int64_t groups = (per_thread * nt + rblocks - 1) / rblocks, per_group = 16 / unit;
  if (groups < (units + per_group - 1) / per_group) groups = (units + per_group - 1) / per_group;
  if (groups > units) groups = units;
  /* equal tiles where a group count up to 4x as many gives them: 12 units in 8 groups of 1
     or 2 left a thread idle for 2 of 7 units' time (N = 768: 0.89-0.99x as long with 12) */
  for (int64_t g = groups; g <= units && g <= 4 * groups; g++)
    if (units % g == 0 && g * rblocks % nt == 0) { groups = g; break; }
  if (groups * rblocks % nt && groups + nt - groups * rblocks % nt <= units)
    groups += nt - groups * rblocks % nt;
  int64_t tiles = rblocks * groups;
  #pragma omp parallel if(tiles > 1 && BRAZE_PARALLEL(m * n * k, BRAZE_PAR_MIN_MACS))
  {
    float* at = scratch + SCRATCH_FLOATS * (int64_t)omp_get_thread_num();
    float* ct = at + (MC + MR) * LDA_T;
    float pad_bias[QP * NR];
    if (pad_x) {
      #pragma omp for schedule(static)
      for (int64_t i = 0; i < m; i++) memcpy(xpad + i * lda, x + i * ldx, k * sizeof(float));
    }
    #pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tiles; t++) {
      int64_t g = t % groups, r0 = t / groups * rb;
      int64_t p0 = g * units / groups * unit, p1 = (g + 1) * units / groups * unit;
      p1 = p1 < panels ? p1 : panels;
      int64_t rows = m - r0 < rb ? m - r0 : rb;
      int64_t blocks = (rows + MR - 1) / MR;
      /* x is read in place unless its rows are a multiple of 4 KB apart (a micro block's rows
         all on one L1 set, with the panels' lines: past its 8 ways): then the tile's rows are
         copied into the padded scratch per K block */
      int in_place = (lda * 4) % 4096 != 0;
      for (int64_t k0 = 0; k0 < k; k0 += KC) {
        int64_t kc = k - k0 < KC ? k - k0 : KC;
        if (!in_place)
          for (int64_t i = 0; i < rows; i++)
            memcpy(at + i * LDA_T, a + (r0 + i) * lda + k0, kc * sizeof(float));
        for (int64_t p = p0; p < p1; p += QP) {
          int q = p1 - p < QP ? (int)(p1 - p) : QP;
          int64_t j0 = p * NR;
          const float* bpp = bp + panel_at(p, k0, k, n);
          const float* bb = 0;
          if (bias && k0 == 0) {
            if (j0 + q * NR <= n) {
              bb = bias + j0;
            } else {
              for (int64_t j = 0; j < q * NR; j++) pad_bias[j] = j0 + j < n ? bias[j0 + j] : 0.0f;
              bb = pad_bias;
            }
          }
          /* the weights come from memory in a model (each is read once per call): while these
             panels' rows compute, fetch the next panels' block (q kc lines) into L2, a share
             per row block */
          const char* next = (const char*)(bpp + q * kc * NR);
          int64_t lines = p + q < p1 ? q * kc : 0, share = (lines + blocks - 1) / blocks;
          float* cp = ct + (p - p0) * NR;
          for (int64_t blk = 0; blk < blocks; blk++) {
            for (int64_t l = blk * share; l < (blk + 1) * share && l < lines; l++)
              __builtin_prefetch(next + l * 64, 0, 2);
            int64_t i0 = blk * MR;
            int h = rows - i0 < MR ? (int)(rows - i0) : MR;
            const float* ai = in_place ? a + (r0 + i0) * lda + k0 : at + i0 * LDA_T;
            micro(h, q, kc, ai, in_place ? lda : LDA_T, bpp, kc * NR, cp + i0 * LDC_T, LDC_T,
                  k0 > 0, bb);
          }
        }
      }
      if (gated) {
        gated_epilogue(ct, rows, (p1 - p0) / 2, out + r0 * n_out + p0 / 2 * NR,
                       n_out - p0 / 2 * NR, n_out, act);
        continue;
      }
      int64_t j0 = p0 * NR, j1 = p1 * NR < n ? p1 * NR : n;
      for (int64_t i = 0; i < rows; i++)
        act_span(ct + i * LDC_T, 0, out + (r0 + i) * n + j0, j1 - j0, act);
    }
  }
}

void pg_gemm(const float* a, int64_t lda, const float* bp, float* out, int64_t m, int64_t n,
             int64_t k, const float* bias, int act, float* scratch, float* xpad) {
  gemm_tiles(a, lda, bp, out, m, n, k, bias, act, scratch, 0, n, xpad);
}

/* out[m, n_out] = act(gate) * up on a weight packed in gate / up pairs (see gemm_tiles). */
void pg_gemm_gated(const float* a, int64_t lda, const float* bp, float* out, int64_t m,
                   int64_t n, int64_t k, const float* bias, int act, float* scratch,
                   int64_t n_out, float* xpad) {
  gemm_tiles(a, lda, bp, out, m, n, k, bias, act, scratch, 1, n_out, xpad);
}
"""

_I64, _INT, _P = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
_SIGNATURES = {
    "pg_packed_floats": ([_I64, _I64], _I64),
    "pg_pack": ([_P, _I64, _I64, _I64, _I64, _P], None),
    "pg_scratch_floats": ([], _I64),
    "pg_gemm": ([_P, _I64, _P, _P, _I64, _I64, _I64, _P, _INT, _P, _P], None),
    "pg_gemm_gated": ([_P, _I64, _P, _P, _I64, _I64, _I64, _P, _INT, _P, _I64, _P], None),
}


@cache
def lib():
    """The compiled packed-GEMM library, or None without a C compiler."""
    return cc.load_library(SOURCE, "braze_packed_gemm", _SIGNATURES)


class PackedWeight:
    """A float32 weight [k, n] in braze's panel layout (see the module docstring). `panels`
    is the buffer (ceil(n / 16) * 16 * k floats); it does not follow later writes to the
    source weight: pack again. A gated weight (`pack_gated`) holds the gate and up halves of
    a [k, 2 * out_cols] weight as pairs of panels (n = 2 * ceil(out_cols / 16) * 16)."""

    def __init__(self, panels: np.ndarray, k: int, n: int, out_cols: int | None = None,
                 gate_first: bool = True):
        self.panels, self.k, self.n = panels, k, n
        self.out_cols = n if out_cols is None else out_cols
        self.gated = out_cols is not None
        self.gate_first = gate_first

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
    panels = aligned_empty(size, np.float32)  # panel rows on 64-byte lines: no split loads
    so.pg_pack(address(w), w.strides[0] // 4, w.strides[1] // 4, k, n, address(panels))
    return PackedWeight(panels, k, n)


def gate_up_pairs(w: np.ndarray, gate_first: bool) -> np.ndarray:
    """The columns of w [..., 2 F] (gate half first when `gate_first`, else up first) as
    [..., 2 ceil(F / 16) * 16]: gate columns 16 j .. 16 j + 15, then the same up columns, for
    each j, zero padded past F. The layout pack_gated packs and gemm_gated's bias takes."""
    f = w.shape[-1] // 2
    fp = -(-f // PANEL) * PANEL
    halves = (w[..., :f], w[..., f:]) if gate_first else (w[..., f:], w[..., :f])
    lead = w.shape[:-1]
    out = np.zeros(lead + (fp // PANEL, 2, PANEL), np.float32)
    padded = np.zeros(lead + (fp,), np.float32)
    for i, half in enumerate(halves):
        padded[..., :f] = half
        out[..., i, :] = padded.reshape(lead + (fp // PANEL, PANEL))
    return out.reshape(lead + (2 * fp,))


def bias_fits(bias, cols: int) -> bool:
    """Whether a bias of this Shape is one the GEMMs take: [cols], or one value ((), (1,))
    that gemm_bias spreads over the columns."""
    return tuple(bias.dims) == (cols,) or bias.numel() == 1


def gemm_bias(b: np.ndarray, cols: int, gate_first: bool | None = None) -> np.ndarray:
    """A bias [cols] (or a scalar) as the GEMMs take it: contiguous float32, and for a gated
    weight (gate_first set) in its gate / up pair layout (gate_up_pairs)."""
    full = np.ascontiguousarray(np.broadcast_to(np.asarray(b, np.float32), (cols,)))
    return full if gate_first is None else gate_up_pairs(full, gate_first)


def pack_gated(w: np.ndarray, gate_first: bool = True) -> PackedWeight | None:
    """w (float32 [k, 2 F]: the gate and up projections side by side, gate first or second)
    packed once for gemm_gated, each gate panel next to its up panel; None as `pack`, or when
    w's last dim is odd."""
    if not isinstance(w, np.ndarray) or w.ndim != 2 or w.shape[1] % 2:
        return None
    packed = pack(gate_up_pairs(w, gate_first)) if w.dtype == np.float32 else None
    if packed is None:
        return None
    return PackedWeight(packed.panels, packed.k, packed.n, w.shape[1] // 2, gate_first)


def gemm(x: np.ndarray, packed: PackedWeight, out: np.ndarray, bias: np.ndarray | None,
         act: int) -> bool:
    """out = act(x @ w + bias) for x [..., k] and out [..., n] (float32, C-contiguous; bias
    [n] contiguous or None; act a c_snippets.ACT_CODES value) on a weight packed by `pack`.
    False, with nothing written, when the operands don't fit."""
    so = lib()
    if so is None or packed.gated or not _fits(x, packed, out, bias):
        return False
    m = x.size // packed.k
    if m:
        so.pg_gemm(address(x), packed.k, address(packed.panels), address(out), m,
                   packed.n, packed.k, None if bias is None else address(bias), act,
                   address(_scratch(int(so.pg_scratch_floats()))), _padded_x(m, packed.k))
    return True


def gemm_gated(x: np.ndarray, packed: PackedWeight, out: np.ndarray, bias: np.ndarray | None,
               act: int) -> bool:
    """out = act(gate) * up for x [..., k] and out [..., F] on a weight packed by pack_gated,
    where [gate | up] = x @ w + bias (float32, C-contiguous; bias laid out by gate_up_pairs,
    [2 ceil(F / 16) * 16], or None; act a nonzero c_snippets.ACT_CODES value). False, with nothing
    written, when the operands don't fit."""
    so = lib()
    if so is None or not packed.gated or not act or not _fits(x, packed, out, bias):
        return False
    m = x.size // packed.k
    if m:
        so.pg_gemm_gated(address(x), packed.k, address(packed.panels), address(out), m,
                         packed.n, packed.k, None if bias is None else address(bias), act,
                         address(_scratch(int(so.pg_scratch_floats()))), packed.out_cols,
                         _padded_x(m, packed.k))
    return True


def _fits(x: np.ndarray, packed: PackedWeight, out: np.ndarray, bias: np.ndarray | None
          ) -> bool:
    """x [..., k], out [..., out_cols] with as many rows, bias [n] or None: float32,
    C-contiguous."""
    if x.dtype != np.float32 or out.dtype != np.float32:
        return False
    if not x.flags.c_contiguous or not out.flags.c_contiguous:
        return False
    if x.ndim < 1 or x.shape[-1] != packed.k or out.shape[-1] != packed.out_cols:
        return False
    if out.size != x.size // packed.k * packed.out_cols:
        return False
    return bias is None or (bias.dtype == np.float32 and bias.shape == (packed.n,) and
                            bias.flags.c_contiguous)


_SCRATCH = threading.local()


PAD_X_FLOATS = 1 << 22  # 16 MiB: larger x keeps the copy per tile


def _scratch(floats: int, name: str = "buf") -> np.ndarray:
    """The calling thread's kernel scratch `name` (64-byte aligned, at least `floats` long),
    kept for its next call: two Python threads may run GEMMs at once, each with its own."""
    buf = getattr(_SCRATCH, name, None)
    if buf is None or buf.size < floats:
        buf = aligned_empty(floats, np.float32)
        setattr(_SCRATCH, name, buf)
    return buf


def _padded_x(m: int, k: int) -> int | None:
    """The address of the calling thread's buffer for x with padded rows (m rows of k + 16
    floats) when x's rows are a multiple of 4 KB apart and it takes at most PAD_X_FLOATS, else
    None (the kernel then copies x per tile)."""
    floats = m * (k + 16)
    if (k * 4) % 4096 or floats > PAD_X_FLOATS:
        return None
    return address(_scratch(floats, "padded_x"))
