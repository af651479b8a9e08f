"""The thread limit of one executable call: `bz.compile(..., threads=n)` runs every kernel
with at most n threads, OpenMP (braze's C kernels) and MKL (its GEMMs, direct or inside braze's
regions) alike, and puts the caller's settings back afterwards, so executables with different
limits share a process. With threads=1 no parallel region forks a team and MKL runs sequential.

Before this, `threads` reached only numba, whose OpenMP layer set the process's OpenMP team to
every core on first use (even under OMP_NUM_THREADS=1): on the loaded 2-core machine each
small GEMM region of bert-tiny then waited 10-25 ms at its barrier for a second thread."""
from __future__ import annotations

from ..codegen import cc
from . import blas, native

__all__ = ["ThreadLimit"]


class ThreadLimit:
    """`with ThreadLimit(n):` caps OpenMP and MKL at n threads on the calling thread; n None or
    0 leaves them as they are."""

    __slots__ = ("limit", "_omp_before", "_mkl_before")

    def __init__(self, limit: int | None):
        self.limit = int(limit) if limit else 0
        self._omp_before = 0
        self._mkl_before = 0

    def __enter__(self) -> ThreadLimit:
        if self.limit:
            lib = native.lib()
            if lib is not None:
                self._omp_before = lib.braze_max_threads()
                lib.braze_set_threads(self.limit)
            self._mkl_before = blas.set_local_threads(self.limit)
        return self

    def __exit__(self, *exc) -> None:
        cc.release_caller()  # libgomp or MKL may have loaded (and bound this thread) in the call
        if self.limit:
            lib = native.lib()
            if lib is not None:
                lib.braze_set_threads(self._omp_before)
            blas.set_local_threads(self._mkl_before)
