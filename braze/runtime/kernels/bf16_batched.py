"""Batched bf16 matmuls for the mixed-precision policy: `a @ b` with both operands rank >= 3
(a batch of matrices, the same leading dims) where each is the policy's bf16 rounding of some
value, or a static value whose entries are bf16 numbers. Attention-like products that do not
fuse into an attention op run this way (DeBERTa's disentangled position scores: q against the
position keys, 24 per BERT-base-sized call).

One C call: the batch split over the OpenMP threads, each matrix's operands rounded to bf16
into the thread's scratch, then MKL's `cblas_gemm_bf16bf16f32` (f32 accumulation and output)
on one thread. A static operand is converted to bf16 once, when the program is built. What it
computes is the policy graph's product up to the order of the f32 sums (products of bf16
values are exact in f32). Without MKL's bf16 GEMM on a bf16 CPU the policy's f32 GEMM on the
rounded operands runs instead (basic.matmul)."""
from __future__ import annotations

import ctypes
import os
from functools import cache

import numpy as np

from ...ir.dtypes import bf16
from ..address import address
from ..codegen import cc
from ..plan import aligned_empty
from . import bf16_gemm, blas, c_snippets, gemm_choice, native
from .packed_gemm import bias_fits, gemm_bias
from .registry import Dispatch, Kernel, nbytes

__all__ = ["batched_kernel"]

SOURCE = r"""
#include <stdint.h>
#include <omp.h>
""" + cc.parallel_min_define() + c_snippets.TO_BF16 + r"""
typedef void (*bf16_gemm_fn)(int, int, int, int, int, int, float, const uint16_t*, int,
                             const uint16_t*, int, float, float*, int);

/* out[i] = bf16(a[i]) @ bf16(b[i]) for i < batch: a[i] is m x k (rows lda apart, matrices sa
   apart), b[i] k x n (or n x k with trans_b; rows ldb apart, matrices sb apart), f32 values
   rounded here, or bf16 values (b16) read as they are. Each thread (at most `slots`) rounds
   into its own `per` uint16 of scratch. */
void batched_gemm_bf16(void* gemm, void* local_threads, const float* a, int64_t sa,
                       int64_t lda, const void* b, int b16, int64_t sb, int64_t ldb,
                       int trans_b, float* out, int64_t m, int64_t n, int64_t k, int64_t batch,
                       uint16_t* scratch, int64_t per, int slots) {
  bf16_gemm_fn f = (bf16_gemm_fn)gemm;
  int (*local)(int) = (int (*)(int))local_threads;
  int64_t brows = trans_b ? n : k, bcols = trans_b ? k : n;
  int team = omp_get_max_threads() < slots ? omp_get_max_threads() : slots;
  int par = team > 1 && batch >= team && BRAZE_PARALLEL(batch * m * n * k, BRAZE_PAR_MIN_MACS);
  int before = (par && local) ? local(1) : 0;
  #pragma omp parallel for schedule(dynamic, 1) num_threads(team) if(par)
  for (int64_t i = 0; i < batch; i++) {
    uint16_t* a16 = scratch + (int64_t)omp_get_thread_num() * per;
    uint16_t* bt = a16 + m * k;
    round_rows(a + i * sa, lda, m, k, a16, k, k, m);
    const uint16_t* bm = (const uint16_t*)b + i * sb;
    int64_t ld = ldb;
    if (!b16) {
      round_rows((const float*)b + i * sb, ldb, brows, bcols, bt, bcols, bcols, brows);
      bm = bt;
      ld = bcols;
    }
    f(101, 111, trans_b ? 112 : 111, (int)m, (int)n, (int)k, 1.0f, a16, (int)k, bm, (int)ld,
      0.0f, out + i * m * n, (int)n);
  }
  if (par && local) local(before);
}
"""

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {"batched_gemm_bf16": [_P, _P, _P, _I64, _I64, _P, _INT, _I64, _I64, _INT, _P,
                                     _I64, _I64, _I64, _I64, _P, _I64, _INT]}


@cache
def _lib():
    return cc.load_library(SOURCE, "braze_bf16_batched", _SIGNATURES)


@cache
def _gemm_address() -> int | None:
    """The address of MKL's unpacked `cblas_gemm_bf16bf16f32`, where it runs fast here (MKL's
    bf16 GEMM on an AMX / AVX512-BF16 CPU, as bf16_gemm decides), else None."""
    if bf16_gemm._mkl() is None:  # noqa: SLF001 - the one place that decides MKL's bf16 GEMM
        return None
    lib = blas.mkl_library()
    try:
        fn = lib.cblas_gemm_bf16bf16f32
    except AttributeError:
        return None
    return ctypes.cast(fn, ctypes.c_void_p).value


def _operand(node, ctx, pos: int):
    """How input `pos` reaches the kernel: ("rounded", source value) when it is the policy's
    rounding of `source`; ("static", bf16 array) when it is a static bf16-valued f32 array
    (converted here, once); None otherwise."""
    src = bf16_gemm.rounded_source(node, ctx, pos)
    if src is not None:
        return "rounded", src
    w = ctx.static.get(node.inputs[pos])
    bits = None if w is None or w.dtype != np.float32 else bf16_gemm.bf16_bits(w)
    return None if bits is None else ("static", bits)


def batched_kernel(node, ins, outs, ctx, *, has_bias: bool = False, act: int = 0,
                   what: str = "matmul") -> Kernel | None:
    """The kernel of a matmul (inputs a, b) or a FusedMatMulBiasAct (a, b[, bias]: its
    epilogue after the GEMM, a bias [n] or a scalar) of two rank >= 3 f32 operands with the
    same leading dims under the bf16 policy, each rounded by the policy (read before rounding:
    Kernel.reads) or static with bf16 values; None otherwise."""
    a, b = ins[:2]
    if not bf16_gemm.bf16_policy(ctx) or a.rank < 3 or b.rank != a.rank or \
            tuple(a.dims[:-2]) != tuple(b.dims[:-2]) or outs[0].dtype.name != "f32":
        return None
    address_ = _gemm_address()
    if address_ is None or _lib() is None or native.lib() is None:
        return None
    first, second = _operand(node, ctx, 0), _operand(node, ctx, 1)
    if first is None or first[0] != "rounded" or second is None:
        return None
    m, k = (int(d) for d in a.dims[-2:])
    n = int(b.dims[-1])
    batch = int(np.prod(a.dims[:-2], dtype=np.int64))
    if min(m, n, k, batch) == 0 or (has_bias and not bias_fits(ins[2], n)):
        return None
    slots = ctx.threads or cc.usable_cpus()  # the scratch's thread slots
    per = m * k + k * n
    static_b = second[1] if second[0] == "static" else None
    if not _pays(batch, m, k, n, slots, static_b is not None):
        return None
    b16 = None if static_b is None else np.ascontiguousarray(static_b.reshape(batch, k, n))
    lib, local = _lib(), blas.local_threads_address()
    static_bias = ctx.static.get(node.inputs[2]) if has_bias else None
    ready = None if static_bias is None else gemm_bias(static_bias, n)

    def run(x, y, *rest):
        out, scratch = rest[-2], rest[-1]
        product(x, y, out, scratch)
        if has_bias or act:
            bias = None if not has_bias else ready if ready is not None else \
                gemm_bias(rest[0], n)
            native.lib().bias_act(address(out), None if bias is None else address(bias),
                                  batch * m, n, act)

    def product(x, y, out, scratch):
        x3 = x.reshape(batch, m, k)
        if x3.strides[2] != 4 or x3.strides[1] < 4 * k or x3.strides[0] < 0:
            x3 = np.ascontiguousarray(x3)
        if b16 is not None:
            lib.batched_gemm_bf16(address_, local, address(x3), x3.strides[0] // 4,
                                  x3.strides[1] // 4, address(b16), 1, k * n, n, 0,
                                  address(out), m, n, k, batch, address(scratch), per, slots)
            return
        y3 = y.reshape(batch, k, n)
        if y3.strides[2] == 4 and y3.strides[1] >= 4 * n and y3.strides[0] >= 0:
            trans, ld = 0, y3.strides[1] // 4
        elif y3.strides[1] == 4 and y3.strides[2] >= 4 * k and y3.strides[0] >= 0:
            trans, ld = 1, y3.strides[2] // 4
        else:
            y3 = np.ascontiguousarray(y3)
            trans, ld = 0, n
        lib.batched_gemm_bf16(address_, local, address(x3), x3.strides[0] // 4,
                              x3.strides[1] // 4, address(y3), 0, y3.strides[0] // 4, ld,
                              trans, address(out), m, n, k, batch, address(scratch), per, slots)

    reads = ((0, first[1]),) + (((1, second[1]),) if second[0] == "rounded" else ())
    return Kernel(run, Dispatch.NATIVE,
                  f"batched bf16 matmul (MKL bf16 GEMM per matrix, the batch over threads; "
                  f"{what})",
                  flops=2 * batch * m * n * k, bytes=nbytes(ins) + nbytes(outs),
                  scratch=(((slots * per,), np.uint16),), reads=reads)


def _pays(batch: int, m: int, k: int, n: int, slots: int, static_b: bool) -> bool:
    """Whether this kernel beats the policy's f32 GEMM on rounded operands (two rounding
    passes, then MKL's sgemm per matrix) for the geometry, measured once per machine
    (gemm_choice.choose_keyed) on at most ~2^24 multiply-adds' worth of matrices. MKL's bf16
    GEMM wins where k is large against n (an unfused p @ v: 12 x 128x128x64 took 0.64x the
    f32 path's time, one thread) and loses where the f32 output dominates (DeBERTa's
    position scores, 12 x 128x64x512: 1.3x). `BRAZE_BF16_BATCHED=1` / `0` forces it on / off."""
    flag = os.environ.get("BRAZE_BF16_BATCHED", "auto")
    if flag in ("0", "1"):
        return flag == "1"
    key = f"bmm-bf16:{batch}x{m}x{k}x{n}:{slots}{':static' if static_b else ''}"
    return gemm_choice.choose_keyed(key, lambda: _runs(batch, m, k, n, slots, static_b)) \
        == "bf16_batched"


def _runs(batch: int, m: int, k: int, n: int, slots: int, static_b: bool) -> dict:
    """Both candidates on random operands of the geometry (fewer matrices where it is big)."""
    count = min(batch, max(2 * slots, (1 << 24) // max(m * k * n, 1)))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((count, m, k), dtype=np.float32)
    b = rng.standard_normal((count, k, n), dtype=np.float32)
    b16 = (b.view(np.uint32) >> 16).astype(np.uint16)
    out = np.empty((count, m, n), np.float32)
    scratch = aligned_empty(slots * (m * k + k * n), np.uint16)
    a_r, b_r = np.empty_like(a), np.empty_like(b)
    lib, gemm, local = _lib(), _gemm_address(), blas.local_threads_address()

    def low():
        src, flag = (b16, 1) if static_b else (b, 0)
        lib.batched_gemm_bf16(gemm, local, address(a), m * k, k, address(src), flag, k * n, n,
                              0, address(out), m, n, k, count, address(scratch),
                              m * k + k * n, slots)

    def rounded():
        for src, dst in ((a, a_r),) + (() if static_b else ((b, b_r),)):
            np.copyto(dst, src)
            bf16_gemm.round_through(dst, bf16)
        blas.matmul(a_r, b_r, out)

    return {"bf16_batched": low, "f32_rounded": rounded}
