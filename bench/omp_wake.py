"""How long braze's OpenMP workers take to run again after the process idles: an empty parallel
region (braze's kernel flags and libgomp, as the kernels use) timed right after an idle gap,
and the region right after that one, per gap length. Appends rows to
bench/results/omp_wake.csv.

    python bench/omp_wake.py [--threads 2] [--repeat 10] [--gaps 0,1,4,16,64,200]

Why: the benchmarks wait 0.2 s before each timed call, and on the Zen 4 VM of 2026-11-28 a
woken libgomp worker took milliseconds to run (an empty region ~1 µs back to back, ~1 ms after
64 ms idle with braze's spin setting, ~6 ms with libgomp's default): a step every call paid
after idle, which OpenVINO's TBB pool did not show. Bound to cores (braze's default since,
codegen.cc.set_omp_spin) the worker runs again in ~0.1 ms; BRAZE_BIND_THREADS=0 shows the
unbound figures."""
from __future__ import annotations

import argparse
import csv
import ctypes
import datetime
import os
import statistics
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "omp_wake.csv"
FIELDS = ["when", "cpu", "threads", "binding", "gap_ms", "first_region_us", "second_region_us"]

SOURCE = r"""
#include <omp.h>
/* Seconds taken by an empty parallel region of `threads` threads. */
double empty_region(int threads) {
  volatile int sink = 0;
  double t = omp_get_wtime();
  #pragma omp parallel num_threads(threads)
  {
    #pragma omp atomic
    sink += 1;
  }
  return omp_get_wtime() - t;
}
"""


def main() -> None:
    from braze.runtime.codegen import cc

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--gaps", default="0,1,4,16,64,200")
    args = ap.parse_args()
    so = cc.load_library(SOURCE, "omp_wake", {"empty_region": ([ctypes.c_int],
                                                               ctypes.c_double)})
    if so is None:
        raise SystemExit("no C compiler: the probe cannot be built")
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), "?")
    when = datetime.datetime.now().isoformat(timespec="seconds")
    rows = []
    for gap in (int(g) for g in args.gaps.split(",")):
        first, second = [], []
        for _ in range(args.repeat):
            time.sleep(gap / 1e3)
            first.append(so.empty_region(args.threads))
            second.append(so.empty_region(args.threads))
        f, s = statistics.median(first) * 1e6, statistics.median(second) * 1e6
        print(f"after {gap:4d} ms idle: first region {f:8.1f} us, the next {s:8.1f} us")
        rows.append({"when": when, "cpu": cpu, "threads": args.threads,
                     "binding": os.environ.get("OMP_PROC_BIND", "none"), "gap_ms": gap,
                     "first_region_us": f"{f:.1f}", "second_region_us": f"{s:.1f}"})
    new = not RESULTS.exists()
    with open(RESULTS, "a", newline="") as out:
        w = csv.DictWriter(out, fieldnames=FIELDS)
        if new:
            w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
