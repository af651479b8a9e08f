"""C kernels for quantize and dequantize, bit-identical to their references (braze/ir/ops/quant.py).

A tensor is viewed as `[outer, C, inner]` around the op's axis (C = 1 per tensor), so one loop
serves both forms. Quantize divides in float32 (float64 for float64 x) with IEEE division,
rounds with `rint` (half to even in the default rounding mode), adds the zero point, and
saturates, NaN going to the dtype's minimum; float32 holds `rint(x / s) + zp` exactly wherever
the result is in range. Dequantize subtracts the zero point in integers, converts once to
float32 (float64) and multiplies by the scale, rounding once to a half-precision scale's type.
Rows split into chunks of 8192 elements that run across threads from BRAZE_PAR_MIN."""
from __future__ import annotations

from functools import cache

import numpy as np

from ...ir.dtypes import dtype_from_name
from ...ir.ops.quant import Dequantize, Quantize, quant_range
from ..address import address
from . import exact_c
from .exact_c import I64, P
from .registry import Dispatch, Kernel, nbytes, register_kernel

# dtype name -> (C storage type, compute type, load to compute, store from compute)
_FLOATS = {"f32": ("float", "float", "", ""), "f64": ("double", "double", "", ""),
           "f16": ("uint16_t", "float", "f16_load", "f16_store"),
           "bf16": ("uint16_t", "float", "bf16_load", "bf16_store")}
_QUANT = ("i8", "u8")
_DEQUANT = ("i8", "u8", "i32")

_LOOP = r"""
#define CHUNK 8192
/* Calls BODY(o * C + c, i0, w): chunk [i0, i0 + w) of row (o, c), across threads. */
#define ROWS(BODY)                                                                           \
  int64_t per_row = (inner + CHUNK - 1) / CHUNK;                                             \
  int64_t units = outer * C * per_row, n = outer * C * inner;                                \
  _Pragma("omp parallel for schedule(static) if(BRAZE_PARALLEL(n, BRAZE_PAR_MIN))")          \
  for (int64_t u = 0; u < units; u++) {                                                      \
    int64_t row = u / per_row, i0 = (u % per_row) * CHUNK;                                   \
    int64_t w = inner - i0 < CHUNK ? inner - i0 : CHUNK;                                     \
    BODY(row, i0, w)                                                                         \
  }
"""

_QUANTIZE = r"""
void quantize_{x}_{q}(const {xt}* x, const {xt}* s, const {qt}* z, {qt}* y,
                      int64_t outer, int64_t C, int64_t inner) {{
#define BODY(row, i0, w)                                                                     \
    int64_t c = row % C;                                                                     \
    {ct} sc = {ld}(s[c]), zp = ({ct})z[c];                                                   \
    const {xt}* xr = x + row * inner + i0;                                                   \
    {qt}* yr = y + row * inner + i0;                                                         \
    _Pragma("omp simd")                                                                      \
    for (int64_t i = 0; i < w; i++) {{                                                       \
      {ct} v = {rint}({ld}(xr[i]) / sc) + zp;                                                \
      yr[i] = v != v ? {lo} : ({qt})(v < {lo} ? {lo} : v > {hi} ? {hi} : v);                \
    }}
  ROWS(BODY)
#undef BODY
}}
"""

_DEQUANTIZE = r"""
void dequantize_{q}_{s}(const {qt}* q, const {st}* s, const {qt}* z, {st}* y,
                        int64_t outer, int64_t C, int64_t inner) {{
#define BODY(row, i0, w)                                                                     \
    int64_t c = row % C;                                                                     \
    {ct} sc = {ld}(s[c]);                                                                    \
    int64_t zp = z[c];                                                                       \
    const {qt}* qr = q + row * inner + i0;                                                   \
    {st}* yr = y + row * inner + i0;                                                         \
    _Pragma("omp simd")                                                                      \
    for (int64_t i = 0; i < w; i++) yr[i] = {store}(({ct})((int64_t)qr[i] - zp) * sc);
  ROWS(BODY)
#undef BODY
}}
"""


def _source() -> tuple[str, dict]:
    parts, sigs = [_LOOP], {}
    for x, (xt, ct, ld, _) in _FLOATS.items():
        for q in _QUANT:
            lo, hi = quant_range(dtype_from_name(q))
            parts.append(_QUANTIZE.format(x=x, q=q, xt=xt, ct=ct, ld=ld, qt=exact_c.C_TYPE[q],
                                          lo=lo, hi=hi,
                                          rint="rintf" if ct == "float" else "rint"))
            sigs[f"quantize_{x}_{q}"] = [P, P, P, P, I64, I64, I64]
        for q in _DEQUANT:
            store = _FLOATS[x][3]
            parts.append(_DEQUANTIZE.format(q=q, s=x, qt=exact_c.C_TYPE[q], st=xt, ct=ct, ld=ld,
                                            store=store))
            sigs[f"dequantize_{q}_{x}"] = [P, P, P, P, I64, I64, I64]
    return "".join(parts), sigs


@cache
def lib():
    """The compiled quantization library, or None without a C compiler."""
    source, sigs = _source()
    return exact_c.build(source, "braze_quant_c", sigs)


def _c(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _rows(dims, axis: int | None) -> tuple[int, int, int]:
    """(outer, C, inner) of a tensor of `dims` around `axis` (C = 1 per tensor)."""
    dims = [int(d) for d in dims]
    if axis is None:
        return 1, 1, int(np.prod(dims, dtype=np.int64))
    return (int(np.prod(dims[:axis], dtype=np.int64)), dims[axis],
            int(np.prod(dims[axis + 1:], dtype=np.int64)))


def _kernel(fn_name: str, node, ins, outs) -> Kernel | None:
    so = lib()
    if so is None:
        return None
    fn = getattr(so, fn_name)
    outer, c, inner = _rows(ins[0].dims, node.op.axis)

    def run(x, s, z, out):
        x, s, z = _c(x), _c(s), _c(z)
        fn(address(x), address(s), address(z), address(out), outer, c, inner)

    what = "per tensor" if node.op.axis is None else f"per axis {node.op.axis}"
    return Kernel(run, Dispatch.NATIVE, f"C {fn_name.replace('_', ' ', 1)} ({what})",
                  bytes=nbytes(ins) + nbytes(outs), flops=2 * (outs[0].numel() or 0))


@register_kernel(Quantize)
def quantize_c(node, ins, outs, ctx):
    x, q = ins[0].dtype.name, outs[0].dtype.name
    if x not in _FLOATS or q not in _QUANT:
        return None
    return _kernel(f"quantize_{x}_{q}", node, ins, outs)


@register_kernel(Dequantize)
def dequantize_c(node, ins, outs, ctx):
    q, s = ins[0].dtype.name, outs[0].dtype.name
    if q not in _DEQUANT or s not in _FLOATS:
        return None
    return _kernel(f"dequantize_{q}_{s}", node, ins, outs)
