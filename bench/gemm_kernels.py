"""float32 GEMM throughput at BERT-base shapes: braze's packed-weight kernel (packed_gemm.py,
weight packed once outside the timing) against NumPy's matmul (its OpenBLAS), MKL's
cblas_sgemm (whole matrix, MKL's own threading) and braze's previous path (gemm_bias_act:
MKL sgemm per output tile in one OpenMP region). Every method computes out = x @ w (+ bias,
+ GELU for the `_gelu` rows, which only the two braze kernels fuse) into a preallocated
output; the methods run interleaved, round by round, so machine load hits them alike. GFLOP/s
from the median and the best round.

Each thread count runs in its own process (OMP_NUM_THREADS / OPENBLAS_NUM_THREADS /
MKL_NUM_THREADS are read when the libraries load).

    python bench/gemm_kernels.py [--threads 1,2] [--repeat 15] [--csv PATH]
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
FIELDS = ["date", "machine", "load", "threads", "m", "k", "n", "method", "gflops_median",
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


def _child(threads: int, repeat: int, csv_path: str) -> None:
    import numpy as np  # noqa: PLC0415
    from scipy.special import erf  # noqa: PLC0415

    from braze.runtime.kernels import native  # noqa: PLC0415

    native.lib().braze_set_threads(threads)
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
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        flops = 2 * m * k * n
        for name, ts in times.items():
            med, best = float(np.median(ts)), min(ts)
            rows.append(dict(date=stamp, machine=platform.machine(), load=f"{load:.2f}",
                             threads=threads, m=m, k=k, n=n, method=name,
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--csv", default="bench/results/gemm_kernels.csv")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.repeat, args.csv)
        return
    for t in (int(v) for v in args.threads.split(",")):
        env = dict(os.environ, OMP_NUM_THREADS=str(t), OPENBLAS_NUM_THREADS=str(t),
                   MKL_NUM_THREADS=str(t))
        print(f"# {t} thread(s), load {os.getloadavg()[0]:.2f}", flush=True)
        subprocess.run([sys.executable, __file__, "--child", str(t), "--repeat",
                        str(args.repeat), "--csv", args.csv], env=env, check=True)


if __name__ == "__main__":
    main()
