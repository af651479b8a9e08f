"""Kernels for indexing ops that copy part of their input, bit-identical to the references:

- trilu: one C pass over the [batch, rows, cols] matrices, per row a copy of the kept columns
  and a zero fill of the rest (dtype-agnostic: every braze dtype's zero is all-zero bytes, as
  np.triu / np.tril write it); may run in place.
- dynamic_narrow: a program is planned per binding of the symbolic dims, so the slice's
  [start, start + length) is evaluated once when the step is built and each run copies that
  fixed slice (a NumPy strided copy). A binding that puts the slice outside the axis builds no
  kernel: the step runs the reference, which raises the op's ShapeError when it runs."""
from __future__ import annotations

from functools import cache

import numpy as np

from ...errors import ShapeError
from ...ir.ops.indexing import DynamicNarrow, Trilu
from ..address import address
from . import exact_c
from .exact_c import I64, INT, P
from .registry import Dispatch, Kernel, nbytes, register_kernel

__all__ = ["lib"]

_TRILU = r"""
/* y = triu(x, k) (upper) or tril(x, k) of x [batch, rows, cols] of `elem`-byte elements;
   y may be x. */
void trilu(const char* x, char* y, int64_t batch, int64_t rows, int64_t cols, int64_t elem,
           int upper, int64_t k) {
  #pragma omp parallel for schedule(static) \
      if(BRAZE_PARALLEL(batch * rows * cols, BRAZE_PAR_MIN))
  for (int64_t br = 0; br < batch * rows; br++) {
    int64_t i = br % rows;
    const char* src = x + br * cols * elem;
    char* dst = y + br * cols * elem;
    /* kept columns [lo, hi) */
    int64_t lo = 0, hi = cols;
    if (upper) {
      int64_t first = i + k;
      lo = first < 0 ? 0 : (first > cols ? cols : first);
    } else {
      int64_t last = i + k + 1;
      hi = last < 0 ? 0 : (last > cols ? cols : last);
    }
    if (lo > 0) memset(dst, 0, lo * elem);
    if (hi > lo && dst != src) memcpy(dst + lo * elem, src + lo * elem, (hi - lo) * elem);
    if (hi < cols) memset(dst + hi * elem, 0, (cols - hi) * elem);
  }
}
"""


@cache
def lib():
    """The compiled trilu library, or None without a C compiler."""
    return exact_c.build(_TRILU, "braze_indexing", {"trilu": [P, P, I64, I64, I64, I64, INT,
                                                                I64]})


@register_kernel(Trilu)
def trilu(node, ins, outs, ctx):
    (x,) = ins
    so = lib()
    if so is None or x.rank < 2:
        return None
    rows, cols = int(x.dims[-2]), int(x.dims[-1])
    batch = int(np.prod(x.dims[:-2], dtype=np.int64))
    elem = x.dtype.np.itemsize
    upper, k = int(node.op.upper), int(node.op.k)

    def run(xa, out):
        xa = xa if xa.flags.c_contiguous else np.ascontiguousarray(xa)
        so.trilu(address(xa), address(out), batch, rows, cols, elem, upper, k)

    how = "triu" if upper else "tril"
    return Kernel(run, Dispatch.NATIVE, f"C {how}", inplace=(0,),
                  bytes=nbytes(ins) + nbytes(outs))


@register_kernel(DynamicNarrow)
def dynamic_narrow(node, ins, outs, ctx):
    (x,) = ins
    op = node.op
    ax = op.axis % x.rank
    try:
        start, stop = op.bounds(int(x.dims[ax]), ctx.symbols)
    except ShapeError:
        return None  # the reference raises it when the step runs
    index = (slice(None),) * ax + (slice(start, stop),)

    def run(xa, out):
        np.copyto(out, xa[index])

    return Kernel(run, Dispatch.NATIVE, f"dynamic_narrow copy [{start}, {stop})",
                  bytes=2 * nbytes(outs))
