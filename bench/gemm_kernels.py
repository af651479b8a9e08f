"""float32 GEMM throughput at BERT-base shapes: braze's packed-weight kernel (packed_gemm.py,
weight packed once outside the timing) against NumPy's matmul (its OpenBLAS), MKL's
cblas_sgemm (whole matrix, MKL's own threading) and braze's previous path (gemm_bias_act:
MKL sgemm per output tile in one OpenMP region). Every method computes out = x @ w (+ bias,
+ GELU for the `_gelu` rows, which only the two braze kernels fuse) into a preallocated
output; the methods run interleaved, round by round, so machine load hits them alike. GFLOP/s
from the median and the best round. `--clock cpu` times process CPU time instead of wall time
(GFLOP per CPU second, all threads summed): on a loaded machine it shows the kernels' own cost
without the time the OS gives to other processes.

Each thread count runs in its own process (OMP_NUM_THREADS / OPENBLAS_NUM_THREADS /
MKL_NUM_THREADS are read when the libraries load).

    python bench/gemm_kernels.py [--threads 1,2] [--repeat 15] [--csv PATH]

`--model bert` (or gpt2, llama, minilm: executor_vs_peers' models) instead runs that model
end to end at seq 128 (batch 1, or `--batch B`), compiled twice in one process, with the packed
GEMM (the default) and with
BRAZE_PACKED_GEMM=0 (the previous MKL tiles), calls interleaved; it prints both and the
process RSS growth of each compile (the packed copies of the weights).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import subprocess
import sys
import time

SHAPES = [(m, k, n) for m in (128, 1024)
          for k, n in ((768, 2304), (768, 768), (768, 3072), (3072, 768))]
FIELDS = ["date", "machine", "load", "clock", "threads", "m", "k", "n", "method", "gflops_median",
          "gflops_best", "ms_median", "max_abs_err"]


def _methods(x, w, bias, out):
    """name -> zero-argument callable computing into `out` (or None when unavailable)."""
    import numpy as np  # noqa: PLC0415 - loaded after the thread env vars are set

    from braze.runtime.kernels import blas, fused, native  # noqa: PLC0415
    from braze.runtime.kernels import packed_gemm as pg  # noqa: PLC0415

    lib = native.lib()
    packed = pg.pack(w)
    gelu = native.ACT_CODES["gelu"]
    sgemm = blas._mkl()  # noqa: SLF001 - the raw cblas_sgemm, for the whole-matrix MKL row
    m, k = x.shape
    n = w.shape[1]
    methods = {
        "numpy_openblas": lambda: np.matmul(x, w, out=out),
        "braze_packed": lambda: pg.gemm(x, packed, out, None, 0),
        "braze_packed_gelu": lambda: pg.gemm(x, packed, out, bias, gelu),
    }
    if sgemm is not None:
        methods["mkl_sgemm"] = lambda: sgemm(101, 111, 111, m, n, k, 1.0, x.ctypes.data, k,
                                             w.ctypes.data, n, 0.0, out.ctypes.data, n)
        methods["braze_mkl_tiles"] = lambda: fused.gemm_bias_act(lib, x, w, out, None, 0)
        methods["braze_mkl_tiles_gelu"] = lambda: fused.gemm_bias_act(lib, x, w, out, bias, gelu)
    return methods


def _gelu(v, erf):
    return 0.5 * v * (1.0 + erf(v / 2 ** 0.5))


def _child(threads: int, repeat: int, csv_path: str, clock: str) -> None:
    import numpy as np  # noqa: PLC0415
    from scipy.special import erf  # noqa: PLC0415

    from braze.runtime.kernels import native  # noqa: PLC0415

    native.lib().braze_set_threads(threads)
    now = time.process_time if clock == "cpu" else time.perf_counter
    rng = np.random.default_rng(0)
    load = os.getloadavg()[0]
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    rows = []
    for m, k, n in SHAPES:
        x = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((k, n), dtype=np.float32) / np.float32(k ** 0.5)
        bias = rng.standard_normal(n, dtype=np.float32)
        out = np.empty((m, n), np.float32)
        methods = _methods(x, w, bias, out)
        exact = x.astype(np.float64) @ w.astype(np.float64)
        err = {}
        for name, fn in methods.items():
            out[...] = np.nan
            fn()
            want = _gelu(exact + bias, erf) if name.endswith("_gelu") else exact
            err[name] = float(np.abs(out - want).max())
        times = {name: [] for name in methods}
        for _ in range(repeat):
            for name, fn in methods.items():
                t0 = now()
                fn()
                times[name].append(now() - t0)
        flops = 2 * m * k * n
        for name, ts in times.items():
            med, best = float(np.median(ts)), min(ts)
            rows.append(dict(date=stamp, machine=platform.machine(), load=f"{load:.2f}",
                             clock=clock, threads=threads, m=m, k=k, n=n, method=name,
                             gflops_median=f"{flops / med / 1e9:.1f}",
                             gflops_best=f"{flops / best / 1e9:.1f}", ms_median=f"{med * 1e3:.3f}",
                             max_abs_err=f"{err[name]:.2e}"))
            print(f"t={threads} {m:5d} {k:5d} {n:5d} {name:22s} median {flops / med / 1e9:6.1f}"
                  f"  best {flops / best / 1e9:6.1f} GFLOP/s  err {err[name]:.1e}", flush=True)
    new = not os.path.exists(csv_path)
    with open(csv_path, "a", newline="") as f:
        wr = csv.DictWriter(f, FIELDS)
        if new:
            wr.writeheader()
        wr.writerows(rows)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def _cpu_interleaved_ms(calls: dict, repeat: int) -> dict:
    """{name: (median, fastest) ms of process CPU time}, calls interleaved round by round."""
    import numpy as np  # noqa: PLC0415

    times: dict = {k: [] for k in calls}
    for fn in calls.values():
        fn()
    for _ in range(repeat):
        for k, fn in calls.items():
            t0 = time.process_time()
            fn()
            times[k].append(time.process_time() - t0)
    return {k: (float(np.median(v)) * 1e3, min(v) * 1e3) for k, v in times.items()}


def _model_ab(name: str, repeat: int, threads: int, clock: str, batch: int = 1) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import executor_vs_peers as peers  # noqa: PLC0415 - bench/ sibling

    model = peers.load_model(name)
    feeds = peers.make_feeds(model, batch, 128)
    exes, rss = {}, {}
    for label, flag in (("mkl_tiles", "0"), ("packed", "1")):
        os.environ["BRAZE_PACKED_GEMM"] = flag
        before = _rss_mb()
        exe = peers.braze_executable(model, None, threads)
        exe(feeds)  # the program (and the packing) is built on the first call
        rss[label] = _rss_mb() - before
        exes[label] = exe
    os.environ.pop("BRAZE_PACKED_GEMM")
    a, b = (exes[k](feeds)[0] for k in ("mkl_tiles", "packed"))
    print(f"# {name} b{batch} s128, {threads} threads, {clock} time, "
          f"load {os.getloadavg()[0]:.2f}, "
          f"max |packed - mkl_tiles| {float(abs(a - b).max()):.2e}")
    calls = {k: (lambda e=e: e(feeds)) for k, e in exes.items()}
    res = (_cpu_interleaved_ms(calls, repeat) if clock == "cpu"
           else peers.interleaved_ms(calls, repeat))
    for label, (med, best) in res.items():
        print(f"{name} {label:10s} median {med:7.2f} ms  fastest {best:7.2f} ms  "
              f"compile RSS +{rss[label]:.0f} MB")
    print(f"packed / mkl_tiles: median {res['packed'][0] / res['mkl_tiles'][0]:.3f}, "
          f"fastest {res['packed'][1] / res['mkl_tiles'][1]:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--csv", default="bench/results/gemm_kernels.csv")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--model", default="", help="end-to-end A/B on this model instead")
    ap.add_argument("--batch", type=int, default=1, help="batch of the --model A/B")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.model:
        _model_ab(args.model, args.repeat, int(args.threads.split(",")[-1]), args.clock,
                  args.batch)
        return
    if args.child:
        _child(args.child, args.repeat, args.csv, args.clock)
        return
    for t in (int(v) for v in args.threads.split(",")):
        env = dict(os.environ, OMP_NUM_THREADS=str(t), OPENBLAS_NUM_THREADS=str(t),
                   MKL_NUM_THREADS=str(t))
        print(f"# {t} thread(s), load {os.getloadavg()[0]:.2f}", flush=True)
        subprocess.run([sys.executable, __file__, "--child", str(t), "--repeat",
                        str(args.repeat), "--csv", args.csv, "--clock", args.clock], env=env,
                       check=True)


if __name__ == "__main__":
    main()
