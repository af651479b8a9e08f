"""What a first call costs in C kernel builds: `bz.compile` + the first call, with a cold kernel
cache (a fresh `BRAZE_CACHE_DIR`) and then warm (the same folder, a new process), for graphs of
N element-wise regions that differ only by their scalar constants (`x * s_i + b_i`, a softmax
between them so they stay N regions) and for the built-in models.

Each case runs in its own process (a process keeps every library it loaded). Columns: seconds
of compile + first call, libraries the cold run wrote into the cache (all of braze's C
libraries the graph needed: regions and the per-machine native ones), and the graph's
generated-region steps. The GEMM choices are measured once beforehand into one file shared by
every run (`BRAZE_GEMM_CHOICES`), so the times are compiles, not GEMM measurements. The
children import the braze on PYTHONPATH (they run in the cache folder, not here), so
`PYTHONPATH=/path/to/an/older/checkout python bench/compile_kernels.py` measures that one.

    python bench/compile_kernels.py [--regions 10 100 300] [--models bert-base gpt2 ...]
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHILD = r"""
import json, os, sys, time
import braze as bz
from braze.models import build_model

case = sys.argv[1]
if case.startswith("regions:"):
    n = int(case.split(":")[1])
    g = bz.Graph(f"scaled_{n}")
    h = g.input("x", bz.Shape((64, 256)))
    for i in range(n):
        h = g.sm(g.add(g.mul(h, 0.5 + i / 1024), 3.0 + i))
    g.set_outputs([h])
else:
    g = build_model(case)
params = bz.init_params(g, seed=0)
feeds = bz.random_feeds(g, 0)
t0 = time.perf_counter()
exe = bz.compile(g, params=params, threads=1)
exe(feeds)
seconds = time.perf_counter() - t0
report = exe.dispatch_report()
regions = len(report.by_dispatch("generated"))
print(json.dumps({"seconds": seconds, "regions": regions}))
"""


def _run(case: str, cache: str, choices: str) -> dict:
    env = {**os.environ, "BRAZE_CACHE_DIR": cache, "BRAZE_GEMM_CHOICES": choices,
           "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", _CHILD, case], env=env, capture_output=True,
                         text=True, check=True, cwd=cache)  # braze from PYTHONPATH, not cwd
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--regions", type=int, nargs="*", default=[10, 100, 300])
    ap.add_argument("--models", nargs="*",
                    default=["bert-base", "gpt2-small", "llama-small", "resnet-block"])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" /
                                         "compile_kernels.csv"))
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    cases = [f"regions:{n}" for n in args.regions] + list(args.models)
    rows = []
    with tempfile.TemporaryDirectory(prefix="braze-compile-bench-") as tmp:
        choices = str(Path(tmp) / "gemm_choices.json")
        warmup = Path(tmp) / "choices-warmup"
        warmup.mkdir()
        for case in cases:  # GEMM choices measured once, outside the timed runs
            _run(case, str(warmup), choices)
        for case in cases:
            cache = str(Path(tmp) / case.replace(":", "_"))
            Path(cache).mkdir()
            cold = _run(case, cache, choices)
            built = sum(1 for p in Path(cache).iterdir() if p.suffix == ".so")
            warm = _run(case, cache, choices)
            row = {"date": datetime.datetime.now().strftime("%Y-%m-%dT%H:%M"),
                   "machine": platform.node(), "load_avg": f"{os.getloadavg()[0]:.2f}",
                   "case": case, "generated_regions": cold["regions"],
                   "libraries_built": built, "cold_s": f"{cold['seconds']:.2f}",
                   "warm_s": f"{warm['seconds']:.2f}", "note": args.note}
            rows.append(row)
            print(row, flush=True)
    out = Path(args.out)
    new = not out.exists()
    with out.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        if new:
            w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"done in {time.perf_counter() - started:.0f} s")
