"""bf16 GEMMs for the mixed-precision policy: MKL's `cblas_gemm_bf16bf16f32` (AMX / AVX-512
BF16) on a weight converted and packed once, the activation rounded to bf16 on the way in,
f32 accumulation and output, bias + activation applied after.

Under the bf16 policy (braze/passes/precision.py) a lowered matmul reads
`cast(cast(a, bf16), f32)` and a weight rounded the same way (weight preparation). Products of
bf16 values are exact in f32, so this GEMM computes what the policy's graph computes (up to the
order of the f32 sums): the kernel reads `a` itself (`Kernel.reads`: the program forwards the
operand, and the two casts go unread and are dropped) and rounds it to nearest-even while
converting, one pass over `a` instead of three. Where the operand's bf16 values were written
by the step before (the bf16 hand-off: fused.rounded_output) the GEMM reads them as they are.

Three GEMMs can run it, each where the CPU has what it needs:
- MKL's (MKL installed and exporting the bf16 GEMM, a CPU with AMX-BF16 or AVX512-BF16). On
  the 2-core AMX Xeon VM (one thread, CPU time, quiet-ish) its packed bf16 GEMM ran 290-360
  GFLOP/s per core at BERT-base shapes against 90-170 for f32 sgemm; its packed weight is
  ~3-8x the bf16 weight (MKL's AMX layout; BERT-base: ~0.5 GB). On the Zen 4 EPYC VM
  (AVX512-BF16, no AMX) it ran 50-100 GFLOP/s, below braze's f32 kernel.
- braze's AMX tile kernel (amx_gemm.py, "amx"; the weight at its bf16 size).
- braze's AVX512-BF16 kernel (dpbf16_gemm.py, "dp"): on the Zen 4 VM 1.5-1.7x braze's f32
  kernel and 2-3x MKL's bf16 GEMM.
Where more than one runs, which runs a weight shape is measured once per machine
(gemm_choice.choose_bf16); `BRAZE_BF16_GEMM=mkl` / `amx` / `dp` forces one, `0` turns the
bf16 GEMM off (the policy's f32 GEMMs on rounded operands then run). The gated epilogue and a
bf16 result (the hand-off) are braze's kernels' alone (OWN)."""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from functools import cache

import numpy as np

from ...errors import InterpretError
from ...ir.op import Value
from ..address import address
from ..codegen import cc
from ..plan import aligned_empty
from . import amx_gemm, blas, c_snippets, dpbf16_gemm, gemm_choice, native
from .packed_gemm import bias_fits, gemm_bias
from .registry import Dispatch, Kernel, nbytes

__all__ = ["available", "bf16_policy", "Bf16Weight", "bf16_weight", "bf16_bits",
           "rounded_source", "gemm", "gemm_kernel", "round_through", "scratch_elems", "describe",
           "PREPARED", "OWN"]

_ROW_MAJOR, _NO_TRANS, _B_MATRIX = 101, 111, 162  # CBLAS enums (the C code uses 151: packed)

SOURCE = r"""
#include <stdint.h>
#include <omp.h>
""" + c_snippets.TO_BF16 + r"""
/* dst[i] = bf16(src[i]) rounded to nearest even (NaN stays a quiet NaN), over rows of `cols`
   values read `lda` apart. */
void round_bf16(const float* src, int64_t lda, uint16_t* dst, int64_t rows, int64_t cols) {
  #pragma omp parallel for schedule(static) if(rows * cols > (1 << 16))
  for (int64_t r = 0; r < rows; r++)
    round_rows(src + r * lda, lda, 1, cols, dst + r * cols, cols, cols, 1);
}

/* x[i] = f32(bf16(x[i])) in place, rounded as round_bf16 rounds. */
void round_bf16_through(float* x, int64_t n) {
  #pragma omp parallel for simd schedule(static) if(n > (1 << 16))
  for (int64_t i = 0; i < n; i++) x[i] = bf16_value(x[i]);
}

typedef void (*bf16_compute_fn)(int, int, int, int, int, int, float, const uint16_t*, int,
                                const void*, int, float, float*, int);

/* out[m, n] = bf16(a[m, k]) @ B: a (f32) rounded into a16 [m, k], or a read as it is when its
   values are bf16 already (a16_in), then MKL's compute on the packed B (MKL threads it). */
void gemm_bf16(void* compute, const void* a, int64_t lda, int a16_in, uint16_t* a16,
               const void* packed, float* out, int64_t m, int64_t n, int64_t k) {
  if (!a16_in) round_bf16((const float*)a, lda, a16, m, k);
  ((bf16_compute_fn)compute)(101, 111, 151, (int)m, (int)n, (int)k, 1.0f,
                             a16_in ? (const uint16_t*)a : a16, (int)(a16_in ? lda : k),
                             packed, (int)n, 0.0f, out, (int)n);
}
"""

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {
    "round_bf16": [_P, _I64, _P, _I64, _I64],
    "round_bf16_through": [_P, _I64],
    "gemm_bf16": [_P, _P, _I64, _INT, _P, _P, _P, _I64, _I64, _I64],
}


@dataclass(frozen=True)
class _Mkl:
    compute: int          # address of cblas_gemm_bf16bf16f32_compute
    pack_size: object     # cblas_gemm_bf16bf16f32_pack_get_size
    pack: object          # cblas_gemm_bf16bf16f32_pack


def _setting() -> str:
    """BRAZE_BF16_GEMM: "0" (off), "mkl", "amx" or "dp" (forced), else "auto"."""
    flag = os.environ.get("BRAZE_BF16_GEMM", "auto")
    return flag if flag in ("0", "mkl", "amx", "dp") else "auto"


def _amx() -> bool:
    return _setting() in ("auto", "amx") and amx_gemm.available()


def _dp() -> bool:
    return _setting() in ("auto", "dp") and dpbf16_gemm.available()


def _own() -> bool:
    """Whether one of braze's bf16 GEMMs (gated epilogue, bf16 results) runs here."""
    return _amx() or _dp()


def _mkl() -> _Mkl | None:
    """MKL's bf16 GEMM, unless the setting rules it out."""
    return None if _setting() in ("0", "amx", "dp") else _mkl_gemm()


@cache
def _mkl_gemm() -> _Mkl | None:
    if not _cpu_has_bf16():
        return None
    lib = blas.mkl_library()
    if lib is None:
        return None
    try:
        compute = lib.cblas_gemm_bf16bf16f32_compute
        size = lib.cblas_gemm_bf16bf16f32_pack_get_size
        pack = lib.cblas_gemm_bf16bf16f32_pack
    except AttributeError:
        return None
    size.argtypes, size.restype = [_INT, _INT, _INT, _INT], ctypes.c_size_t
    pack.argtypes = [_INT] * 6 + [_P, _INT, _P]
    pack.restype = None
    return _Mkl(ctypes.cast(compute, _P).value, size, pack)


def _cpu_has_bf16() -> bool:
    return bool(cc.cpu_flags() & {"amx_bf16", "avx512_bf16"})


@cache
def _lib():
    return cc.load_library(SOURCE, "braze_bf16", _SIGNATURES)


def available() -> bool:
    """Whether bf16 GEMMs run here (MKL with the bf16 GEMM on a bf16 CPU, or one of braze's
    kernels; a C compiler)."""
    return (_mkl() is not None or _own()) and _lib() is not None and native.lib() is not None


def scratch_elems(rows: int, k: int) -> int:
    """uint16 elements of the operand scratch a `rows` x `k` bf16 GEMM needs (either kind)."""
    need = max(rows * k, 1)
    if _amx():
        need = max(need, amx_gemm.scratch_elems(rows, k))
    if _dp():
        need = max(need, dpbf16_gemm.scratch_elems(rows, k))
    return need


class Bf16Weight:
    """A [K, N] weight whose values are bf16 numbers, converted and packed once for MKL."""

    def __init__(self, w: np.ndarray):
        mkl = _mkl()
        self.k, self.n = (int(x) for x in w.shape)
        w16 = np.empty((self.k, self.n), np.uint16)
        src = np.ascontiguousarray(w, np.float32)
        _lib().round_bf16(address(src), self.n, address(w16), self.k, self.n)
        size = int(mkl.pack_size(_B_MATRIX, 1, self.n, self.k))
        self.packed = aligned_empty(size, np.uint8)  # MKL wants 64-byte aligned packed data
        mkl.pack(_ROW_MAJOR, _B_MATRIX, _NO_TRANS, 1, self.n, self.k, address(w16), self.n,
                 address(self.packed))


OWN = amx_gemm.OwnWeight  # braze's weights: gated, bf16 results
PREPARED = (Bf16Weight, OWN)  # what bf16_weight returns
Prepared = Bf16Weight | amx_gemm.AmxWeight | dpbf16_gemm.DpWeight


def bf16_weight(node, ctx, position: int = 1, gate_first: bool | None = None
                ) -> Prepared | None:
    """The static 2-D weight at input `position` of `node` converted and packed for the bf16
    GEMM (cached in ctx.prepared), when the context's precision computes in bf16, the GEMM is
    available and every weight value is a bf16 number (the policy rounded it); else None.
    With `gate_first` set, packed in gate / up pairs for braze's AMX kernel's gated epilogue
    (None without one of braze's kernels: MKL has no such epilogue)."""
    if not bf16_policy(ctx) or not available() or (gate_first is not None and not _own()):
        return None
    value = node.inputs[position]
    w = ctx.static.get(value)
    if w is None or w.ndim != 2 or w.dtype != np.float32 or w.size == 0:
        return None
    if gate_first is not None and w.shape[1] % 2:
        return None
    key = ("bf16_gemm", value, w.shape, w.strides, gate_first)
    hit = ctx.prepared.get(key)
    if hit is None:
        if bf16_bits(w) is None:
            hit = False
        elif gate_first is None:
            hit = _prepare(w)
        else:
            hit = _prepare(w, gate_first)
        ctx.prepared[key] = hit
    return hit or None


def bf16_bits(w: np.ndarray) -> np.ndarray | None:
    """The bf16 bit patterns (uint16, contiguous) of a float32 array whose values are all bf16
    numbers (the policy rounded them), else None."""
    bits = np.ascontiguousarray(w, np.float32).view(np.uint32)
    if (bits & 0xFFFF).any():
        return None
    return (bits >> 16).astype(np.uint16)


_KINDS = {"mkl": Bf16Weight, "amx": amx_gemm.AmxWeight, "dp": dpbf16_gemm.DpWeight}


def _kinds(gated: bool = False) -> list[str]:
    """The bf16 GEMMs that run here (of gemm_choice.BF16_CHOICES), braze's alone if gated."""
    here = {"mkl": _mkl() is not None and not gated, "amx": _amx(), "dp": _dp()}
    return [kind for kind in gemm_choice.BF16_CHOICES if here[kind]]


def _prepare(w: np.ndarray, gate_first: bool | None = None) -> Prepared:
    """w packed for the bf16 GEMM measured fastest for its shape here (or the one there is);
    gated (gate_first set) for one of braze's."""
    kinds = _kinds(gate_first is not None)
    choice = kinds[0] if len(kinds) == 1 else \
        gemm_choice.choose_bf16(*w.shape, lambda x, v: _candidates(x, v, kinds))
    if choice not in kinds:  # a choice file from another configuration
        choice = kinds[0]
    return _KINDS[choice](w) if gate_first is None else _KINDS[choice](w, gate_first)


def describe(w: Prepared) -> str:
    """Which bf16 GEMM runs a prepared weight, for dispatch reports."""
    if isinstance(w, amx_gemm.AmxWeight):
        return "braze bf16 GEMM (AMX tiles)"
    if isinstance(w, dpbf16_gemm.DpWeight):
        return "braze bf16 GEMM (AVX512-BF16)"
    return "MKL bf16 GEMM"


def _candidates(x: np.ndarray, w: np.ndarray, kinds: list[str]) -> dict:
    """The bf16 GEMMs `kinds` on `x @ w`, for gemm_choice to time."""
    out = np.empty((x.shape[0], w.shape[1]), np.float32)
    x16 = aligned_empty(scratch_elems(x.shape[0], x.shape[1]), np.uint16)  # as the arena's
    runs = {}
    for kind in kinds:
        weight = _KINDS[kind](w)
        runs[kind] = lambda weight=weight: gemm(x, weight, out, None, 0, x16)
    return runs


def bf16_policy(ctx) -> bool:
    """Whether the kernel context compiles under a bf16 policy (its roundings are to bf16)."""
    policy = ctx.precision
    if policy is None:
        return False
    name = policy if isinstance(policy, str) else getattr(policy.compute, "name", "")
    return name == "bf16"


def rounded_source(node, ctx, position: int = 0) -> Value | None:
    """The f32 value whose bf16 rounding input `position` of `node` is
    (`cast(cast(a, bf16), f32)` -> `a`, see KernelContext.rounded), or None."""
    return ctx.rounded.get(node.inputs[position]) if ctx.rounded else None


def round_through(a: np.ndarray, dtype) -> None:
    """a[...] = a rounded to `dtype` (a braze float DType) and back to f32, in place, as the
    policy's cast(cast(a, dtype), f32) computes it; `a` is a C-contiguous f32 array."""
    if dtype.name == "bf16" and _lib() is not None and a.flags.c_contiguous \
            and a.dtype == np.float32:
        _lib().round_bf16_through(address(a), a.size)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            a[...] = a.astype(dtype.np).astype(np.float32)


def gemm(x: np.ndarray, w: Prepared, out: np.ndarray, bias: np.ndarray | None, act: int,
         x16: np.ndarray) -> bool:
    """out = act(bf16(x) @ w + bias) for x [..., K] with contiguous rows: f32 (rounded to bf16
    into the scratch `x16`, at least rows * K uint16) or bf16 (read as it is). out is f32, or
    bf16 on braze's weights (OWN: the result rounded to nearest even). False (nothing
    written) if the shapes do not fit."""
    if isinstance(w, amx_gemm.AmxWeight):
        return amx_gemm.gemm(x, w, out, bias, act, x16)
    if isinstance(w, dpbf16_gemm.DpWeight):
        return dpbf16_gemm.gemm(x, w, out, bias, act, x16)
    k = x.shape[-1] if x.ndim else 0
    if k != w.k or out.shape[-1] != w.n or not out.flags.c_contiguous or x.ndim < 1:
        return False
    rows = x.size // max(k, 1)
    if x.dtype not in (np.float32, amx_gemm.BF16) or out.dtype != np.float32:
        return False
    if x16.size < rows * k or out.size != rows * w.n:
        return False
    if x.strides[-1] != x.itemsize or (x.ndim > 1 and not x.flags.c_contiguous):
        return False
    _lib().gemm_bf16(_mkl().compute, address(x), k, x.dtype == amx_gemm.BF16,
                     address(x16), address(w.packed), address(out), rows, w.n, k)
    if bias is not None or act:
        native.lib().bias_act(address(out), None if bias is None else address(bias),
                              rows, w.n, act)
    return True


def gemm_kernel(node, ins, outs, ctx, *, has_bias: bool, act: int, what: str,
                gate_first: bool | None = None) -> Kernel | None:
    """The kernel of a GEMM node (x, w[, b]) -> act(x @ w + b) on the bf16 GEMM, when its
    weight is a static bf16-valued matrix and x is the policy's rounding of some `a` (read
    instead of x and rounded here) or of bf16 values an earlier step wrote (read as they are,
    KernelContext.handoff); None otherwise. `outs[0]` bf16 (fused.rounded_output: the product
    rounded for the next GEMM) runs only on braze's weights (OWN). With `gate_first` set (a gated
    MLP's gate / up GEMM, fused.gated_gemm), outs are the gated node's (or its rounding's):
    act(gate) * up from braze's AMX kernel's gated epilogue."""
    out16 = outs[0].dtype.name == "bf16"
    if len(ins) < 2 or ins[1].rank != 2 or ins[0].rank < 1 or \
            outs[0].dtype.name not in ("f32", "bf16"):
        return None
    handed = ctx.handoff.get(node.inputs[0]) if ctx.handoff else None
    src = handed if handed is not None else rounded_source(node, ctx, 0)
    weight = bf16_weight(node, ctx, 1, gate_first) if src is not None else None
    if weight is None or (out16 and not isinstance(weight, OWN)):
        return None
    cols, k, n_out = weight.n, weight.k, int(outs[0].dims[-1]) if outs[0].rank else 1
    full = 2 * n_out if gate_first is not None else cols   # the product's columns
    if n_out != (weight.out_cols if isinstance(weight, OWN) else cols):
        return None
    rows = int(np.prod(outs[0].dims[:-1], dtype=np.int64)) if outs[0].rank > 1 else 1
    if has_bias and not bias_fits(ins[2], full):
        return None
    static_bias = ctx.static.get(node.inputs[2]) if has_bias else None
    ready = None if static_bias is None else gemm_bias(static_bias, full, gate_first)

    def run(x, w, *rest):
        out, x16 = rest[-2], rest[-1]
        b = ready if ready is not None or not has_bias else gemm_bias(rest[0], full, gate_first)
        x = np.ascontiguousarray(x)  # held in a name: a temporary copy must outlive the call
        if not gemm(x, weight, out, b, act, x16):
            raise InterpretError(f"bf16 GEMM at node {node.label}: x {x.shape} / out "
                                 f"{out.shape} do not fit the weight {w.shape}")

    how = "bf16 operand handed over" if handed is not None else "operand rounded in"
    return Kernel(run, Dispatch.NATIVE,
                  f"{describe(weight)}, {how} ({what}{', bf16 out' if out16 else ''})",
                  flops=2 * rows * full * k, bytes=nbytes(ins) + nbytes(outs),
                  scratch=(((scratch_elems(rows, k),), np.uint16),), reads=((0, src),))
