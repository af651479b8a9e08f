"""braze's int8 GEMM on AVX512-VNNI dot products (`vpdpbusd`: u8 x s8 -> s32), for dynamic
int8 quantization of matmuls (DynamicQuantMatMul, passes/quant/).

- The weight comes quantized per output column, symmetric s8 with an f32 scale per column
  (passes/quant/weights.py), and is packed once into panels of 16 columns with quads of k
  interleaved per column (`[quad][column][4]`, one 64-byte vector per quad), K blocks of KC
  values outermost and the panels within, zero padded to a whole quad and a whole last panel;
  the column sums of the s8 values are kept for the activation's zero point.
- A call quantizes the operand per row (asymmetric u8, as ONNX's DynamicQuantizeLinear but
  per row: min and max of the row with 0 included, scale = (max - min) / 255, or 1 where that
  is 0, zero point zp = clamp(rint(-min / scale), 0, 255), q = clamp(rint(x / scale) + zp,
  0, 255); a row with a NaN or an infinity gets a NaN scale, so its outputs are NaN), into a
  scratch of rows padded to a whole quad. The divisions are IEEE divisions (the
  embedded-rounding forms, which -ffast-math leaves alone), as NumPy divides.
- The output is cut into tiles (up to MC rows x 4 panels) handed out dynamically over the
  OpenMP threads, as dpbf16_gemm.py cuts it; per tile and K block the micro-kernel
  (dot_micro.VNNI_MICRO, dpbf16_gemm's with `vpdpbusd`) accumulates s32 sums in the thread's
  scratch, exact (a u8 x s8 product and the sums of k < 33000 of them fit).
- The epilogue dequantizes each finished tile in registers: y = f32(acc - zp * colsum) *
  (row scale * column scale), then bias + activation (c_snippets' act16, or act_span for the
  tanh), into the f32 output.

Needs a CPU with AVX512-VNNI and a C compiler that targets it (`available()`)."""
from __future__ import annotations

import ctypes
import threading
from functools import cache

import numpy as np

from ...ir.ops.fused_quant import MAX_K
from ..address import address
from ..codegen import cc
from ..plan import aligned_empty
from . import c_snippets
from .dot_micro import VNNI_MICRO

__all__ = ["available", "Int8Weight", "gemm", "gemm_quantized", "quantize_rows",
           "scratch_bytes", "padded_k", "MAX_K"]

SOURCE = c_snippets.ACT_SPAN.join((r"""
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#include <immintrin.h>
""" + cc.simd_math_decls() + VNNI_MICRO, r"""
#define NR VNNI_NR
#define QP VNNI_QP   /* panels per tile */
#define MR VNNI_MR
#define KC 512  /* k values per K block: a block of a tile's 4 panels is 32 KiB */
#define MC 192  /* rows per tile at most */
#define LDC_T (QP * NR + 16)   /* the tile scratch's row stride (int32) */
#define SCRATCH_INTS (MC * LDC_T)   /* per thread */
#define NEAREST (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static inline int64_t up4(int64_t k) { return (k + 3) / 4 * 4; }

/* Where panel p's K block starting at k0 (a multiple of 4) starts in the packed weight
   (bytes): K blocks one after the other, the panels within, each [quads][NR][4]. */
static inline int64_t panel_at(int64_t p, int64_t k0, int64_t kp, int64_t panels) {
  int64_t kc = kp - k0 < KC ? kp - k0 : KC;
  return k0 * panels * NR + p * kc * NR;
}

int64_t i8_packed_bytes(int64_t k, int64_t n) { return up4(k) * ((n + NR - 1) / NR * NR); }

/* w [k, n] s8 -> the packed layout, zero padded. */
void i8_pack(const int8_t* w, int64_t k, int64_t n, int8_t* out) {
  int64_t kp = up4(k), panels = (n + NR - 1) / NR;
  #pragma omp parallel for collapse(2) schedule(static)
  for (int64_t k0 = 0; k0 < kp; k0 += KC)
    for (int64_t p = 0; p < panels; p++) {
      int64_t kc = kp - k0 < KC ? kp - k0 : KC;
      int8_t* dst = out + panel_at(p, k0, kp, panels);
      for (int64_t i = 0; i < kc / 4; i++)
        for (int64_t j = 0; j < NR; j++)
          for (int h = 0; h < 4; h++) {
            int64_t kk = k0 + 4 * i + h, col = p * NR + j;
            dst[(i * NR + j) * 4 + h] = kk < k && col < n ? w[kk * n + col] : 0;
          }
    }
}

#if defined(__AVX512VNNI__)
static inline __mmask16 lanes(int64_t left) {
  return left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
}

/* One row of k f32 values -> kp u8 values (zero past k), its scale and zero point (the module
   docstring's formulas). A row holding a NaN or an infinity gets a NaN scale (its zero point 0,
   its values 0): its products come out NaN, as a float matmul's would for a NaN and as the
   decomposition's do for an infinity (an infinite scale: 0 * inf). They are found from the
   bits: under -ffast-math the compares may take none to be there, vminps drops NaNs, and
   -min / scale = NaN for a -inf would become the zero point INT_MIN. */
static void quantize_row(const float* x, int64_t k, int64_t kp, uint8_t* q, float* scale,
                         int32_t* zp) {
  __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();   /* 0 included */
  __mmask16 nan = 0;
  const __m512i abs_bits = _mm512_set1_epi32(0x7fffffff);
  const __m512i inf_bits = _mm512_set1_epi32(0x7f800000);
  for (int64_t i = 0; i < k; i += 16) {
    __m512 v = _mm512_maskz_loadu_ps(lanes(k - i), x + i);
    lo = _mm512_min_ps(lo, v);
    hi = _mm512_max_ps(hi, v);
    nan |= _mm512_cmpge_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), abs_bits),
                                   inf_bits);
  }
  float mn = _mm512_reduce_min_ps(lo), mx = _mm512_reduce_max_ps(hi);
  float s = _mm_cvtss_f32(_mm_div_round_ss(_mm_set_ss(mx - mn), _mm_set_ss(255.0f), NEAREST));
  if (s == 0.0f) s = 1.0f;
  float z = _mm_cvtss_f32(_mm_roundscale_ss(_mm_setzero_ps(),
      _mm_div_round_ss(_mm_set_ss(-mn), _mm_set_ss(s), NEAREST), NEAREST));
  z = z < 0.0f ? 0.0f : z > 255.0f ? 255.0f : z;
  if (nan) {
    uint32_t bits = 0x7fc00000u;
    memcpy(&s, &bits, 4);
    z = 0.0f;
  }
  *scale = s;
  *zp = (int32_t)z;
  __m512 vs = _mm512_set1_ps(s), vz = _mm512_set1_ps(z);
  for (int64_t i = 0; i < k; i += 16) {
    __mmask16 m = lanes(k - i);
    __m512 r = _mm512_roundscale_ps(
        _mm512_div_round_ps(_mm512_maskz_loadu_ps(m, x + i), vs, NEAREST), NEAREST);
    r = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(r, vz), _mm512_setzero_ps()),
                      _mm512_set1_ps(255.0f));
    _mm512_mask_cvtepi32_storeu_epi8(q + i, m, _mm512_cvtps_epi32(r));
  }
  for (int64_t i = k; i < kp; i++) q[i] = 0;
}
#endif

/* Rows of a (m x k f32, rows lda apart) quantized into q (rows kp apart), scales, zps. */
void i8_quantize_rows(const float* a, int64_t lda, int64_t m, int64_t k, uint8_t* q,
                      int64_t kp, float* scales, int32_t* zps) {
#if defined(__AVX512VNNI__)
  #pragma omp parallel for schedule(static) if(m * k > (1 << 16))
  for (int64_t r = 0; r < m; r++)
    quantize_row(a + r * lda, k, kp, q + r * kp, scales + r, zps + r);
#endif
}

#if defined(__AVX512VNNI__)
/* A tile's s32 sums (ct, row stride LDC_T, `cols` valid columns) to out (rows ldo apart):
   raw, the sums as they are (int32 out); else dequantized with the rows' scales rs and zero
   points rz and the columns' sums and scales, then bias + act (f32 out). */
static void epilogue(int32_t* ct, int64_t rows, int64_t cols, const float* rs,
                     const int32_t* rz, const int32_t* colsum, const float* wscale,
                     const float* bias, int act, int raw, void* out, int64_t ldo) {
  for (int64_t i = 0; i < rows; i++) {
    int32_t* t = ct + i * LDC_T;
    if (raw) {
      memcpy((int32_t*)out + i * ldo, t, cols * sizeof(int32_t));
      continue;
    }
    float* o = (float*)out + i * ldo;
    float* tf = (float*)t;   /* in place, for act_span's activations */
    __m512 sa = _mm512_set1_ps(rs[i]);
    __m512i za = _mm512_set1_epi32(rz[i]);
    for (int64_t c = 0; c < cols; c += NR) {
      __mmask16 m = lanes(cols - c);
      __m512i corr = _mm512_mullo_epi32(za, _mm512_maskz_loadu_epi32(m, colsum + c));
      __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(t + c), corr));
      v = _mm512_mul_ps(v, _mm512_mul_ps(sa, _mm512_maskz_loadu_ps(m, wscale + c)));
      if (!ACT16_OK(act)) { _mm512_storeu_ps(tf + c, v); continue; }
      if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + c));
      _mm512_mask_storeu_ps(o + c, m, act16(v, act));
    }
    if (!ACT16_OK(act)) act_span(tf, bias, o, cols, act);
  }
}
#endif

/* out[m, n] = act(dequant(u8(a) @ B) + bias) (bias may be NULL). a: f32 rows lda apart,
   quantized here into q (m rows of kp = up4(k) bytes) with their scales and zero points
   (scales, zps: m each), or (given 1) already in q / scales / zps. raw 1: out is int32 and
   gets the s32 sums. bp: i8_pack's layout; colsum, wscale: n each. scratch:
   i8_scratch_ints() int32. */
void i8_gemm(const float* a, int64_t lda, int given, uint8_t* q, float* scales, int32_t* zps,
             const int8_t* bp, const int32_t* colsum, const float* wscale, void* out, int raw,
             int64_t m, int64_t n, int64_t k, const float* bias, int act, int32_t* scratch) {
#if defined(__AVX512VNNI__)
  int64_t kp = up4(k), panels = (n + NR - 1) / NR;
  int64_t units = (panels + QP - 1) / QP;
  int64_t rblocks = (m + MC - 1) / MC;
  int64_t rb = ((m + rblocks - 1) / rblocks + MR - 1) / MR * MR;   /* whole micro blocks */
  rblocks = (m + rb - 1) / rb;
  int64_t tiles = rblocks * units;
  #pragma omp parallel if(tiles > 1 && m * n * k > (1 << 18))
  {
    int32_t* ct = scratch + (int64_t)omp_get_thread_num() * SCRATCH_INTS;
    if (!given) {
      #pragma omp for schedule(static)
      for (int64_t r = 0; r < m; r++)
        quantize_row(a + r * lda, k, kp, q + r * kp, scales + r, zps + r);
    }
    #pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tiles; t++) {
      int64_t u = t % units, r0 = t / units * rb;
      int64_t p0 = u * QP, nq = panels - p0 < QP ? panels - p0 : QP;
      int64_t rows = m - r0 < rb ? m - r0 : rb;
      int64_t blocks = (rows + MR - 1) / MR;
      for (int64_t k0 = 0; k0 < kp; k0 += KC) {
        int64_t kc = kp - k0 < KC ? kp - k0 : KC;
        const int8_t* b = bp + panel_at(p0, k0, kp, panels);
        for (int64_t blk = 0; blk < blocks; blk++) {   /* balanced heights, as dp_gemm */
          int64_t i0 = blk * rows / blocks;
          int h = (int)((blk + 1) * rows / blocks - i0);
          vnni_micro(h, (int)nq, kc / 4, q + (r0 + i0) * kp + k0, kp, b, kc * NR,
                     ct + i0 * LDC_T, LDC_T, k0 > 0);
        }
      }
      int64_t j0 = p0 * NR, cols = n - j0 < nq * NR ? n - j0 : nq * NR;
      void* o = raw ? (void*)((int32_t*)out + r0 * n + j0) : (void*)((float*)out + r0 * n + j0);
      epilogue(ct, rows, cols, scales + r0, zps + r0, colsum + j0, wscale + j0,
               bias ? bias + j0 : 0, act, raw, o, n);
    }
  }
#endif
}

int64_t i8_scratch_ints(void) { return (int64_t)SCRATCH_INTS * omp_get_max_threads(); }

int i8_compiled(void) {
#if defined(__AVX512VNNI__)
  return 1;
#else
  return 0;
#endif
}
"""))

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {
    "i8_packed_bytes": ([_I64, _I64], _I64),
    "i8_pack": [_P, _I64, _I64, _P],
    "i8_quantize_rows": [_P, _I64, _I64, _I64, _P, _I64, _P, _P],
    "i8_gemm": [_P, _I64, _INT, _P, _P, _P, _P, _P, _P, _P, _INT, _I64, _I64, _I64, _P, _INT,
                _P],
    "i8_scratch_ints": ([], _I64),
    "i8_compiled": ([], _INT),
}


@cache
def _lib():
    if "avx512_vnni" not in cc.cpu_flags():
        return None
    so = cc.load_library(SOURCE, "braze_int8_gemm", _SIGNATURES)
    return so if so is not None and so.i8_compiled() else None


def available() -> bool:
    """Whether braze's AVX512-VNNI int8 GEMM runs here."""
    return _lib() is not None


def padded_k(k: int) -> int:
    """k rounded up to a whole quad: the row stride of the quantized operand."""
    return (max(k, 1) + 3) // 4 * 4


def _rows_bytes(rows: int, k: int) -> int:
    return (max(rows, 1) * padded_k(k) + 63) // 64 * 64


def scratch_bytes(rows: int, k: int) -> int:
    """uint8 elements of the scratch a `rows` x `k` call needs: the quantized rows, then
    each row's scale (f32) and zero point (int32)."""
    return _rows_bytes(rows, k) + 8 * max(rows, 1)


class Int8Weight:
    """A [K, N] s8 weight with an f32 scale per column (the value is q * scale), packed once
    for the kernel, with its column sums."""

    def __init__(self, q: np.ndarray, scale: np.ndarray):
        q = np.ascontiguousarray(q, np.int8)
        self.k, self.n = (int(d) for d in q.shape)
        self.scale = np.ascontiguousarray(np.broadcast_to(scale, (self.n,)), np.float32)
        self.colsum = np.ascontiguousarray(q.sum(axis=0, dtype=np.int32))
        self.packed = aligned_empty(int(_lib().i8_packed_bytes(self.k, self.n)), np.int8)
        _lib().i8_pack(address(q), self.k, self.n, address(self.packed))


_SCRATCH = threading.local()


def _tile_scratch() -> np.ndarray:
    """The calling thread's tile scratch (int32, a slice per OpenMP thread), kept for its
    next call."""
    ints = int(_lib().i8_scratch_ints())
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.size < ints:
        buf = _SCRATCH.buf = aligned_empty(ints, np.int32)
    return buf


def _split(scratch: np.ndarray, rows: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The scratch's quantized rows [rows, padded_k], scales [rows] and zero points [rows]."""
    kp, at = padded_k(k), _rows_bytes(rows, k)
    q = scratch[:rows * kp].reshape(rows, kp)
    return q, scratch[at:at + 4 * rows].view(np.float32), \
        scratch[at + 4 * rows:at + 8 * rows].view(np.int32)


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernel's quantization of x [rows, k] f32: (u8 [rows, padded_k(k)] zero padded,
    scales f32 [rows], zero points int32 [rows])."""
    x = np.ascontiguousarray(x, np.float32)
    rows, k = x.shape
    scratch = aligned_empty(scratch_bytes(rows, k), np.uint8)
    q, s, z = _split(scratch, rows, k)
    if rows:
        _lib().i8_quantize_rows(address(x), k, rows, k, address(q), padded_k(k), address(s),
                                address(z))
    return q, s, z


def _fits(x: np.ndarray, w: Int8Weight, out: np.ndarray, bias: np.ndarray | None,
          scratch: np.ndarray) -> bool:
    k = x.shape[-1] if x.ndim else 0
    if x.ndim < 1 or k != w.k or k > MAX_K or x.dtype != np.float32 or \
            not x.flags.c_contiguous or out.dtype != np.float32 or \
            not out.flags.c_contiguous or out.shape[-1] != w.n:
        return False
    rows = x.size // max(k, 1)
    if out.size != rows * w.n or scratch.dtype != np.uint8 or \
            scratch.size < scratch_bytes(rows, k):
        return False
    return bias is None or (bias.dtype == np.float32 and bias.shape == (w.n,)
                            and bias.flags.c_contiguous)


def gemm(x: np.ndarray, w: Int8Weight, out: np.ndarray, bias: np.ndarray | None, act: int,
         scratch: np.ndarray) -> bool:
    """out = act(x @ w + bias), x [..., K] f32 (C-contiguous) quantized per row to u8 on the
    way in, against the s8 weight, dequantized in the epilogue; out [..., N] f32; bias [N]
    contiguous f32 or None; act a c_snippets.ACT_CODES code; scratch uint8 of at least
    scratch_bytes(rows, K). False, with nothing written, when the operands don't fit."""
    if not _fits(x, w, out, bias, scratch):
        return False
    rows = x.size // max(w.k, 1)
    if rows:
        q, s, z = _split(scratch, rows, w.k)
        _lib().i8_gemm(address(x), w.k, 0, address(q), address(s), address(z),
                       address(w.packed), address(w.colsum), address(w.scale), address(out), 0,
                       rows, w.n, w.k, None if bias is None else address(bias), act,
                       address(_tile_scratch()))
    return True


def gemm_quantized(q: np.ndarray, scales: np.ndarray, zps: np.ndarray, w: Int8Weight,
                   out: np.ndarray, bias: np.ndarray | None = None, act: int = 0) -> None:
    """The GEMM from rows quantized already (quantize_rows' three arrays): out int32 [rows,
    N] gets the s32 sums as they are; out f32 the dequantized result + bias, act."""
    rows = q.shape[0]
    ok = q.dtype == np.uint8 and q.shape[1] == padded_k(w.k) and q.flags.c_contiguous and \
        scales.dtype == np.float32 and zps.dtype == np.int32 and \
        scales.shape == zps.shape == (rows,) and out.shape == (rows, w.n) and \
        out.flags.c_contiguous and out.dtype in (np.int32, np.float32) and \
        (bias is None or (bias.dtype == np.float32 and bias.shape == (w.n,)))
    if not ok:
        raise ValueError(f"int8 GEMM of quantized rows: q {q.dtype}{q.shape}, scales "
                         f"{scales.shape}, zero points {zps.shape}, out {out.dtype}{out.shape} "
                         f"do not fit the weight [{w.k}, {w.n}] (quantize_rows makes them)")
    if rows:
        _lib().i8_gemm(None, 0, 1, address(q), address(scales), address(zps),
                       address(w.packed), address(w.colsum), address(w.scale), address(out),
                       out.dtype == np.int32, rows, w.n, w.k,
                       None if bias is None else address(bias), act,
                       address(_tile_scratch()))
