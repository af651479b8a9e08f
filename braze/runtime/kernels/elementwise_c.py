"""C element-wise kernels for the dtypes basic.py leaves to the reference, bit-identical to it:

- float16 / bfloat16 add, sub, mul, div, max, min with NumPy broadcasting: each element is
  widened to float32, combined, and rounded once to the half type (nearest even), which is
  what NumPy's float16 loops and ml_dtypes' bfloat16 loops do (float32 holds 2p + 2 bits of
  both, so this single rounding is the correctly rounded result). max / min return one operand
  as the reference does: the second of equal operands (`a > b`; +0 against -0), as NumPy's
  float32 loop (the reference makes float16 follow it; NumPy's float16 loop keeps the first);
  a NaN operand wins, the first one if both. A NaN result is NaN where the reference's is, but
  its sign and payload may differ (which NaN operand the CPU propagates in a + b and a * b;
  ml_dtypes makes bfloat16 NaN canonical): the tests compare NaN positions, other bits exactly.
  pow / mod / fmod in half precision run the reference.
- neg / abs of float16 / bfloat16: the sign bit flipped / cleared, as NumPy and ml_dtypes do
  (ArgMin imported from ONNX or PyTorch is the argmax of a neg).
- clamp of float16 / bfloat16: x where it is in range (NaN and signed zeros kept), else the
  bound the reference gives (computed once by running the reference on -inf / +inf).
- clamp of integer dtypes: the reference clips in float64 and truncates; for dtypes of up to
  32 bits that is an integer clip to [trunc(lo), trunc(hi)], for int64 the kernel rounds
  through float64 as the reference does (values beyond 2^53 round). A bound that would be
  selected but lies outside the dtype (the reference's cast is then undefined) runs the
  reference.

Inputs broadcast onto the output with stride 0: dims are merged where every operand walks
them alike, the innermost dim is the vector loop (both operands stride 1, or one stride 0),
and the work splits across threads in chunks of 8192 elements from BRAZE_PAR_MIN."""
from __future__ import annotations

import ctypes
import math
from functools import cache

import numpy as np

from ...ir.ops.elementwise import Binary, BinaryFn, Clamp, Unary, UnaryFn
from ..address import address
from . import exact_c
from .exact_c import F64, I64, INT, P
from .registry import Dispatch, Kernel, nbytes, register_kernel

__all__ = ["lib", "merged_strides"]

_OPS = {BinaryFn.ADD: 0, BinaryFn.SUB: 1, BinaryFn.MUL: 2, BinaryFn.DIV: 3, BinaryFn.MAX: 4,
        BinaryFn.MIN: 5, BinaryFn.POW: 6, BinaryFn.FMOD: 7, BinaryFn.MOD: 8}
_HALF = {"f16": 0, "bf16": 1}
_INT_CLAMP = ("i8", "i16", "i32", "i64", "u8", "u32")
_MAX_DIMS = 8

_BINARY = r"""
/* NumPy's float remainder (npy_divmodf): fmod moved to the divisor's sign, a zero remainder
   signed as the divisor. */
static inline float py_modf(float a, float b) {
  float m = fmodf(a, b);
  if (b == 0) return m;
  if (m != 0) return ((b < 0) != (m < 0)) ? m + b : m;
  return copysignf(0.0f, b);
}

/* The float16 (fmt 0) / bfloat16 (fmt 1) result of a op b, from the operands' bits. */
#define HALF_OP(NAME, LD, ST)                                                              \
static inline uint16_t NAME(uint16_t ha, uint16_t hb, int op) {                            \
  float a = LD(ha), b = LD(hb);                                                            \
  switch (op) {                                                                            \
    case 0: return ST(a + b);                                                              \
    case 1: return ST(a - b);                                                              \
    case 2: return ST(a * b);                                                              \
    case 3: return ST(a / b);                                                              \
    case 4: return (a != a || a > b) ? ha : hb;                                            \
    case 5: return (a != a || a < b) ? ha : hb;                                            \
    case 6: return ST(powf(a, b));                                                         \
    case 7: return ST(fmodf(a, b));                                                        \
    default: return ST(py_modf(a, b));                                                     \
  }                                                                                        \
}
HALF_OP(f16_op, f16_load, f16_store)
HALF_OP(bf16_op, bf16_load, bf16_store)

/* o[i] = a[i * sa] op b[i * sb] for i < w; the op and format are loop-invariant, so each
   instance below is one vector loop. */
#define SPAN(FN, OP)                                                                         \
  if (sa == 1 && sb == 1) { _Pragma("omp simd") for (int64_t i = 0; i < w; i++)            \
      o[i] = FN(a[i], b[i], OP); }                                                         \
  else if (sa == 1 && sb == 0) { uint16_t bv = b[0]; _Pragma("omp simd")                   \
      for (int64_t i = 0; i < w; i++) o[i] = FN(a[i], bv, OP); }                           \
  else if (sa == 0 && sb == 1) { uint16_t av = a[0]; _Pragma("omp simd")                   \
      for (int64_t i = 0; i < w; i++) o[i] = FN(av, b[i], OP); }                           \
  else { for (int64_t i = 0; i < w; i++) o[i] = FN(a[i * sa], b[i * sb], OP); }

static void span(const uint16_t* a, int64_t sa, const uint16_t* b, int64_t sb, uint16_t* o,
                 int64_t w, int op, int fmt) {
  if (fmt == 0) {
    switch (op) {
      case 0: SPAN(f16_op, 0) break;
      case 1: SPAN(f16_op, 1) break;
      case 2: SPAN(f16_op, 2) break;
      case 3: SPAN(f16_op, 3) break;
      case 4: SPAN(f16_op, 4) break;
      case 5: SPAN(f16_op, 5) break;
      case 6: SPAN(f16_op, 6) break;
      case 7: SPAN(f16_op, 7) break;
      default: SPAN(f16_op, 8) break;
    }
  } else {
    switch (op) {
      case 0: SPAN(bf16_op, 0) break;
      case 1: SPAN(bf16_op, 1) break;
      case 2: SPAN(bf16_op, 2) break;
      case 3: SPAN(bf16_op, 3) break;
      case 4: SPAN(bf16_op, 4) break;
      case 5: SPAN(bf16_op, 5) break;
      case 6: SPAN(bf16_op, 6) break;
      case 7: SPAN(bf16_op, 7) break;
      default: SPAN(bf16_op, 8) break;
    }
  }
}

#define CHUNK 8192
/* out [dims[0], ..., dims[nd - 1]] = a op b, operands read at element strides sa / sb (0 on
   broadcast dims); nd >= 1, the last dim is the vector loop. */
void half_binary(const uint16_t* a, const uint16_t* b, uint16_t* out, int nd,
                 const int64_t* dims, const int64_t* sa, const int64_t* sb, int op, int fmt) {
  int64_t inner = dims[nd - 1], rows = 1;
  for (int d = 0; d < nd - 1; d++) rows *= dims[d];
  int64_t per_row = (inner + CHUNK - 1) / CHUNK;
  int64_t units = rows * per_row;
  #pragma omp parallel for schedule(static) \
      if(BRAZE_PARALLEL(rows * inner, BRAZE_PAR_MIN))
  for (int64_t u = 0; u < units; u++) {
    int64_t row = u / per_row, c0 = (u % per_row) * CHUNK;
    int64_t w = inner - c0 < CHUNK ? inner - c0 : CHUNK;
    int64_t oa = 0, ob = 0, r = row;
    for (int d = nd - 2; d >= 0; d--) {
      int64_t i = r % dims[d];
      r /= dims[d];
      oa += i * sa[d];
      ob += i * sb[d];
    }
    span(a + oa + c0 * sa[nd - 1], sa[nd - 1], b + ob + c0 * sb[nd - 1], sb[nd - 1],
         out + row * inner + c0, w, op, fmt);
  }
}

/* y = (x & keep) ^ flip: float16 / bfloat16 neg (flip the sign) and abs (clear it), bit
   operations in NumPy and ml_dtypes too. */
void half_sign(const uint16_t* x, uint16_t* y, int64_t n, uint16_t keep, uint16_t flip) {
  #pragma omp parallel for schedule(static) if(BRAZE_PARALLEL(n, BRAZE_PAR_MIN))
  for (int64_t c0 = 0; c0 < n; c0 += CHUNK) {
    int64_t w = n - c0 < CHUNK ? n - c0 : CHUNK;
    #pragma omp simd
    for (int64_t i = 0; i < w; i++) y[c0 + i] = (uint16_t)((x[c0 + i] & keep) ^ flip);
  }
}

/* Clamps compare floats as integers: the sign-magnitude key of the bits (+0 and -0 alike)
   orders them as values (a float16 key is its 15 magnitude bits, a bfloat16's those shifted to
   float32's place); a magnitude beyond inf's is NaN, kept. Branch-free, so it vectorizes. */

/* y = x where klo <= key(x) <= khi (or NaN), else the bound's bits lo_h / hi_h. */
void half_clamp(const uint16_t* x, uint16_t* y, int64_t n, int32_t klo, int32_t khi,
                uint16_t lo_h, uint16_t hi_h, int fmt) {
  int shift = fmt ? 16 : 0;
  int32_t inf = fmt ? 0x7f800000 : 0x7c00;
  #pragma omp parallel for schedule(static) if(BRAZE_PARALLEL(n, BRAZE_PAR_MIN))
  for (int64_t c0 = 0; c0 < n; c0 += CHUNK) {
    int64_t w = n - c0 < CHUNK ? n - c0 : CHUNK;
    const uint16_t* s = x + c0;
    uint16_t* d = y + c0;
    #pragma omp simd
    for (int64_t i = 0; i < w; i++) {
      uint16_t h = s[i];
      int32_t m = (int32_t)(h & 0x7fff) << shift;
      int32_t k = h & 0x8000 ? -m : m;
      d[i] = m > inf ? h : (k < klo ? lo_h : (k > khi ? hi_h : h));
    }
  }
}

/* y = min(max(x, lo), hi) in x's integer type (lo <= hi, both in its range). */
#define INT_CLAMP(NAME, T)                                                                   \
void NAME(const T* x, T* y, int64_t n, int64_t lo64, int64_t hi64) {                       \
  T lo = (T)lo64, hi = (T)hi64;                                                            \
  _Pragma("omp parallel for schedule(static) if(BRAZE_PARALLEL(n, BRAZE_PAR_MIN))")        \
  for (int64_t c0 = 0; c0 < n; c0 += CHUNK) {                                              \
    int64_t w = n - c0 < CHUNK ? n - c0 : CHUNK;                                           \
    const T* s = x + c0;                                                                   \
    T* d = y + c0;                                                                         \
    _Pragma("omp simd")                                                                    \
    for (int64_t i = 0; i < w; i++) {                                                      \
      T v = s[i];                                                                          \
      v = v < lo ? lo : v;                                                                 \
      d[i] = v > hi ? hi : v;                                                              \
    }                                                                                      \
  }                                                                                        \
}
INT_CLAMP(clamp_i8, int8_t)
INT_CLAMP(clamp_i16, int16_t)
INT_CLAMP(clamp_i32, int32_t)
INT_CLAMP(clamp_i64, int64_t)
INT_CLAMP(clamp_u8, uint8_t)
INT_CLAMP(clamp_u32, uint32_t)

/* The reference's int64 clamp: through float64, truncated back. */
void clamp_i64_f64(const int64_t* x, int64_t* y, int64_t n, double lo, double hi) {
  #pragma omp parallel for schedule(static) if(BRAZE_PARALLEL(n, BRAZE_PAR_MIN))
  for (int64_t c0 = 0; c0 < n; c0 += CHUNK) {
    int64_t w = n - c0 < CHUNK ? n - c0 : CHUNK;
    const int64_t* s = x + c0;
    int64_t* d = y + c0;
    #pragma omp simd
    for (int64_t i = 0; i < w; i++) {
      double v = (double)s[i];
      v = v < lo ? lo : v;
      d[i] = (int64_t)(v > hi ? hi : v);
    }
  }
}
"""

_SIGNATURES = {
    "half_binary": [P, P, P, INT, P, P, P, INT, INT],
    "half_clamp": [P, P, I64, ctypes.c_int32, ctypes.c_int32, ctypes.c_uint16, ctypes.c_uint16,
                   INT],
    "clamp_i64_f64": [P, P, I64, F64, F64],
    "half_sign": [P, P, I64, ctypes.c_uint16, ctypes.c_uint16],
    **{f"clamp_{t}": [P, P, I64, I64, I64] for t in _INT_CLAMP},
}


@cache
def lib():
    """The compiled element-wise library, or None without a C compiler."""
    return exact_c.build(_BINARY, "braze_elementwise_c", _SIGNATURES)


def _c(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def merged_strides(out_dims, *operand_dims) -> tuple[list[int], list[list[int]]]:
    """(dims, per operand element strides) of operands broadcast onto `out_dims`, adjacent dims
    merged where every operand walks them contiguously (or not at all); at least one dim."""
    rank = len(out_dims)
    strides = []
    for dims in operand_dims:
        dims = (1,) * (rank - len(dims)) + tuple(dims)
        st, acc = [0] * rank, 1
        for d in range(rank - 1, -1, -1):
            st[d] = 0 if dims[d] == 1 and out_dims[d] != 1 else acc
            acc *= dims[d]
        strides.append(st)
    keep = [d for d in range(rank) if out_dims[d] != 1]
    dims = [int(out_dims[d]) for d in keep] or [1]
    strides = [[s[d] for d in keep] or [0] for s in strides]
    merged, mstr = [dims[0]], [[s[0]] for s in strides]
    for i in range(1, len(dims)):
        if all(s[i - 1] == s[i] * dims[i] for s in strides):
            merged[-1] *= dims[i]
            for m, s in zip(mstr, strides, strict=True):
                m[-1] = s[i]
        else:
            merged.append(dims[i])
            for m, s in zip(mstr, strides, strict=True):
                m.append(s[i])
    return merged, mstr


@register_kernel(Binary)
def half_binary(node, ins, outs, ctx):
    a, b = ins
    fmt, op = _HALF.get(a.dtype.name), _OPS.get(node.op.fn)
    if fmt is None or op is None:
        return None  # checked first: float32 models never build this library
    so = lib()
    if so is None:
        return None
    dims, (sa, sb) = merged_strides(outs[0].dims, a.dims, b.dims)
    if len(dims) > _MAX_DIMS:
        return None
    arrays = [np.asarray(v, np.int64) for v in (dims, sa, sb)]  # alive as long as the kernel
    nd, (pd, pa, pb) = len(dims), (address(v) for v in arrays)

    def run(x, y, out):
        x, y = _c(x), _c(y)
        so.half_binary(address(x), address(y), address(out), nd, pd, pa, pb, op, fmt)

    run.arrays = arrays
    return Kernel(run, Dispatch.NATIVE, f"C {node.op.fn.value} ({a.dtype.name})",
                  inplace=tuple(i for i, s in enumerate(ins) if s.dims == outs[0].dims),
                  bytes=nbytes(ins) + nbytes(outs), flops=outs[0].numel() or 0)


_SIGN_MASKS = {UnaryFn.NEG: (0xFFFF, 0x8000), UnaryFn.ABS: (0x7FFF, 0)}


@register_kernel(Unary)
def half_sign(node, ins, outs, ctx):
    """neg / abs of float16 / bfloat16: the sign bit flipped or cleared (NaN included)."""
    masks = _SIGN_MASKS.get(node.op.fn)
    if masks is None or ins[0].dtype.name not in _HALF:
        return None
    so = lib()
    if so is None:
        return None
    n = ins[0].numel() or 0

    def run(xa, out):
        xa = _c(xa)
        so.half_sign(address(xa), address(out), n, *masks)

    return Kernel(run, Dispatch.NATIVE, f"C {node.op.fn.value} ({ins[0].dtype.name})",
                  inplace=(0,), bytes=nbytes(ins) + nbytes(outs), flops=n)


def _bound_bits(node, dtype: np.dtype) -> tuple[int, int]:
    """The reference's result for an element below and above every bound, as raw bits."""
    edge = np.array([-np.inf, np.inf], np.float32).astype(dtype)
    return tuple(int(v) for v in np.asarray(node.op.reference(edge)).view(np.uint16))


def _key(bits: int, width: int) -> int:
    """The sign-magnitude order key of a float's bits (the C clamp's)."""
    magnitude = bits & ((1 << (width - 1)) - 1)
    return -magnitude if bits >> (width - 1) else magnitude


@register_kernel(Clamp)
def clamp_c(node, ins, outs, ctx):
    (x,) = ins
    name = x.dtype.name
    if not (name in _HALF or name in _INT_CLAMP):
        return None
    so = lib()
    if so is None:
        return None
    lo, hi = node.op.lo, node.op.hi
    n = x.numel() or 0
    cost = dict(inplace=(0,), bytes=nbytes(ins) + nbytes(outs), flops=n)
    if name in _HALF:
        lo_h, hi_h = _bound_bits(node, x.dtype.np)
        # float16 compares with the bounds rounded to float16 (NumPy's weak Python floats);
        # bfloat16 clips in float32 (ml_dtypes has no clip loop: NumPy casts up)
        if name == "f16":
            k_lo, k_hi = _key(lo_h, 16), _key(hi_h, 16)
        else:
            k_lo, k_hi = (_key(int(np.float32(v).view(np.uint32)), 32) for v in (lo, hi))
        fmt = _HALF[name]

        def run_half(xa, out):
            xa = _c(xa)
            so.half_clamp(address(xa), address(out), n, k_lo, k_hi, lo_h, hi_h, fmt)

        return Kernel(run_half, Dispatch.NATIVE, f"C clamp ({name})", **cost)
    if lo == math.inf or hi == -math.inf:
        return None  # the selected bound is outside every integer type
    info = np.iinfo(x.dtype.np)
    exact = isinstance(lo, int) and isinstance(hi, int)  # np.clip stays in the integer type
    if name == "i64" and not exact:
        if lo >= 2.0 ** 63 or hi < -2.0 ** 63:
            return None

        def run_f64(xa, out):
            xa = _c(xa)
            so.clamp_i64_f64(address(xa), address(out), n, float(lo), float(hi))

        return Kernel(run_f64, Dispatch.NATIVE, "C clamp (i64 through f64)", **cost)
    t_lo = int(info.min) if lo == -math.inf else math.trunc(lo)
    t_hi = int(info.max) if hi == math.inf else math.trunc(hi)
    if t_lo > info.max or t_hi < info.min:
        return None  # every element becomes an out-of-range bound: the reference's cast
    fn = getattr(so, f"clamp_{name}")
    c_lo, c_hi = max(t_lo, int(info.min)), min(t_hi, int(info.max))

    def run_int(xa, out):
        xa = _c(xa)
        fn(address(xa), address(out), n, c_lo, c_hi)

    return Kernel(run_int, Dispatch.NATIVE, f"C clamp ({name})", **cost)
