"""ElementwiseRegion kernels against this machine's copy bandwidth and a NumPy chain of the same
ops (issue 7's region targets: >= 80% of copy bandwidth in effective bytes, >= 8x NumPy).

Each case is a chain of elementwise ops on float32 tensors of `--mb` MiB that `bz.fuse` turns
into one region; braze runs it compiled (`bz.compile`, one generated kernel, one pass over
memory), timed as `exe(feeds, copy=False)` (the output stays in the arena: the kernel plus the
run loop); `call ms` is the default `exe(feeds)`, which also copies the output out of the arena.
Effective bytes = every region input read once + the output written once. Copy bandwidth is
`np.copyto` of the same size (read + write). Medians.

    python bench/elementwise_regions.py [--mb 64] [--repeat 15]
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import statistics
import time

import numpy as np

import braze as bz


def _cases():
    """name -> (builder(g, x, y) -> value, numpy(x, y) -> array, number of inputs)."""
    from math import sqrt

    def np_gelu(v):
        from scipy.special import erf  # noqa: PLC0415 - optional, only for the NumPy side
        return 0.5 * v * (1.0 + erf(v / sqrt(2.0)))

    return {
        "bias_gelu": (lambda g, x, y: g.gelu(g.add(x, y)),
                      lambda x, y: np_gelu(x + y), 2),
        "silu_mul": (lambda g, x, y: g.mul(g.silu(x), y),
                     lambda x, y: x / (1.0 + np.exp(-x)) * y, 2),
        "tanh_chain": (lambda g, x, y: g.tanh(g.add(g.mul(x, 0.5), g.mul(y, 0.25))),
                       lambda x, y: np.tanh(x * 0.5 + y * 0.25), 2),
        "exp_scale": (lambda g, x, y: g.mul(g.exp(g.neg(g.square(x))), 3.0),
                      lambda x, y: np.exp(-np.square(x)) * 3.0, 1),
    }


def _median(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=64, help="MiB per input tensor")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                  "elementwise_regions.csv"))
    args = ap.parse_args()
    n = args.mb * (1 << 20) // 4
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    dst = np.empty_like(x)
    copy_s = _median(lambda: np.copyto(dst, x), args.repeat)
    copy_gbs = 2 * x.nbytes / copy_s / 1e9
    load = os.getloadavg()[0]
    print(f"copy bandwidth (np.copyto, {args.mb} MiB): {copy_gbs:.1f} GB/s   load {load:.2f}")
    print(f"{'case':<12} {'braze ms':>9} {'call ms':>8} {'numpy ms':>9} {'GB/s':>7} "
          f"{'% copy':>7} {'x numpy':>8}")
    rows = []
    for name, (build, numpy_fn, n_in) in _cases().items():
        g = bz.Graph(name)
        xi = g.input("x", bz.Shape((n,)))
        yi = g.input("y", bz.Shape((n,)))
        g.set_outputs([build(g, xi, yi)])
        exe = bz.compile(g, target="cpu")
        regions = exe.graph.count("elementwise_region")
        feeds = {"x": x, "y": y}
        got = exe(feeds)[0]
        want = numpy_fn(x.astype(np.float64), y.astype(np.float64))
        err = float(np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want))))
        braze_s = _median(lambda exe=exe, feeds=feeds: exe(feeds, copy=False), args.repeat)
        call_s = _median(lambda exe=exe, feeds=feeds: exe(feeds), args.repeat)
        numpy_s = _median(lambda f=numpy_fn: f(x, y), args.repeat)
        eff = (n_in + 1) * x.nbytes / braze_s / 1e9
        print(f"{name:<12} {braze_s * 1e3:>9.2f} {call_s * 1e3:>8.2f} {numpy_s * 1e3:>9.2f} "
              f"{eff:>7.1f} "
              f"{100 * eff / copy_gbs:>6.0f}% {numpy_s / braze_s:>7.1f}x   regions={regions} "
              f"max rel err {err:.1e}")
        rows.append({"date": datetime.datetime.now().isoformat(timespec="minutes"),
                     "machine": platform.node(), "load_avg": f"{load:.2f}", "case": name,
                     "mib_per_input": args.mb, "inputs": n_in, "regions": regions,
                     "braze_ms": f"{braze_s * 1e3:.3f}", "call_ms": f"{call_s * 1e3:.3f}",
                     "numpy_ms": f"{numpy_s * 1e3:.3f}",
                     "effective_gbs": f"{eff:.2f}", "copy_gbs": f"{copy_gbs:.2f}",
                     "pct_of_copy": f"{100 * eff / copy_gbs:.1f}",
                     "x_numpy": f"{numpy_s / braze_s:.2f}", "max_rel_err": f"{err:.2e}"})
    new = not os.path.exists(args.out)
    with open(args.out, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
