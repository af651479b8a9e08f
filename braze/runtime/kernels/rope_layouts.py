"""RoPE for every cos / sin layout the op allows: tables [..., n_rot / 2] that broadcast against
x's leading dims in any pattern, e.g. x [B, S, H, D] with cos [S, 1, D / 2] or [1, S, 1, D / 2]
(wav2vec2-conformer, and every [B, S, H, D] model that skips the transpose to [B, H, S, D]),
or x [S, B, H, D] with cos [S, 1, 1, D / 2]. fused.rope keeps the [..., S, D] x [S, D / 2]
layout it was written for; this kernel takes the others.

Each row of D values of x reads one row of the tables; which one is an index per x row (the
broadcast of the tables' row numbers over x's leading dims), computed once per program. The
rotation is float32 / float64 C without FMA contraction, so it is bit-identical to the
reference (`a * cos - b * sin` with each product rounded)."""
from __future__ import annotations

from functools import cache

import numpy as np

from ...ir.ops.attention import Rope
from ..address import address
from . import exact_c
from .exact_c import I64, INT, P
from .registry import Dispatch, Kernel, nbytes, register_kernel

__all__ = ["lib", "table_rows"]

_ROPE = r"""
/* y rows [r] = x rows [r] rotated by the table rows trow[r] of cos / sin [*, n_rot / 2]; the
   values past n_rot pass through. y may be x. */
void rope_rows_$S(const $T* x, const $T* cosv, const $T* sinv, const int64_t* trow, $T* y,
                  int64_t rows, int64_t d, int64_t n_rot, int interleaved) {
  int64_t h = n_rot / 2;
  #pragma omp parallel for schedule(static) if(BRAZE_PARALLEL(rows * d, BRAZE_PAR_MIN))
  for (int64_t r = 0; r < rows; r++) {
    const $T* xr = x + r * d;
    $T* yr = y + r * d;
    const $T* c = cosv + trow[r] * h;
    const $T* s = sinv + trow[r] * h;
    if (interleaved) {
      for (int64_t i = 0; i < h; i++) {
        $T a = xr[2 * i], b = xr[2 * i + 1];
        yr[2 * i] = a * c[i] - b * s[i];
        yr[2 * i + 1] = b * c[i] + a * s[i];
      }
    } else {
      #pragma omp simd
      for (int64_t i = 0; i < h; i++) {
        $T a = xr[i], b = xr[i + h];
        yr[i] = a * c[i] - b * s[i];
        yr[i + h] = b * c[i] + a * s[i];
      }
    }
    if (yr != xr)
      for (int64_t i = n_rot; i < d; i++) yr[i] = xr[i];
  }
}
"""
_TYPES = {"f32": "float", "f64": "double"}


@cache
def lib():
    """The compiled RoPE library, or None without a C compiler."""
    src = "".join(_ROPE.replace("$S", s).replace("$T", t) for s, t in _TYPES.items())
    return exact_c.build(src, "braze_rope_layouts",
                         {f"rope_rows_{s}": [P, P, P, P, P, I64, I64, I64, INT] for s in _TYPES})


def table_rows(x_lead: tuple[int, ...], table_lead: tuple[int, ...]) -> np.ndarray:
    """For each row of x (its leading dims flattened), the row of the tables (theirs) it
    reads: the tables' row numbers broadcast over x's leading dims."""
    lead = (1,) * (len(x_lead) - len(table_lead)) + tuple(table_lead)
    n = int(np.prod(lead, dtype=np.int64))
    rows = np.broadcast_to(np.arange(n, dtype=np.int64).reshape(lead), x_lead)
    return np.ascontiguousarray(rows.reshape(-1))


def _existing_layout(x, cos) -> bool:
    """The layout fused.rope runs: cos [..1.., S, n_rot / 2] against x [..., S, D]."""
    return cos.rank >= 2 and all(d == 1 for d in cos.dims[:-2]) and \
        cos.dims[-2] == x.dims[-2]


@register_kernel(Rope)
def rope_any_layout(node, ins, outs, ctx):
    x, cos, sin = ins
    t = x.dtype.name
    if t not in _TYPES or cos.dims != sin.dims:
        return None
    if t == "f32" and _existing_layout(x, cos):
        return None  # fused.rope's
    so = lib()
    if so is None:
        return None
    d = int(x.dims[-1])
    n_rot = node.op.n_rot or d
    x_lead = tuple(int(v) for v in x.dims[:-1])
    trow = table_rows(x_lead, tuple(int(v) for v in cos.dims[:-1]))
    rows, p_rows = int(trow.size), address(trow)
    fn = getattr(so, f"rope_rows_{t}")
    inter = int(node.op.interleaved)

    def run(xa, ca, sa, out):
        xa, ca, sa = (a if a.flags.c_contiguous else np.ascontiguousarray(a)
                      for a in (xa, ca, sa))
        fn(address(xa), address(ca), address(sa), p_rows, address(out), rows, d, n_rot, inter)

    run.table_rows = trow  # alive as long as the kernel
    return Kernel(run, Dispatch.NATIVE, "C rope (table row per x row)", inplace=(0,),
                  bytes=nbytes(ins) + nbytes(outs) + trow.nbytes, flops=3 * (x.numel() or 0))
