"""argmax and top_k as C loops over x viewed as [outer, n, inner] (any axis, every numeric
dtype), bit-identical to the references. Floats are compared through an integer key of their
bits (sign-magnitude: -0 and +0 alike, NaN beyond the infinities), so the loops vectorize
without NaN semantics and float16 / bfloat16 need no conversion.

- argmax: the first maximum; any NaN wins, the first NaN (np.argmax). Along the last axis: the
  key maximum of each block of 128, then a scan of the first block holding the overall one
  (float32 / float64 rows of 256+ take np.argmax into the buffer: see _NUMPY_ARGMAX_MIN);
  along another axis: a block of up to 256 columns updated per step of the axis. (ArgMin has
  no op: importers write it as the argmax of an order-reversing map.)
- top_k: the reference's order, a stable sort from the largest (or the smallest): ties keep
  the lower index first and NaN ranks above +inf (first when largest, last when smallest), as
  in torch.topk and ONNX TopK. Per row, the keys become unsigned rank keys; a heap of the best
  k (k <= n / 16, or short rows: O(n log k)) or a stable LSD radix sort of the row (O(n) per
  key byte).

Compiled once per machine (exact_c.build); rows split across threads with OpenMP from
BRAZE_PAR_MIN elements."""
from __future__ import annotations

from functools import cache

import numpy as np

from ...ir.ops.indexing import TopK
from ...ir.ops.reduce import ArgMax
from ..address import address
from . import exact_c
from .exact_c import I64, INT, P
from .registry import Dispatch, Kernel, nbytes, register_kernel

__all__ = ["lib", "SELECT_DTYPES"]

SELECT_DTYPES = ("f32", "f64", "f16", "bf16", "i8", "i16", "i32", "i64", "u8", "u32", "bool")

# Floats compare as integers: a sign-magnitude key (+0 and -0 alike) orders them as values, and
# a key beyond the infinities' is NaN; integer compares vectorize, with no NaN semantics to keep.
# dtype -> (key type, its bits' type, magnitude mask, key of +inf)
_FLOAT_KEYS = {"f16": ("int32_t", "uint16_t", "0x7fff", "0x7c00"),
               "bf16": ("int32_t", "uint16_t", "0x7fff", "0x7f80"),
               "f32": ("int32_t", "uint32_t", "0x7fffffffu", "0x7f800000"),
               "f64": ("int64_t", "uint64_t", "0x7fffffffffffffffull", "0x7ff0000000000000ll")}
_INT_KEY = {"i8": "int32_t", "i16": "int32_t", "i32": "int32_t", "i64": "int64_t",
            "u8": "int32_t", "u32": "int64_t", "bool": "int32_t"}
_UNSIGNED_OF = {"int8_t": "uint8_t", "int16_t": "uint16_t", "int32_t": "uint32_t",
                "int64_t": "uint64_t"}

_ARGMAX = r"""
/* First index of the maximum of r[0, n) (the first NaN if any): the key maximum of each block
   of 128 (vectorized), the first block whose maximum beats the earlier ones, then a scan of that
   block alone. */
static int64_t argmax_row_$S(const $T* r, int64_t n) {
  $K m = KEY(r[0]);
  int64_t at = 0;
  int nan = 0;
  for (int64_t i0 = 0; i0 < n; i0 += 128) {
    int64_t w = n - i0 < 128 ? n - i0 : 128;
    $K bm = KEY(r[i0]);
    int bn = 0;
    if (w == 128) {
      #pragma omp simd reduction(max:bm) reduction(|:bn)
      for (int64_t j = 0; j < 128; j++) {
        $K k = KEY(r[i0 + j]);
        bm = k > bm ? k : bm;
        bn |= ISNAN(k);
      }
    } else {
      for (int64_t j = 0; j < w; j++) {
        $K k = KEY(r[i0 + j]);
        bm = k > bm ? k : bm;
        bn |= ISNAN(k);
      }
    }
    nan |= bn;
    if (bm > m) { m = bm; at = i0; }
  }
  if (nan) {
    for (int64_t i = 0; i < n; i++) { $K k = KEY(r[i]); if (ISNAN(k)) return i; }
  }
  for (int64_t i = at; i < n; i++) if (KEY(r[i]) == m) return i;
  return 0;
}

/* out[o, c] = argmax over k of x[o, k, c], x [outer, n, inner]. */
void argmax_$S(const $T* x, int64_t* out, int64_t outer, int64_t n, int64_t inner) {
  if (inner == 1) {
    #pragma omp parallel for schedule(static) if(BRAZE_PARALLEL(outer * n, BRAZE_PAR_MIN))
    for (int64_t o = 0; o < outer; o++) out[o] = argmax_row_$S(x + o * n, n);
    return;
  }
  int64_t blocks = (inner + 255) / 256;
  #pragma omp parallel for collapse(2) schedule(static) \
      if(BRAZE_PARALLEL(outer * n * inner, BRAZE_PAR_MIN))
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t b = 0; b < blocks; b++) {
      int64_t c0 = b * 256, w = inner - c0 < 256 ? inner - c0 : 256;
      const $T* base = x + o * n * inner + c0;
      $K bv[256]; int64_t bi[256];
      for (int64_t c = 0; c < w; c++) { bv[c] = KEY(base[c]); bi[c] = 0; }
      for (int64_t k = 1; k < n; k++) {
        const $T* r = base + k * inner;
        #pragma omp simd
        for (int64_t c = 0; c < w; c++) {
          $K v = KEY(r[c]);
          int up = !ISNAN(bv[c]) && (v > bv[c] || ISNAN(v));
          bv[c] = up ? v : bv[c];
          bi[c] = up ? k : bi[c];
        }
      }
      memcpy(out + o * inner + c0, bi, w * sizeof(int64_t));
    }
  }
}
"""

_TOP_K = r"""
/* The rank order: the lower key, then the lower index. */
static inline int before_$S(const $U* key, int64_t a, int64_t b) {
  return key[a] < key[b] || (key[a] == key[b] && a < b);
}

/* Sift h[i] down the heap h[0, m) whose root ranks last. */
static inline void sift_$S(const $U* key, int64_t* h, int64_t m, int64_t i) {
  for (;;) {
    int64_t l = 2 * i + 1, r = l + 1, w = i;
    if (l < m && before_$S(key, h[w], h[l])) w = l;
    if (r < m && before_$S(key, h[w], h[r])) w = r;
    if (w == i) return;
    int64_t t = h[i]; h[i] = h[w]; h[w] = t;
    i = w;
  }
}

/* The indices [0, n) in rank order, by a stable LSD radix sort of key over its bytes (ka, kb,
   ia, ib: n each; key is ka). Returns ia or ib, whichever holds the order. */
static int64_t* radix_$S($U* ka, $U* kb, int64_t* ia, int64_t* ib, int64_t n) {
  for (int64_t i = 0; i < n; i++) ia[i] = i;
  for (int shift = 0; shift < (int)(8 * sizeof($U)); shift += 8) {
    int64_t count[256] = {0};
    for (int64_t i = 0; i < n; i++) count[(ka[i] >> shift) & 255]++;
    if (count[(ka[0] >> shift) & 255] == n) continue;  /* one digit: the order stands */
    int64_t at = 0;
    for (int d = 0; d < 256; d++) { int64_t c = count[d]; count[d] = at; at += c; }
    for (int64_t i = 0; i < n; i++) {
      int64_t p = count[(ka[i] >> shift) & 255]++;
      kb[p] = ka[i];
      ib[p] = ia[i];
    }
    $U* tk = ka; ka = kb; kb = tk;
    int64_t* ti = ia; ia = ib; ib = ti;
  }
  return ia;
}

/* The k first-ranked elements along n of x [outer, n, inner], in rank order: values and
   indices [outer, k, inner]. A heap of the best k when k is small against n, else a radix
   sort of the row. Returns nonzero when scratch memory ran out. */
int top_k_$S(const $T* x, $T* vals, int64_t* idx, int64_t outer, int64_t n, int64_t inner,
             int64_t k, int largest) {
  if (k <= 0 || n <= 0) return 0;
  int heap = k * 16 <= n || n < 128;
  int fail = 0;
  #pragma omp parallel if(BRAZE_PARALLEL(outer * n * inner, BRAZE_PAR_MIN)) reduction(|:fail)
  {
    $U* ka = ($U*)malloc(2 * n * sizeof($U));
    int64_t* ia = (int64_t*)malloc(2 * n * sizeof(int64_t));
    if (!ka || !ia) fail = 1;
    #pragma omp for schedule(static)
    for (int64_t row = 0; row < outer * inner; row++) {
      if (!ka || !ia) continue;
      int64_t o = row / inner, c = row % inner;
      const $T* src = x + o * n * inner + c;
      if (largest) {
        for (int64_t i = 0; i < n; i++) ka[i] = UKEY_LARGEST(src[i * inner]);
      } else {
        for (int64_t i = 0; i < n; i++) ka[i] = UKEY_SMALLEST(src[i * inner]);
      }
      int64_t* h = ia;
      if (heap) {
        for (int64_t i = 0; i < k; i++) h[i] = i;
        for (int64_t i = k / 2 - 1; i >= 0; i--) sift_$S(ka, h, k, i);
        for (int64_t i = k; i < n; i++)
          if (before_$S(ka, i, h[0])) { h[0] = i; sift_$S(ka, h, k, 0); }
        for (int64_t e = k - 1; e > 0; e--) {
          int64_t t = h[0]; h[0] = h[e]; h[e] = t;
          sift_$S(ka, h, e, 0);
        }
      } else {
        h = radix_$S(ka, ka + n, ia, ia + n, n);
      }
      for (int64_t j = 0; j < k; j++) {
        idx[(o * k + j) * inner + c] = h[j];
        vals[(o * k + j) * inner + c] = src[h[j] * inner];
      }
    }
    free(ka); free(ia);
  }
  return fail;
}
"""


def _specialize(template: str, dtype: str, macros: dict[str, str], key: str,
                ukey: str) -> str:
    head = "".join(f"#define {m} {v}\n" for m, v in macros.items())
    tail = "".join(f"#undef {m.split('(')[0]}\n" for m in macros)
    body = template.replace("$S", dtype).replace("$T", exact_c.C_TYPE[dtype])
    return head + body.replace("$K", key).replace("$U", ukey) + tail


def _float_macros(dt: str) -> tuple[str, dict[str, str], str, str]:
    """(key function, macros, key type, rank key type) of a float dtype."""
    k, bits, mag, inf = _FLOAT_KEYS[dt]
    u = _UNSIGNED_OF[k]
    high = f"(({u})1 << {31 if k == 'int32_t' else 63})"
    fn = (f"static inline {k} key_{dt}({exact_c.C_TYPE[dt]} f) {{\n"
          f"  {bits} v; memcpy(&v, &f, sizeof v);\n"
          f"  return v & ~{mag} ? -({k})(v & {mag}) : ({k})(v & {mag});\n}}\n")
    macros = {"KEY(v)": f"key_{dt}(v)", "ISNAN(k)": f"((k) > {inf} || (k) < -{inf})",
              "UKEY_LARGEST(v)": f"(ISNAN(KEY(v)) ? ({u})0 : ({u})(-KEY(v)) ^ {high})",
              "UKEY_SMALLEST(v)": f"(ISNAN(KEY(v)) ? ({u})-1 : ({u})(KEY(v)) ^ {high})"}
    return fn, macros, k, u


def _int_macros(dt: str) -> tuple[dict[str, str], str, str]:
    """(macros, key type, rank key type) of an integer dtype."""
    t, k = exact_c.C_TYPE[dt], _INT_KEY[dt]
    macros = {"KEY(v)": f"(({k})(v))", "ISNAN(k)": "0"}
    if t in _UNSIGNED_OF:  # signed: ~x orders from the largest down, with no overflow
        wide = "int64_t" if t == "int64_t" else "int32_t"
        u = _UNSIGNED_OF[wide]
        high = f"(({u})1 << {63 if wide == 'int64_t' else 31})"
        macros["UKEY_LARGEST(v)"] = f"(({u})(~({wide})(v)) ^ {high})"
        macros["UKEY_SMALLEST(v)"] = f"(({u})({wide})(v) ^ {high})"
    else:  # unsigned: the reference sorts -x.astype(int64), i.e. MAX - x
        u = "uint32_t"
        macros["UKEY_LARGEST(v)"] = f"(({u})(({t})-1 - (v)))"
        macros["UKEY_SMALLEST(v)"] = f"(({u})(v))"
    return macros, k, u


def _source() -> str:
    parts = []
    for dt in SELECT_DTYPES:
        if dt in _FLOAT_KEYS:
            fn, macros, k, u = _float_macros(dt)
            parts.append(fn)
        else:
            macros, k, u = _int_macros(dt)
        parts.append(_specialize(_ARGMAX, dt, macros, k, u))
        if dt != "bool":
            parts.append(_specialize(_TOP_K, dt, macros, k, u))
    return "".join(parts)


@cache
def lib():
    """The compiled argmax / top_k library, or None without a C compiler."""
    sigs = {}
    for dt in SELECT_DTYPES:
        sigs[f"argmax_{dt}"] = [P, P, I64, I64, I64]
        if dt != "bool":
            sigs[f"top_k_{dt}"] = ([P, P, P, I64, I64, I64, I64, INT], INT)
    return exact_c.build(_source(), "braze_selection", sigs)


def _split(dims, ax: int) -> tuple[int, int, int]:
    """(outer, n, inner) of static dims around axis `ax`."""
    outer = int(np.prod(dims[:ax], dtype=np.int64))
    inner = int(np.prod(dims[ax + 1:], dtype=np.int64))
    return outer, int(dims[ax]), inner


def _c(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


_NUMPY_ARGMAX_MIN = 256
"""Rows of float32 / float64 at least this long take np.argmax (its AVX-512 loop, into the
output buffer): 1.1-1.3x the C kernel's speed on [1024, 1000] and [64, 16000] rows; shorter rows,
other dtypes and other axes take the C kernel (1.5-2.5x NumPy's speed on [8192, 50] rows,
3x on [1024, 1000] int8, 2.5-3x along axis 0), measured in one process."""


@register_kernel(ArgMax)
def argmax(node, ins, outs, ctx):
    (x,) = ins
    so = lib()
    if so is None or x.dtype.name not in SELECT_DTYPES or x.rank == 0:
        return None
    ax = node.op.axis % x.rank
    outer, n, inner = _split(x.dims, ax)
    if n == 0:
        return None
    cost = dict(bytes=nbytes(ins) + nbytes(outs), flops=x.numel() or 0)
    if inner == 1 and n >= _NUMPY_ARGMAX_MIN and x.dtype.name in ("f32", "f64"):
        keep = node.op.keepdims

        def run_numpy(xa, out):
            np.argmax(xa, axis=ax, out=out, keepdims=keep)

        return Kernel(run_numpy, Dispatch.NATIVE, "argmax (NumPy, into the buffer)", **cost)
    fn = getattr(so, f"argmax_{x.dtype.name}")

    def run(xa, out):
        xa = _c(xa)
        fn(address(xa), address(out), outer, n, inner)

    return Kernel(run, Dispatch.NATIVE, f"C argmax ({x.dtype.name})", **cost)


@register_kernel(TopK)
def top_k(node, ins, outs, ctx):
    (x,) = ins
    so = lib()
    if so is None or x.dtype.name not in SELECT_DTYPES or x.dtype.name == "bool":
        return None
    op = node.op
    ax = op.axis % x.rank
    outer, n, inner = _split(x.dims, ax)
    fn = getattr(so, f"top_k_{x.dtype.name}")
    k, largest = int(op.k), int(op.largest)

    def run(xa, vals, idx):
        xa = _c(xa)
        if fn(address(xa), address(vals), address(idx), outer, n, inner, k, largest):
            raise MemoryError(f"top_k at node {node.label}: no scratch memory for rows of {n}")

    how = "heap" if k * 16 <= n or n < 128 else "radix sort"
    return Kernel(run, Dispatch.NATIVE, f"C top_k ({x.dtype.name}, {how})",
                  bytes=nbytes(ins) + nbytes(outs),
                  flops=(x.numel() or 0) * max(1, int(np.log2(max(k, 2)))))
