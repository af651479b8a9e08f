"""The thread limit of one executable call: `bz.compile(..., threads=n)` runs every kernel
with at most n threads, OpenMP (braze's C kernels) and MKL (its GEMMs, direct or inside braze's
regions) alike, and puts the caller's settings back afterwards, so executables with different
limits share a process. With threads=1 no parallel region forks a team and MKL runs sequential.

Before this, `threads` reached only numba, whose OpenMP layer set the process's OpenMP team to
every core on first use (even under OMP_NUM_THREADS=1): on the loaded 2-core machine each
small GEMM region of bert-tiny then waited 10-25 ms at its barrier for a second thread."""
from __future__ import annotations

import os

from ..codegen import cc
from . import blas, native

__all__ = ["ThreadLimit", "forked"]

_FORKED = [False]  # set in a child of os.fork


def _after_fork_in_child() -> None:
    _FORKED[0] = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def forked() -> bool:
    """Whether this process is a child of os.fork. libgomp is not fork-safe: the child has the
    parent's thread-pool state but not its threads, so a parallel region of more than one
    thread waits forever at its barrier (an executable of threads=2 called in a fork-started
    multiprocessing worker hung every time). A child's calls run on one thread."""
    return _FORKED[0]


class ThreadLimit:
    """`with ThreadLimit(n):` caps OpenMP and MKL at n threads on the calling thread; n None or
    0 leaves them as they are."""

    __slots__ = ("limit", "_omp_before", "_mkl_before")

    def __init__(self, limit: int | None):
        self.limit = int(limit) if limit else 0
        self._omp_before = 0
        self._mkl_before = 0

    def __enter__(self) -> ThreadLimit:
        limit = 1 if forked() else self.limit
        if limit:
            lib = native.lib()
            if lib is not None:
                self._omp_before = lib.braze_max_threads()
                lib.braze_set_threads(limit)
            self._mkl_before = blas.set_local_threads(limit)
        return self

    def __exit__(self, *exc) -> None:
        cc.release_caller()  # libgomp or MKL may have loaded (and bound this thread) in the call
        if self.limit or forked():
            lib = native.lib()
            if lib is not None:
                lib.braze_set_threads(self._omp_before)
            blas.set_local_threads(self._mkl_before)
