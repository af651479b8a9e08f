"""MKL's packed-weight sgemm for a static float32 weight: `cblas_sgemm_pack` once (weight
preparation), then per call `cblas_sgemm_compute` over the whole product, threaded by MKL on
the shared OpenMP pool, and the epilogue (bias + activation) over the output rows in one
parallel pass.

MKL's plain sgemm re-packs the weight on every call; at transformer shapes with few rows
(M = 128 tokens) that copy is a large part of the product. On the AMX / AVX-512 Xeon VM
(2 threads, loaded, alternating calls) the packed compute ran 244-249 GFLOP/s median at
128 x 768 x {768, 2304, 3072} against 220-228 for MKL's sgemm, 134-187 for MKL's sgemm in
per-thread tiles and 142-158 for braze's own packed kernel (packed_gemm.py) with its 12 x 16
micro-kernel; with its 6 x 64 one (2026-11-27, session 11) braze's kernel took 0.8-0.95x this
one's time at those shapes. Which of them a weight shape gets is measured per machine
(gemm_choice.py)."""
from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

from ..address import address
from ..plan import aligned_empty
from . import blas, native

__all__ = ["available", "MklPackedWeight", "pack", "gemm"]

_ROW_MAJOR, _NO_TRANS, _B_MATRIX, _PACKED = 101, 111, 162, 151  # CBLAS enums

_P, _INT = ctypes.c_void_p, ctypes.c_int


class _Mkl:
    def __init__(self, lib):
        self.compute = lib.cblas_sgemm_compute
        self.compute.argtypes = [_INT] * 6 + [_P, _INT, _P, _INT, ctypes.c_float, _P, _INT]
        self.compute.restype = None
        self.size = lib.cblas_sgemm_pack_get_size
        self.size.argtypes, self.size.restype = [_INT] * 4, ctypes.c_size_t
        self.pack = lib.cblas_sgemm_pack
        self.pack.argtypes = [_INT] * 6 + [ctypes.c_float, _P, _INT, _P]
        self.pack.restype = None


@cache
def _mkl() -> _Mkl | None:
    lib = blas.mkl_library()
    if lib is None:
        return None
    try:
        return _Mkl(lib)
    except AttributeError:
        return None


def available() -> bool:
    """Whether MKL's packed sgemm runs here (MKL loaded, a C compiler for the epilogue)."""
    return _mkl() is not None and native.lib() is not None


class MklPackedWeight:
    """A float32 [K, N] weight packed once by MKL (its internal layout, 64-byte aligned)."""

    def __init__(self, w: np.ndarray):
        mkl = _mkl()
        self.k, self.n = (int(x) for x in w.shape)
        src = np.ascontiguousarray(w, np.float32)
        size = int(mkl.size(_B_MATRIX, 1, self.n, self.k))
        self.packed = aligned_empty(size, np.uint8)
        mkl.pack(_ROW_MAJOR, _B_MATRIX, _NO_TRANS, 1, self.n, self.k, 1.0, address(src),
                 self.n, address(self.packed))


def pack(w: np.ndarray) -> MklPackedWeight | None:
    """`w` packed for `gemm`, or None when MKL's packed sgemm is not here or w is no 2-D
    float32 matrix."""
    if not available() or not isinstance(w, np.ndarray) or w.ndim != 2 or w.size == 0 \
            or w.dtype != np.float32:
        return None
    return MklPackedWeight(w)


def gemm(x: np.ndarray, w: MklPackedWeight, out: np.ndarray, bias: np.ndarray | None,
         act: int) -> bool:
    """out = act(x @ w + bias) for x [..., K] and out [..., N] (float32, C-contiguous; bias [N]
    contiguous float32 or None; act a c_snippets.ACT_CODES value). False, with nothing written,
    when the operands don't fit."""
    if x.ndim < 1 or x.shape[-1] != w.k or out.shape[-1] != w.n:
        return False
    if x.dtype != np.float32 or out.dtype != np.float32:
        return False
    if not x.flags.c_contiguous or not out.flags.c_contiguous:
        return False
    rows = x.size // max(w.k, 1)
    if out.size != rows * w.n:
        return False
    if bias is not None and (bias.dtype != np.float32 or bias.shape != (w.n,)
                             or not bias.flags.c_contiguous):
        return False
    if rows:
        _mkl().compute(_ROW_MAJOR, _NO_TRANS, _PACKED, rows, w.n, w.k, address(x), w.k,
                       address(w.packed), w.n, 0.0, address(out), w.n)
        if bias is not None or act:  # the epilogue over the rows, one parallel pass
            native.lib().bias_act(address(out), None if bias is None else address(bias),
                                  rows, w.n, act)
    return True
