"""Attention in one C call, one (batch, query head) block per OpenMP task: for a block of query
rows, scores = q @ k^T (cblas_sgemm), then scale / softcap / mask / safe softmax in place, then
out = p @ v (cblas_sgemm) written straight into the output rows. q, k, v and the output are
strided views (batch, head and row strides in elements; rows contiguous), so a packed QKV
projection [B, S, (Hq + 2 Hkv) D] is read in place and the heads are written merged [B, S, Hq D]:
no head split or merge copies. Each thread has its own scores scratch (block rows x Sk, sized to
stay in L2); causal and sliding-window blocks stop the GEMMs at the last key any row of the
block sees. (batch, head) blocks are handed out dynamically: a thread the OS delays on a busy
machine does not hold up a static share. MKL runs single-threaded inside the parallel region
(MKL_DYNAMIC), so the two levels of threading never oversubscribe the cores. The team is at
most the caller's thread limit (Executable threads), and a call of fewer than
BRAZE_PAR_MIN_MACS multiply-adds runs on the calling thread alone, MKL sequential too (through
MKL_Set_Num_Threads_Local: outside an active region MKL would start a team of its own).

The GEMM is the process's cblas_sgemm (blas.sgemm_address(), MKL); without it `lib()` is None
and the executor keeps the NumPy path of attention.py. Also here: RoPE applied in place to the
q and k heads of a packed QKV buffer."""
from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

from ..codegen import cc
from . import blas
from .native import PROB_ROW, ROPE_ROW

__all__ = ["lib", "attn_heads", "rope_packed", "head_strides", "HeadsPlan"]

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <float.h>
#include <omp.h>

typedef void (*sgemm_t)(int, int, int, int, int, int, float, const float*, int, const float*,
                        int, float, float*, int);

int attn_max_threads(void) { return omp_get_max_threads(); }

""" + cc.parallel_min_define() + PROB_ROW + ROPE_ROW + r"""
/* st: element strides (batch, head, row) of q, k, v, out; mst: (batch, head, row, col) of the
   additive mask (0 to broadcast; mask may be NULL). scratch: slots x block x sk floats. */
void attn_heads(void* gemm, void* local_threads, const float* q, const float* k,
                const float* v, float* o,
                const int64_t* st, int64_t nb, int64_t hq, int64_t hkv, int64_t sq,
                int64_t sk, int64_t d, int64_t dv, float scale, float softcap, int causal,
                int64_t window, const float* mask, const int64_t* mst, float* scratch,
                int64_t block, int slots) {
  sgemm_t sgemm = (sgemm_t)gemm;
  int64_t rep = hq / hkv;
  int (*local)(int) = (int (*)(int))local_threads;
  int team = omp_get_max_threads() < slots ? omp_get_max_threads() : slots;
  int parallel = team > 1 && BRAZE_PARALLEL(nb * hq * sq * sk * (d + dv), BRAZE_PAR_MIN_MACS);
  int before = !parallel && local ? local(1) : 0;
  #pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(team) if(parallel)
  for (int64_t b = 0; b < nb; b++) {
    for (int64_t h = 0; h < hq; h++) {
      float* s = scratch + (int64_t)omp_get_thread_num() * block * sk;
      const float* qh = q + b * st[0] + h * st[1];
      const float* kh = k + b * st[3] + (h / rep) * st[4];
      const float* vh = v + b * st[6] + (h / rep) * st[7];
      float* oh = o + b * st[9] + h * st[10];
      const float* mh = mask ? mask + b * mst[0] + h * mst[1] : 0;
      for (int64_t q0 = 0; q0 < sq; q0 += block) {
        int64_t n = sq - q0 < block ? sq - q0 : block;
        int64_t cols = sk;
        if (causal && sk >= sq) {  /* the block's last row sees keys <= q0 + n - 1 + sk - sq */
          int64_t seen = q0 + n + sk - sq;
          cols = seen < sk ? seen : sk;
        }
        sgemm(101, 111, 112, (int)n, (int)cols, (int)d, 1.0f, qh + q0 * st[2], (int)st[2],
              kh, (int)st[5], 0.0f, s, (int)sk);
        for (int64_t i = 0; i < n; i++) {
          int64_t qi = q0 + i;
          prob_row(s + i * sk, cols, qi + sk - sq, scale, softcap, causal, window,
                   mh ? mh + qi * mst[2] : 0, mst[3]);
        }
        sgemm(101, 111, 111, (int)n, (int)dv, (int)cols, 1.0f, s, (int)sk, vh, (int)st[8],
              0.0f, oh + q0 * st[11], (int)st[11]);
      }
    }
  }
  if (!parallel && local) local(before);
}

/* RoPE in place on heads [0, heads) of x [nb, s, row] (head h at h * d of a row), cos / sin
   [s, n_rot / 2]. */
void rope_packed(float* x, const float* cosv, const float* sinv, int64_t nb, int64_t s,
                 int64_t row, int64_t heads, int64_t d, int64_t n_rot, int interleaved) {
  int64_t half = n_rot / 2;
  #pragma omp parallel for collapse(2) schedule(static) if(nb * s * row > BRAZE_PAR_MIN)
  for (int64_t b = 0; b < nb; b++) {
    for (int64_t p = 0; p < s; p++) {
      const float* c = cosv + p * half;
      const float* sn = sinv + p * half;
      for (int64_t h = 0; h < heads; h++) {
        float* xr = x + (b * s + p) * row + h * d;
        rope_row(xr, xr, c, sn, half, interleaved);
      }
    }
  }
}
"""

_I64, _F32, _INT, _P = ctypes.c_int64, ctypes.c_float, ctypes.c_int, ctypes.c_void_p
_SIGNATURES = {
    "attn_max_threads": ([], _INT),
    "attn_heads": ([_P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _F32,
                    _F32, _INT, _I64, _P, _P, _P, _I64, _INT], None),
    "rope_packed": ([_P, _P, _P, _I64, _I64, _I64, _I64, _I64, _I64, _INT], None),
}
SCRATCH_BYTES = 256 << 10   # scores per thread: stays in L2
CAUSAL_BLOCK = 32           # causal rows per block: the GEMMs skip the keys no row sees


@cache
def lib():
    """The compiled attention library, or None (no C compiler, or no cblas_sgemm to call)."""
    if not cc.available() or blas.sgemm_address() is None:
        return None
    return cc.load_library(SOURCE, "braze_attention", _SIGNATURES)


def head_strides(a: np.ndarray) -> tuple[int, int, int] | None:
    """(batch, head, row) element strides of a float32 [B, H, S, D] view whose rows are
    contiguous and do not overlap (the row stride is the GEMM's leading dimension: BLAS takes
    none below D, so a view broadcast along S, stride 0, is not one), or None."""
    if a.dtype != np.float32 or a.ndim != 4 or (a.shape[-1] > 1 and a.strides[-1] != 4):
        return None
    if a.strides[2] < 4 * max(1, a.shape[-1]) or any(st % 4 for st in a.strides[:3]):
        return None
    return tuple(st // 4 for st in a.strides[:3])


class HeadsPlan:
    """Block size and scratch for attn_heads on [B, Hq, Sq, D] x [B, Hkv, Sk, D]."""

    def __init__(self, sq: int, sk: int, causal: bool):
        self.slots = max(1, int(lib().attn_max_threads()))
        rows = max(1, SCRATCH_BYTES // (4 * max(sk, 1)))
        self.block = min(sq, CAUSAL_BLOCK if causal else rows, rows)
        self.sk = sk
        self.scratch_shape = (self.slots, self.block, sk)


def attn_heads(plan: HeadsPlan, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray,
               strides: tuple[int, ...], shape: tuple[int, ...], scale: float, softcap: float,
               causal: bool, window: int, mask, mask_strides: tuple[int, ...],
               scratch: np.ndarray) -> None:
    """Run the C kernel. `strides`: 12 element strides (batch, head, row of q, k, v, out);
    `shape`: (B, Hq, Hkv, Sq, Sk, D, Dv); `mask` a float32 array or None with its 4 element
    strides (0 where it broadcasts)."""
    st = np.asarray(strides, np.int64)
    mst = np.asarray(mask_strides, np.int64)
    lib().attn_heads(blas.sgemm_address(), blas.local_threads_address(), q.ctypes.data,
                     k.ctypes.data, v.ctypes.data, out.ctypes.data, st.ctypes.data, *shape,
                     scale, softcap, int(causal),
                     window, None if mask is None else mask.ctypes.data, mst.ctypes.data,
                     scratch.ctypes.data, plan.block, plan.slots)


def rope_packed(qkv: np.ndarray, cos: np.ndarray, sin: np.ndarray, heads: int, d: int,
                n_rot: int, interleaved: bool) -> None:
    """RoPE in place on the first `heads` heads of each row of a contiguous [B, S, W] buffer."""
    b, s, w = qkv.shape
    lib().rope_packed(qkv.ctypes.data, cos.ctypes.data, sin.ctypes.data, b, s, w, heads, d,
                      n_rot, int(interleaved))
