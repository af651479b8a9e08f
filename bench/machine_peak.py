"""This machine's float32 FMA peak (and bf16 dot-product peak where the CPU has AVX512-BF16),
measured, and what it makes of the GEMM-floor aim (issue 7: ">= 90% of the GEMM floor", the
floor being BERT-base's 22.3 GFLOP per sequence at 340 GFLOP/s). Appends rows to
bench/results/machine_peak.csv.

    python bench/machine_peak.py [--threads 2] [--repeat 7] [--bert]

The peak loop keeps CHAINS independent vector accumulators (fused multiply-adds of GCC vector
extensions, built with braze's kernel flags: -march=native), so neither FMA latency nor loads
limit it: 24 chains of 16 floats under AVX-512 (the loop used in sessions before the eleventh
started all its chains from one value and compiled to a single chain, which measured
latency, not throughput). It runs on 1 thread, then on `--threads` (one copy per thread),
best of `--repeat` runs each. The bf16 loop is the same with `vdpbf16ps` (32 multiply-adds of
bf16 pairs per instruction), the bf16 policy's GEMMs' instruction on CPUs without AMX. With
`--bert` it also times braze's compiled BERT-base (batch 1, seq 128, the executor_vs_peers
export) and prints its fraction of the floor at the measured peak."""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "machine_peak.csv"
FIELDS = ["when", "cpu", "threads", "chains", "gflops_1_thread", "gflops_all", "bert_ms",
          "bert_fraction_of_floor_at_peak", "bf16_dot_gflops_all"]
CHAINS = 24
BERT_GFLOP = 22.3  # BERT-base, one sequence of 128 (the issue's figure)

SOURCE = r"""
#include <stdint.h>
#include <omp.h>
#if defined(__AVX512F__)
#define VW 16
#else
#define VW 8
#endif
typedef float vf __attribute__((vector_size(VW * 4)));
#define CHAINS """ + str(CHAINS) + r"""

/* CHAINS independent accumulators, each its own start value; returns their sum so the loop
   is not removed. */
static float chains(int64_t iters) {
  vf acc[CHAINS], a = (vf){0} + 1e-7f, b = (vf){0} + 0.9999f;
  for (int i = 0; i < CHAINS; i++) acc[i] = (vf){0} + (float)i;
  for (int64_t it = 0; it < iters; it++) {
    #pragma GCC unroll 32
    for (int i = 0; i < CHAINS; i++) acc[i] = acc[i] * b + a;
  }
  float s = 0.0f;
  for (int i = 0; i < CHAINS; i++)
    for (int j = 0; j < VW; j++) s += acc[i][j];
  return s;
}

/* Seconds for `iters` rounds of `loop` on each of `threads` threads at once. */
static double timed(float (*loop)(int64_t), int64_t iters, int threads) {
  volatile float sink = 0.0f;
  double t = omp_get_wtime();
  #pragma omp parallel num_threads(threads)
  {
    float s = loop(iters);
    #pragma omp atomic
    sink += s;
  }
  return omp_get_wtime() - t;
}

/* The FMA chains (flops = 2 * VW * CHAINS * iters per thread). */
double peak_seconds(int64_t iters, int threads) { return timed(chains, iters, threads); }

int lanes(void) { return VW; }

#if defined(__AVX512BF16__)
#include <immintrin.h>
/* chains() with vdpbf16ps: 16 lanes x a pair of bf16 products per instruction. */
static float chains_bf16(int64_t iters) {
  __m512 acc[CHAINS];
  __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = a;   /* pairs of 1.0 */
  for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_set1_ps((float)i);
  for (int64_t it = 0; it < iters; it++) {
    #pragma GCC unroll 32
    for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    __asm__ volatile("" : "+v"(a));   /* a loop-carried operand: the loop stays a loop */
  }
  float s = 0.0f;
  for (int i = 0; i < CHAINS; i++) s += _mm512_reduce_add_ps(acc[i]);
  return s;
}
#endif

/* peak_seconds for the bf16 loop (flops = 64 * CHAINS * iters per thread); -1 without
   AVX512-BF16. */
double bf16_seconds(int64_t iters, int threads) {
#if defined(__AVX512BF16__)
  return timed(chains_bf16, iters, threads);
#else
  return -1.0;
#endif
}
"""


def _lib():
    import ctypes

    from braze.runtime.codegen import cc

    so = cc.load_library(SOURCE, "machine_peak", {
        "peak_seconds": ([ctypes.c_int64, ctypes.c_int], ctypes.c_double),
        "bf16_seconds": ([ctypes.c_int64, ctypes.c_int], ctypes.c_double),
        "lanes": ([], ctypes.c_int)})
    if so is None:
        raise SystemExit("no C compiler: the peak loop cannot be built")
    return so


def measure(threads: int, repeat: int, iters: int = 20_000_000) -> float:
    """Best GFLOP/s over `repeat` runs of the chains on `threads` threads."""
    so = _lib()
    flops = 2 * so.lanes() * CHAINS * iters * threads
    return max(flops / so.peak_seconds(iters, threads) for _ in range(repeat)) / 1e9


def measure_bf16(threads: int, repeat: int, iters: int = 10_000_000) -> float | None:
    """Best GFLOP/s of the bf16 dot-product chains on `threads` threads, or None (no
    AVX512-BF16)."""
    so = _lib()
    if so.bf16_seconds(1, 1) < 0:
        return None
    flops = 64 * CHAINS * iters * threads
    return max(flops / so.bf16_seconds(iters, threads) for _ in range(repeat)) / 1e9


def bert_ms(threads: int) -> float:
    """braze's compiled BERT-base, batch 1, seq 128: the best of 10 calls (ms)."""
    from executor_vs_peers import load_model, make_feeds

    import braze as bz

    model = load_model("bert")
    feeds = make_feeds(model, 1, 128)
    exe = bz.compile(bz.import_onnx(str(model.path)), threads=threads)
    exe(feeds)
    best = float("inf")
    for _ in range(10):
        t = time.perf_counter()
        exe(feeds)
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--bert", action="store_true")
    args = ap.parse_args()
    one = measure(1, args.repeat)
    every = measure(args.threads, args.repeat)
    floor_issue = BERT_GFLOP / 340.0 * 1e3
    floor_peak = BERT_GFLOP / every * 1e3
    print(f"FMA peak: {one:.0f} GFLOP/s on 1 thread, {every:.0f} on {args.threads} "
          f"({CHAINS} independent chains)")
    print(f"BERT-base GEMM floor: {floor_issue:.1f} ms at the issue's 340 GFLOP/s, "
          f"{floor_peak:.1f} ms at this machine's measured peak")
    dot = measure_bf16(args.threads, args.repeat)
    if dot is not None:
        print(f"bf16 dot-product (vdpbf16ps) peak: {dot:.0f} GFLOP/s on {args.threads}: "
              f"BERT-base's bf16 floor {BERT_GFLOP / dot * 1e3:.1f} ms")
    row = {"when": datetime.datetime.now().isoformat(timespec="seconds"),
           "cpu": next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                        if ln.startswith("model name")), "?"),
           "threads": args.threads, "chains": CHAINS, "gflops_1_thread": f"{one:.1f}",
           "gflops_all": f"{every:.1f}", "bert_ms": "", "bert_fraction_of_floor_at_peak": "",
           "bf16_dot_gflops_all": "" if dot is None else f"{dot:.1f}"}
    if args.bert:
        ms = bert_ms(args.threads)
        row.update(bert_ms=f"{ms:.1f}", bert_fraction_of_floor_at_peak=f"{floor_peak / ms:.2f}")
        print(f"braze BERT-base b1: {ms:.1f} ms (best of 10) = {floor_peak / ms:.0%} of the floor "
              f"at the measured peak, {floor_issue / ms:.0%} of the issue's")
    rows = []
    if RESULTS.exists():  # older files lack the later columns: rewritten with them, blank
        with open(RESULTS, newline="") as f:
            rows = list(csv.DictReader(f))
    with open(RESULTS, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, restval="")
        w.writeheader()
        w.writerows(rows + [row])


if __name__ == "__main__":
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "2")
    main()
