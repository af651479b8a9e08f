"""ElementwiseRegion kernels against this machine's copy bandwidth and a NumPy chain of the same
ops (issue 7's region targets: >= 80% of copy bandwidth in effective bytes, >= 8x NumPy).

Each case is a chain of elementwise ops on float32 tensors of `--mb` MiB that `bz.fuse` turns
into one region; braze runs it compiled (`bz.compile`, one generated kernel, one pass over
memory). Three braze timings: `kernel` is the generated kernel alone (the program's step, its
arguments bound), `run` is `exe(feeds, copy=False)` (kernel plus the run loop, which reads the
contiguous feeds in place; the output stays in the arena) and `call` the default `exe(feeds)`,
which also copies the output out of the arena into a fresh array (page faults included). The
NumPy side is the chain of ufuncs a user would write (`np.tanh(x * 0.5 + y * 0.25)`; for GELU
`scipy.special.erf`, NumPy having no erf).
Effective bytes = every region input read once + the output written once. Copy bandwidth is
`np.copyto` of one input into a warm buffer (read + write), timed in the same rounds as the
kernel. All timings are taken round-robin, `--repeat` rounds; medians (min in the CSV too).

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


def _timings(fns: dict, repeat: int) -> dict:
    """name -> (median, min) seconds of each function, called round-robin `repeat` times
    after one warm-up call each (so load changes hit every column alike)."""
    for fn in fns.values():
        fn()
    times: dict = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: (statistics.median(v), min(v)) for k, v in times.items()}


def _kernel_call(exe, feeds):
    """The region's kernel with its arguments bound, as the program's run loop calls it."""
    prog = exe.program(feeds)
    env = list(prog.env)
    for name, slot in prog.input_slots.items():
        env[slot] = feeds[name]
    (step,) = [s for s in prog.steps if s.node.op.kind == "elementwise_region"]
    args = [env[s] for s in step.slots]
    return lambda: step.kernel.run(*args), step.kernel.name


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
    print(f"{args.mb} MiB per input, {args.repeat} rounds, medians")
    print(f"{'case':<11} {'copy GB/s':>9} {'kernel ms':>9} {'run ms':>7} {'call ms':>8} "
          f"{'numpy ms':>9} {'GB/s':>6} {'% copy':>7} {'x numpy':>8}  max rel err")
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
        kernel, impl = _kernel_call(exe, feeds)
        load = os.getloadavg()[0]
        t = _timings({"copy": lambda: np.copyto(dst, x), "kernel": kernel,
                      "run": lambda exe=exe, feeds=feeds: exe(feeds, copy=False),
                      "call": lambda exe=exe, feeds=feeds: exe(feeds),
                      "numpy": lambda f=numpy_fn: f(x, y)}, args.repeat)
        copy_gbs = 2 * x.nbytes / t["copy"][0] / 1e9
        eff = (n_in + 1) * x.nbytes / t["kernel"][0] / 1e9
        pct, speedup = 100 * eff / copy_gbs, t["numpy"][0] / t["kernel"][0]
        ms = {k: v[0] * 1e3 for k, v in t.items()}
        print(f"{name:<11} {copy_gbs:>9.1f} {ms['kernel']:>9.2f} {ms['run']:>7.2f} "
              f"{ms['call']:>8.2f} {ms['numpy']:>9.2f} {eff:>6.1f} {pct:>6.0f}% "
              f"{speedup:>7.1f}x  {err:.1e}  load {load:.2f}  [{impl}]")
        rows.append({"date": datetime.datetime.now().isoformat(timespec="minutes"),
                     "machine": platform.node(), "load_avg": f"{load:.2f}", "case": name,
                     "mib_per_input": args.mb, "inputs": n_in, "regions": regions,
                     "braze_ms": f"{ms['run']:.3f}", "call_ms": f"{ms['call']:.3f}",
                     "numpy_ms": f"{ms['numpy']:.3f}",
                     "effective_gbs": f"{eff:.2f}", "copy_gbs": f"{copy_gbs:.2f}",
                     "pct_of_copy": f"{pct:.1f}", "x_numpy": f"{speedup:.2f}",
                     "max_rel_err": f"{err:.2e}", "kernel_ms": f"{ms['kernel']:.3f}",
                     "kernel_min_ms": f"{t['kernel'][1] * 1e3:.3f}",
                     "copy_min_ms": f"{t['copy'][1] * 1e3:.3f}",
                     "streaming": int("streaming" in impl)})
    _append_csv(args.out, rows)


def _append_csv(path: str, rows: list[dict]) -> None:
    """Add `rows`; earlier rows with fewer columns keep their values (new columns empty)."""
    old: list[dict] = []
    if os.path.exists(path):
        with open(path, newline="") as f:
            old = list(csv.DictReader(f))
    fields = list(old[0]) if old else []
    fields += [k for k in rows[0] if k not in fields]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, restval="")
        w.writeheader()
        w.writerows(old + rows)


if __name__ == "__main__":
    main()
