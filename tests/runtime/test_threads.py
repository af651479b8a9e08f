"""The thread rule: `threads=1` and `threads=2` executables agree with the interpreter (small
bindings take the one-thread paths, large ones the parallel GEMM / attention regions), a call
caps OpenMP and MKL at its executable's threads and restores the caller's settings, and the
shared work threshold picks one thread for small work, the same in Python and in C."""
import ctypes
import os

import numpy as np
import pytest

import braze as bz
import braze.models as models
from braze.runtime.codegen import cc
from braze.runtime.kernels import blas, native
from braze.runtime.kernels.threads import ThreadLimit

needs_cc = pytest.mark.skipif(native.lib() is None, reason="no C compiler")


def test_team_size_is_one_thread_below_the_bar_and_all_from_it():
    assert cc.team_size(16 * 64 * 64, cc.PARALLEL_MIN_MACS, 2) == 1
    assert cc.team_size(cc.PARALLEL_MIN_MACS - 1, cc.PARALLEL_MIN_MACS, 8) == 1
    assert cc.team_size(cc.PARALLEL_MIN_MACS, cc.PARALLEL_MIN_MACS, 8) == 8
    assert cc.team_size(4 * cc.PARALLEL_MIN_ELEMENTS, cc.PARALLEL_MIN_ELEMENTS, 2) == 2
    assert cc.team_size(10 ** 9, cc.PARALLEL_MIN_MACS, 1) == 1
    assert cc.team_size(10 ** 9, cc.PARALLEL_MIN_MACS, 0) == 1


@needs_cc
def test_the_c_rule_is_team_sizes_rule():
    src = ("#include <stdint.h>\n" + cc.parallel_min_define()
           + "int par_macs(int64_t w) { return BRAZE_PARALLEL(w, BRAZE_PAR_MIN_MACS); }\n"
           + "int par_elems(int64_t w) { return BRAZE_PARALLEL(w, BRAZE_PAR_MIN); }\n")
    so = cc.compile_c(src, "test_parallel_rule")
    for fn, bar in ((so.par_macs, cc.PARALLEL_MIN_MACS), (so.par_elems, cc.PARALLEL_MIN_ELEMENTS)):
        fn.argtypes, fn.restype = [ctypes.c_int64], ctypes.c_int
        for work in (0, 1024, bar - 1, bar, bar + 1, 50 * bar):
            assert bool(fn(work)) == (cc.team_size(work, bar, 2) == 2), (work, bar)


@needs_cc
def test_thread_limit_caps_openmp_and_mkl_and_restores_them():
    lib = native.lib()
    omp_before = lib.braze_max_threads()
    mkl_before = blas.set_local_threads(0)  # 0: MKL's global count
    with ThreadLimit(1):
        assert lib.braze_max_threads() == 1
        if blas.local_threads_address() is not None:
            assert blas.set_local_threads(1) == 1  # the previous setting was the limit
    assert lib.braze_max_threads() == omp_before
    assert blas.set_local_threads(mkl_before) == 0
    with ThreadLimit(None):
        assert lib.braze_max_threads() == omp_before


@pytest.mark.parametrize("sym", [{"batch": 1, "seq": 4}, {"batch": 2, "seq": 64}],
                         ids=["small", "parallel"])
def test_threads_1_and_2_agree_with_the_interpreter(sym):
    g = models.bert_encoder(2, 256, 4, batch="batch", seq="seq", with_mask=True)
    params = bz.init_params(g, 0)
    one = bz.compile(g, params=params, threads=1)
    two = bz.compile(g, params=params, threads=2)
    feeds = bz.random_feeds(g, 3, sym)
    want = bz.interpret(g, feeds, params)
    omp_before = native.lib().braze_max_threads() if native.lib() is not None else None
    for _ in range(2):  # twice: the arena and the thread settings are reused
        got_one, got_two = one(feeds), two(feeds)
        for w, a, b in zip(want, got_one, got_two, strict=True):
            np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)
    if omp_before is not None:  # the calls put the caller's OpenMP setting back
        assert native.lib().braze_max_threads() == omp_before


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2
                    or not os.path.exists("/proc/self/task"), reason="needs Linux and 2 CPUs")
def test_openmp_workers_are_bound_and_the_caller_keeps_its_cpus():
    """braze asks libgomp to bind its workers (OMP_PROC_BIND / OMP_PLACES, unless the user
    set a binding or BRAZE_BIND_THREADS=0) and drops the variables once libgomp has read
    them; libgomp also binds the thread that loads it, and braze gives that thread its CPUs
    back after loading and after every call. Printed: the variables left, whether the caller
    kept its CPUs, and how many of the process's threads are bound to one CPU."""
    import subprocess
    import sys

    code = (
        "import os, braze as bz\n"
        "from braze.models import resnet_basic_block\n"
        "cpus = os.sched_getaffinity(0)\n"
        "g = resnet_basic_block(seed=0)\n"
        "exe = bz.compile(g, threads=2)\n"
        "exe(bz.random_feeds(g, 0))\n"
        "one = 0\n"
        "for t in os.listdir('/proc/self/task'):\n"
        "    one += len(os.sched_getaffinity(int(t))) == 1\n"
        "print(os.environ.get('OMP_PROC_BIND'), os.sched_getaffinity(0) == cpus, one > 0)\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY",
                        "BRAZE_BIND_THREADS", "BRAZE_OMP_BINDING")}

    def run(**extra):
        done = subprocess.run([sys.executable, "-c", code], env={**env, **extra},
                              capture_output=True, text=True, check=True)
        return done.stdout.split()

    assert run() == ["None", "True", "True"]  # a worker bound, the caller free, env dropped
    assert run(OMP_PROC_BIND="false") == ["false", "True", "False"]  # the user's choice
    assert run(BRAZE_BIND_THREADS="0") == ["None", "True", "False"]


def test_a_cap_above_the_cpus_is_the_cpu_count():
    """threads=100000 asked OpenMP for a team of 100000 (a segfault in libgomp); the cap
    is the CPUs the process may use, and the results stay the interpreter's."""
    g = bz.Graph("wide")
    x = g.input("x", bz.Shape((256, 64)))
    g.set_outputs([g.gelu(g.mm(x, g.param("w", bz.Shape((64, 96)))))])
    params = bz.init_params(g, seed=0)
    exe = bz.compile(g, params=params, threads=100_000)
    assert exe.threads == cc.usable_cpus()
    feeds = {"x": np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)}
    np.testing.assert_allclose(exe(feeds)[0], bz.interpret(g, feeds, params)[0], rtol=1e-4,
                               atol=1e-5)


@needs_cc
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")
def test_a_forked_child_runs_an_executable_of_two_threads():
    """libgomp is not fork-safe: a child of os.fork (a fork-started multiprocessing worker)
    calling an executable of threads=2 after the parent had run it hung at an OpenMP barrier,
    every time; a child's calls run on one thread."""
    import time

    g = models.bert_tiny()
    exe = bz.compile(g, params=bz.init_params(g, 0), threads=2)
    feeds = bz.random_feeds(g, 0)
    want = exe(feeds)[0]
    for _ in range(3):
        pid = os.fork()
        if pid == 0:  # the child: exit 0 when the call returns the parent's result
            os._exit(0 if np.allclose(exe(feeds)[0], want, rtol=1e-5, atol=1e-5) else 3)
        start = time.monotonic()
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            if time.monotonic() - start > 30:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                pytest.fail("the forked child hung")
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(done[1]) == 0
        exe(feeds)  # the parent's pool still works
