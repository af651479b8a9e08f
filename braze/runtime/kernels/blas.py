"""The GEMM provider for the executor's kernels, chosen once per process:

- MKL's cblas_sgemm through ctypes when the `mkl` wheel is installed (braze[fast]), loaded with
  the GNU OpenMP threading layer, so BLAS and braze's C kernels share one OpenMP thread pool
  (two pools on the same cores slow each other down badly once the machine is busy);
- otherwise NumPy's matmul (its bundled BLAS).

`matmul(a, b, out)` computes out = a @ b for float32 a [..., M, K] (any leading dims, or
batched with b [..., K, N]) into the preallocated `out`."""
from __future__ import annotations

import ctypes
import glob
import os
import sys
from functools import cache

import numpy as np

from ..address import address
from ..codegen import cc
from . import native

__all__ = ["matmul", "provider", "sgemm_address", "local_threads_address", "set_local_threads",
           "mkl_library"]

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


@cache
def _mkl():
    if os.environ.get("BRAZE_BLAS", "").lower() == "numpy":
        return None
    os.environ.setdefault("MKL_THREADING_LAYER", "GNU")
    cc.set_omp_spin()  # the shared pool's short spin
    os.environ.setdefault("MKL_INTERFACE_LAYER", "LP64")
    candidates = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")))
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
            cc.release_caller()
            fn = lib.cblas_sgemm
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int,
                                            ctypes.c_void_p, ctypes.c_int, ctypes.c_float,
                                            ctypes.c_void_p, ctypes.c_int]
        fn.restype = None
        _LOCAL_THREADS[:] = [getattr(lib, "MKL_Set_Num_Threads_Local", None)]
        _LIBRARY[:] = [lib]
        return fn
    return None


_LOCAL_THREADS: list = []  # MKL's C-API MKL_Set_Num_Threads_Local, once MKL is loaded
_LIBRARY: list = []  # the loaded libmkl_rt


def mkl_library() -> ctypes.CDLL | None:
    """The loaded MKL runtime library (for its other entry points), or None without MKL."""
    return _LIBRARY[0] if _mkl() is not None and _LIBRARY else None


def local_threads_address() -> int | None:
    """The address of MKL's `int MKL_Set_Num_Threads_Local(int n)` (the calling thread's GEMMs
    use n threads, 0 = the global count; returns the previous setting), or None without MKL.
    C kernels run small GEMMs on one thread with it."""
    if _mkl() is None or not _LOCAL_THREADS or _LOCAL_THREADS[0] is None:
        return None
    return ctypes.cast(_LOCAL_THREADS[0], ctypes.c_void_p).value


def set_local_threads(n: int) -> int:
    """MKL's thread count for the calling thread's GEMMs from now on (0: the global count);
    returns the previous setting, or 0 (and does nothing) without MKL."""
    if _mkl() is None or not _LOCAL_THREADS or _LOCAL_THREADS[0] is None:
        return 0
    return int(_LOCAL_THREADS[0](int(n)))


def sgemm_address() -> int | None:
    """The address of MKL's cblas_sgemm for C kernels that call it themselves, or None."""
    fn = _mkl()
    return None if fn is None else ctypes.cast(fn, ctypes.c_void_p).value


def provider() -> str:
    return "mkl" if _mkl() is not None else "numpy"


def _gemm2d(fn, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """out = a @ b with MKL for 2-D operands whose rows are contiguous; False if it can't."""
    if a.dtype != np.float32 or b.dtype != np.float32 or out.dtype != np.float32:
        return False
    if a.strides[1] != 4 or out.strides[1] != 4 or not out.flags.c_contiguous:
        return False
    m, k = a.shape
    n = b.shape[1]
    lda = _leading(m, k, a.strides[0])
    if b.strides[1] == 4:
        tb, ldb = _NO_TRANS, _leading(k, n, b.strides[0])
    elif b.strides[0] == 4:
        tb, ldb = _TRANS, _leading(n, k, b.strides[1])
    else:
        return False
    if lda is None or ldb is None:
        return False
    fn(_ROW_MAJOR, _NO_TRANS, tb, m, n, k, 1.0, address(a), lda, address(b), ldb, 0.0,
       address(out), n)
    return True


def _batched(fn, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """out[i] = a[i] @ b[i] for 3-D float32 operands in one native call (native.batched_gemm:
    the batch over the OpenMP threads, one sequential sgemm each) when every matrix has the
    same strides and rows that MKL can read; False (nothing written) otherwise."""
    lib = native.lib()
    if lib is None or a.dtype != np.float32 or b.dtype != np.float32 or \
            out.dtype != np.float32 or not out.flags.c_contiguous or len(a) < 2:
        return False
    _, m, k = a.shape
    n = b.shape[2]
    if a.strides[2] != 4 or a.strides[0] % 4 or b.strides[0] % 4:
        return False
    lda = _leading(m, k, a.strides[1])
    if b.strides[2] == 4:
        trans, ldb = 0, _leading(k, n, b.strides[1])
    elif b.strides[1] == 4:
        trans, ldb = 1, _leading(n, k, b.strides[2])
    else:
        return False
    if lda is None or ldb is None or a.strides[0] < 0 or b.strides[0] < 0:
        return False
    lib.batched_gemm(sgemm_address(), local_threads_address(), address(a),
                     a.strides[0] // 4, lda, address(b), b.strides[0] // 4, ldb, trans,
                     address(out), m, n, k, len(a))
    return True


def _leading(rows: int, cols: int, row_stride: int) -> int | None:
    """The BLAS leading dimension of a row-major float32 block whose rows are `row_stride`
    bytes apart, or None when rows overlap (a view broadcast along them, stride 0): BLAS takes
    no leading dimension below the row length. A single row may have any stride."""
    if rows <= 1:
        return max(cols, 1)
    if row_stride % 4 or row_stride < 4 * max(cols, 1):
        return None
    return row_stride // 4


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = a @ b (NumPy matmul semantics for the shapes braze's kernels use). MKL runs a
    product of fewer than cc.PARALLEL_MIN_MACS multiply-adds on the calling thread alone (left
    to itself it starts a team even for 16x64x64)."""
    fn = _mkl()
    if fn is None:
        return np.matmul(a, b, out=out)
    small = a.size * b.shape[-1] < cc.PARALLEL_MIN_MACS
    before = set_local_threads(1) if small else 0
    try:
        return _mkl_matmul(fn, a, b, out)
    finally:
        if small:
            set_local_threads(before)


def _mkl_matmul(fn, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out = a @ b through MKL where the operands allow it, else NumPy."""
    if b.ndim == 2 and a.ndim >= 2 and (a.ndim == 2 or a.flags.c_contiguous):
        a2 = a.reshape(-1, a.shape[-1])
        if _gemm2d(fn, a2, b, out.reshape(-1, out.shape[-1])):
            return out
    elif a.ndim == b.ndim >= 3 and a.shape[:-2] == b.shape[:-2] and \
            out.flags.c_contiguous:
        a3 = a.reshape(-1, *a.shape[-2:])
        b3 = b.reshape(-1, *b.shape[-2:])
        o3 = out.reshape(-1, *out.shape[-2:])
        if _batched(fn, a3, b3, o3) or all(_gemm2d(fn, x, y, z) for x, y, z in zip(a3, b3, o3)):
            return out
    return np.matmul(a, b, out=out)
