"""Compile C source with the system compiler into a shared library, cached on disk by the
source's hash, the flags and this machine (compiler and CPU: `-march=native` code must not
travel to another CPU through a shared home directory), as TorchInductor's CPU backend does.
`FLAGS` (`-O3 -march=native -ffast-math -fopenmp`) let glibc's libmvec vectorize expf / tanhf /
erff in the native kernels; `PRECISE_FLAGS` keep IEEE NaN / inf semantics for code that brings
its own vector math (the generated element-wise regions), and signed integers wrap on
overflow as NumPy's do (`-fwrapv`: without it the compiler may assume -x > 1 means x < -1).
Libraries are linked without -ffast-math: GCC before 13 otherwise links crtfastmath.o into
the .so, whose constructor turns on flush-to-zero for the whole process when it loads
(NumPy's denormals then read as 0). No compiler: `available()` is False and the executor
keeps its NumPy kernels.

The cache lives in $BRAZE_CACHE_DIR, else ~/.cache/braze/kernels (where neither can be written,
a temporary folder for the process: `cache_dir`); a file lock makes concurrent
processes build a library once, and a cached library that is not the whole one built for its
key (truncated, emptied, overwritten) is built again (`_intact`)."""
from __future__ import annotations

import atexit
import ctypes
import fcntl
import hashlib
import os
import platform
import shutil
import struct
import subprocess
import tempfile
import warnings
from functools import cache
from pathlib import Path

__all__ = ["available", "why_not_compiled", "note_failure", "compile_c", "load_library",
           "library_key", "is_built", "build_library",
           "set_omp_spin", "release_caller",
           "cache_dir", "FLAGS",
           "cpu_flags",
           "PRECISE_FLAGS", "CompileError", "simd_math_decls", "PARALLEL_MIN_ELEMENTS",
           "PARALLEL_MIN_NORM_ELEMENTS", "PARALLEL_MIN_MACS", "team_size", "parallel_min_define",
           "usable_cpus"]

FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-std=c11")
PRECISE_FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math",
                 "-ffp-contract=fast", "-fwrapv", "-fopenmp", "-fPIC", "-std=gnu11")
_LINK_FLAGS = ("-shared", "-fopenmp")
_LOADED: dict[str, ctypes.CDLL] = {}


class CompileError(RuntimeError):
    """The system compiler rejected generated code (a braze bug: the message has the log)."""


@cache
def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def available() -> bool:
    return compiler() is not None and os.environ.get("BRAZE_NO_CC") != "1"


_FAILURES: list[str] = []  # the first line of each CompileError a kernel fell back on


def why_not_compiled() -> str | None:
    """Why C kernels fell back (for the dispatch report): no compiler, BRAZE_NO_CC=1, or
    the first compile failure of this process; None when none did."""
    if compiler() is None:
        return "no C compiler found (cc, gcc, clang or $CC): C kernels are off; install one"
    if os.environ.get("BRAZE_NO_CC") == "1":
        return "BRAZE_NO_CC=1: C kernels are off"
    return f"some C kernels did not build: {_FAILURES[0]}" if _FAILURES else None


def note_failure(e: CompileError) -> None:
    """Remember a CompileError a kernel fell back on (see why_not_compiled)."""
    text = str(e).strip()
    lines = text.splitlines()
    _FAILURES.append(" / ".join(lines[:2])[:300] if lines else type(e).__name__)


PARALLEL_MIN_ELEMENTS = 1 << 21
"""Memory-bound kernels (norms, softmax, epilogues, RoPE, element-wise regions) over fewer
elements than this run on the calling thread alone. An OpenMP region ends at a barrier every
thread of the team must reach; on a busy machine the second thread may wait milliseconds for
a core, while the whole of a [128, 768] LayerNorm takes 0.06 ms on one. GPT-2 at batch 1 spent
18% of its time in 24 such LayerNorms (12-20 ms each) at load average 5, and MiniLM at batch 8
13% in [1024, 384] ones (8 ms each) with the bar at 2^18."""


PARALLEL_MIN_NORM_ELEMENTS = 1 << 18
"""Row norms (LayerNorm, RMSNorm, with or without their residual sum) take both threads from
this many elements on: a [1024, 768] residual LayerNorm on one thread was 10% of BERT-base's
batch-8 bf16 call. Measured in one process, the two bars alternating: BERT b8 bf16 0.88-0.91x
the time with 2^21, MiniLM b8 0.975x, LLaMA b8 0.95-0.96x on the quiet 2-core VM; MiniLM b8
1.06-1.09x with one busy process beside it (the barrier waits for a core, as above)."""


PARALLEL_MIN_MACS = 1 << 22
"""Compute-bound kernels (GEMM, attention) of fewer multiply-adds than this (~4.2M, about
0.1-0.3 ms on one core) run on the calling thread alone, MKL included. At load average 12 on
the 2-core machine, bert-tiny's 16x64x64 GEMMs forked a team of two and waited 10-25 ms at the
barrier for the second thread to get a core."""


def team_size(work: int, minimum: int, threads: int) -> int:
    """The threads a parallel region of `work` units (elements against PARALLEL_MIN_ELEMENTS,
    multiply-adds against PARALLEL_MIN_MACS) should use out of `threads`: all of them from
    `minimum` on, else 1. The C kernels apply the same rule through BRAZE_PARALLEL."""
    return max(1, threads) if work >= minimum else 1


def usable_cpus() -> int:
    """The CPUs this process may run on: the most threads a `threads=` cap asks for (OpenMP
    tried to start a team of each thread asked for: threads=100000 died in libgomp)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def parallel_min_define() -> str:
    """The shared parallel-work rule for C sources: `BRAZE_PAR_MIN` (elements),
    `BRAZE_NORM_PAR_MIN` (elements of a row norm),
    `BRAZE_PAR_MIN_MACS` (multiply-adds) and `BRAZE_PARALLEL(work, minimum)`, the condition of
    an `omp parallel ... if()` (team_size's rule)."""
    return (f"#define BRAZE_PAR_MIN {PARALLEL_MIN_ELEMENTS}LL\n"
            f"#define BRAZE_NORM_PAR_MIN {PARALLEL_MIN_NORM_ELEMENTS}LL\n"
            f"#define BRAZE_PAR_MIN_MACS {PARALLEL_MIN_MACS}LL\n"
            "#define BRAZE_PARALLEL(work, minimum) ((int64_t)(work) >= (minimum))\n")


@cache
def simd_math_decls() -> str:
    """C declarations that let GCC call glibc's vector erff (libmvec, glibc >= 2.35: 8 lanes
    under AVX2) in `omp simd` loops; math.h declares expf / tanhf that way but not erff, which
    stayed a scalar call (GELU's epilogue ran at a third of the GEMM's speed). Empty on other
    C libraries, where erff stays scalar."""
    if glibc_version() < (2, 35):
        return ""
    return "#pragma omp declare simd notinbranch\nfloat erff(float);\n"


@cache
def glibc_version() -> tuple[int, int]:
    """(major, minor) of the running glibc; (0, 0) on other C libraries."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        major, minor = (int(x) for x in version.split(".")[:2])
    except (ValueError, OSError, AttributeError):
        return (0, 0)
    return (major, minor) if name == "glibc" else (0, 0)


def cache_dir() -> Path:
    """The folder kernels are built into: `configured_dir()`, created; one that cannot be
    created or written (a file in its place, a read-only home or file system) gives way to a
    private temporary folder for this process, with a RuntimeWarning naming both (the kernels
    are built again in each process then)."""
    return _writable(configured_dir())


def configured_dir() -> Path:
    """$BRAZE_CACHE_DIR, else ~/.cache/braze/kernels (it may not exist, or be read-only)."""
    base = os.environ.get("BRAZE_CACHE_DIR")
    return Path(base) if base else Path.home() / ".cache" / "braze" / "kernels"


_SCRATCH: dict[Path, Path] = {}  # an unusable cache folder -> this process's stand-in


def _writable(d: Path) -> Path:
    if d in _SCRATCH:
        return _SCRATCH[d]
    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=d):
            return d
    except OSError as e:
        scratch = _SCRATCH[d] = Path(tempfile.mkdtemp(prefix="braze-kernels-"))
        atexit.register(shutil.rmtree, scratch, ignore_errors=True)
        warnings.warn(f"braze: the kernel cache {d} cannot be used ({e.strerror or e}): "
                      f"kernels are built in {scratch} for this process; set BRAZE_CACHE_DIR "
                      "to a writable folder", RuntimeWarning, stacklevel=2)
        return scratch


@cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (/proc/cpuinfo; empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[-1].split())
    except OSError:
        pass
    return frozenset()


@cache
def machine_tag() -> str:
    """What `-march=native` code depends on: the compiler (path, version) and the CPU (model,
    feature flags), hashed."""
    parts = [platform.machine(), compiler() or ""]
    try:
        parts.append(subprocess.run([compiler() or "cc", "--version"], capture_output=True,
                                    text=True, timeout=30).stdout.split("\n")[0])
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            info = [line for line in f.read().split("\n")[:40]
                    if line.startswith(("model name", "flags", "vendor_id", "cpu family"))]
        parts.extend(info)
    except OSError:
        parts.append(platform.processor())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def load_library(source: str, name: str, signatures: dict,
                 flags: tuple[str, ...] = FLAGS) -> ctypes.CDLL | None:
    """`compile_c(source, name, flags)` with each function's ctypes signature set, or None
    when there is no compiler or it rejects the source (callers keep their NumPy paths then).
    `signatures` maps a function name to its argtypes list (returning void) or to an
    `(argtypes, restype)` pair."""
    if not available():
        return None
    try:
        so = compile_c(source, name, flags)
    except CompileError as e:
        note_failure(e)
        return None
    for fn_name, sig in signatures.items():
        args, res = sig if isinstance(sig, tuple) else (sig, None)
        fn = getattr(so, fn_name)
        fn.argtypes, fn.restype = args, res
    return so


_CALLER_CPUS: list = []  # the CPUs threads may run on, before OpenMP's binding (if braze set it)
_BINDING = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")


def set_omp_spin() -> None:
    """OpenMP's settings, before libgomp loads (compile_c and the MKL loader call it):
    - GOMP_SPINCOUNT=20000 unless the user chose a spin or wait policy (see compile_c);
    - OMP_PROC_BIND=close, OMP_PLACES=cores unless the user set a binding or
      BRAZE_BIND_THREADS=0: each worker stays on its core. Unbound, a worker that had slept
      took ~1 ms to run again on the 2-core Zen 4 VM (`bench/omp_wake.py`: 1.1 ms after 64-200
      ms idle, the next region 0.55 ms), bound ~0.1 ms: every call after a pause paid it.
      libgomp binds the thread that loads it too; `release_caller` gives it its CPUs back,
      and the variables are dropped once libgomp has read them (`_forget_binding`)."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", "20000")
    if os.environ.get("BRAZE_BIND_THREADS", "1") == "0" or _CALLER_CPUS or \
            any(name in os.environ for name in _BINDING) or not hasattr(os, "sched_getaffinity"):
        return
    _CALLER_CPUS.append(frozenset(os.sched_getaffinity(0)))
    os.environ["OMP_PROC_BIND"], os.environ["OMP_PLACES"] = "close", "cores"
    os.environ["BRAZE_OMP_BINDING"] = "1"


def _forget_binding() -> None:
    """Drop the binding variables braze set, once libgomp (a kernel library's dependency) has
    read them: another OpenMP runtime loaded later in the process (torch bundles its own)
    would bind the thread that loads it, and every pool that thread then starts."""
    if _CALLER_CPUS and os.environ.get("BRAZE_OMP_BINDING") == "1":
        for name in ("OMP_PROC_BIND", "OMP_PLACES", "BRAZE_OMP_BINDING"):
            os.environ.pop(name, None)


def release_caller() -> None:
    """The calling thread back on every CPU it had before libgomp bound it to the first core
    (only where braze asked for the binding): the workers stay bound, and the caller's other
    work (another library's thread pool started from it, say) keeps every core."""
    if _CALLER_CPUS and os.sched_getaffinity(0) != _CALLER_CPUS[0]:
        os.sched_setaffinity(0, _CALLER_CPUS[0])


def compile_c(source: str, name: str = "kernel", flags: tuple[str, ...] = FLAGS
              ) -> ctypes.CDLL:
    """The loaded library built from `source` with `flags` (compiled once per source text,
    flags and machine).

    OpenMP's idle threads spin briefly, then sleep (GOMP_SPINCOUNT=20000 unless the user set
    it or OMP_WAIT_POLICY): MKL (GNU threading layer) and these kernels share one pool, so a
    short spin catches the next kernel's parallel region without a futex wake-up, and never
    holds a core for long. On the shared 2-core machine this kept MiniLM's latency at 47-61 ms
    where sleeping at once (PASSIVE) gave 47-74 ms and the default 300000 spins up to 80 ms;
    unbounded spinning (ACTIVE) was 6x slower under load."""
    set_omp_spin()
    key = library_key(source, flags)
    if key in _LOADED:
        return _LOADED[key]
    lib_path = build_library(source, name, flags)
    try:
        lib = ctypes.CDLL(str(lib_path))
    except OSError as e:  # a cache on a noexec mount, a missing libgomp, ...
        raise CompileError(f"could not load the kernel library {lib_path}: {e}") from e
    release_caller()
    _forget_binding()   # libgomp has read it: later OpenMP runtimes (torch's copy) must not
    _LOADED[key] = lib
    return lib


def library_key(source: str, flags: tuple[str, ...] = FLAGS) -> str:
    """The cache key of the library built from `source` with `flags` on this machine."""
    recipe = "\0".join((" ".join(flags), " ".join(_LINK_FLAGS), machine_tag()))
    return hashlib.sha256((source + "\0" + recipe).encode()).hexdigest()[:20]


def is_built(source: str, name: str, flags: tuple[str, ...] = FLAGS) -> bool:
    """Whether the library for `source` is loaded or intact in the cache (no build needed)."""
    key = library_key(source, flags)
    return key in _LOADED or _intact(configured_dir() / f"{name}_{key}.so", key) or \
        _intact(cache_dir() / f"{name}_{key}.so", key)


def build_library(source: str, name: str = "kernel", flags: tuple[str, ...] = FLAGS) -> Path:
    """The path of the library built from `source` with `flags` in the kernel cache, built
    first unless it is there intact; it is not loaded. Safe from several threads and
    processes (a file lock per key): builds.build_all runs it in parallel."""
    key = library_key(source, flags)
    lib_path = configured_dir() / f"{name}_{key}.so"  # a read-only cache may hold it
    if not _intact(lib_path, key):
        d = cache_dir()
        lib_path = d / lib_path.name
        with open(d / f".{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _intact(lib_path, key):
                _build(source + _marker(key), lib_path, flags)
    return lib_path


def _marker(key: str) -> str:
    """C text that stores the cache key in the library's bytes (`_intact` looks for it)."""
    return f'\nstatic const char braze_cache_key[] __attribute__((used)) = "{_MARK}{key}";\n'


_MARK = "braze-cache-key:"


def _intact(path: Path, key: str) -> bool:
    """Whether `path` holds the whole library built for `key`: an ELF file whose section
    headers (the last thing the linker writes) lie inside it, carrying `key`'s marker. A
    cached library that is truncated (dlopen then dies of SIGBUS), empty, garbage, for
    another machine or built from another source under the name (its functions missing) is
    built again instead of loaded."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        return False
    order = "<" if data[5] == 1 else ">"
    if data[4] == 2:   # ELF64: e_shoff at 0x28, e_shentsize and e_shnum at 0x3a
        (shoff,), (entsize, count) = (struct.unpack_from(order + "Q", data, 0x28),
                                      struct.unpack_from(order + "HH", data, 0x3A))
    else:              # ELF32: e_shoff at 0x20, e_shentsize and e_shnum at 0x2e
        (shoff,), (entsize, count) = (struct.unpack_from(order + "I", data, 0x20),
                                      struct.unpack_from(order + "HH", data, 0x2E))
    return shoff + entsize * count <= len(data) and (_MARK + key).encode() in data


def _build(source: str, out: Path, flags: tuple[str, ...]) -> None:
    """Compile and link `source` in a scratch folder next to `out` (os.replace cannot move a
    file across file systems: a tmpfs /tmp under a cache on disk failed with EXDEV), which is
    the compiler's TMPDIR too (an unwritable $TMPDIR failed every build), then move the
    library into place in one step."""
    cc = compiler()
    if cc is None:
        raise CompileError("no C compiler found (set CC)")
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".build-") as tmp:
        src = Path(tmp) / "k.c"
        src.write_text(source)
        obj, part = Path(tmp) / "k.o", Path(tmp) / "k.so"
        env = {**os.environ, "TMPDIR": tmp}
        for cmd in ([cc, *flags, "-c", str(src), "-o", str(obj)],
                    [cc, *_LINK_FLAGS, str(obj), "-o", str(part), "-lm"]):
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, env=env)
            except OSError as e:  # CC names something that does not run
                raise CompileError(f"the C compiler {cc} could not run ({e}): set CC to a "
                                   "working C compiler") from e
            if res.returncode != 0:
                raise CompileError(f"the C compiler {cc} failed (exit {res.returncode}) on "
                                   "generated code:\n" + res.stderr[-4000:])
        if not part.is_file():
            raise CompileError(f"the C compiler {cc} wrote no library: set CC to a working "
                               "C compiler")
        os.replace(part, out)
