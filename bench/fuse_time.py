"""How long `bz.fuse` takes on the cached base-size exports (bench/.cache/*.onnx, written by
bench/vs_ort_optimizer.py): CPU and wall time, minimum and median over repeats, per export.
Import is not timed.

With `--baseline REV` braze as of that git revision (or the `braze` package in directory REV)
is loaded beside the working tree's in the same process (braze imports itself relatively), and
the two fuse in turns, alternating which goes first: a busy machine slows both alike. The
`ratio` column is the median over those pairs of this tree's CPU time over the baseline's.

    python bench/fuse_time.py [--models bert_base_sdpa gpt2_base_sdpa] [--target onnxruntime]
                              [--repeat 20] [--baseline REV]

Appends one row per export and revision to bench/results/fuse_time.csv and prints a table."""
from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = HERE / ".cache"
RESULTS = HERE / "results" / "fuse_time.csv"


def load_braze(path: str, name: str) -> ModuleType:
    """The `braze` package under directory `path`, imported as module `name`."""
    pkg = os.path.join(path, "braze")
    spec = importlib.util.spec_from_file_location(name, os.path.join(pkg, "__init__.py"),
                                                  submodule_search_locations=[pkg])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def checkout(rev: str, into: str) -> str:
    """The `braze` package as of `rev`, unpacked under `into`; returns that directory."""
    archive = os.path.join(into, "braze.tar")
    with open(archive, "wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "braze"], stdout=f, check=True)
    with tarfile.open(archive) as t:
        t.extractall(into, filter="data")
    return into


def time_paired(sides: dict[str, ModuleType], model: str, target: str, repeat: int
                ) -> dict[str, dict]:
    """Per side: nodes and the CPU / wall seconds of `repeat` fuse calls, taken in turns."""
    graphs = {label: bz.import_onnx(str(CACHE / f"{model}.onnx")) for label, bz in sides.items()}
    for label, bz in sides.items():
        bz.fuse(graphs[label], target)  # warm: op inference caches, dispatch tables
    out = {label: {"nodes": len(g.nodes), "cpu": [], "wall": []} for label, g in graphs.items()}
    order = list(sides)
    for i in range(repeat):
        for label in order if i % 2 == 0 else order[::-1]:
            c0, w0 = time.process_time(), time.perf_counter()
            sides[label].fuse(graphs[label], target)
            out[label]["cpu"].append(time.process_time() - c0)
            out[label]["wall"].append(time.perf_counter() - w0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*",
                    default=sorted(p.stem for p in CACHE.glob("*.onnx")))
    ap.add_argument("--target", default="onnxruntime")
    ap.add_argument("--repeat", type=int, default=20, help="fuse calls per side and export")
    ap.add_argument("--baseline", default="",
                    help="also time braze as of this git revision (or from this directory)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    if not args.models:
        sys.exit(f"no exports in {CACHE}: run bench/vs_ort_optimizer.py first")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    sys.path.insert(0, str(ROOT))
    import braze

    sides: dict[str, ModuleType] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline and os.path.isdir(os.path.join(args.baseline, "braze")):  # a tree
            label = os.path.basename(os.path.normpath(args.baseline))
            sides[label] = load_braze(args.baseline, "braze_baseline")
        elif args.baseline:
            sides[args.baseline] = load_braze(checkout(args.baseline, tmp), "braze_baseline")
        sides[head] = braze
        samples = {m: time_paired(sides, m, args.target, args.repeat) for m in args.models}
    load = os.getloadavg()[0]
    now = datetime.datetime.now(datetime.UTC).isoformat("T", "minutes")
    print(f"{'revision':>24} {'export':<18} {'nodes':>6} {'cpu min':>8} {'cpu med':>8} "
          f"{'wall min':>9} {'wall med':>9} {'ratio':>6}   (ms, load {load:.2f})")
    rows = []
    base = next(iter(sides)) if len(sides) > 1 else None
    for model, per_side in samples.items():
        for label, s in per_side.items():
            cpu = (min(s["cpu"]) * 1e3, statistics.median(s["cpu"]) * 1e3)
            wall = (min(s["wall"]) * 1e3, statistics.median(s["wall"]) * 1e3)
            ratio = statistics.median(a / b for a, b in zip(s["cpu"], per_side[base]["cpu"])) \
                if base is not None and label != base else 1.0
            print(f"{label:>24} {model:<18} {s['nodes']:>6} {cpu[0]:>8.1f} {cpu[1]:>8.1f} "
                  f"{wall[0]:>9.1f} {wall[1]:>9.1f} {ratio:>6.2f}")
            rows.append({"date": now, "machine": platform.node(),
                         "python": platform.python_version(), "revision": label,
                         "target": args.target, "export": model, "nodes": s["nodes"],
                         "samples": len(s["cpu"]), "cpu_min_ms": round(cpu[0], 2),
                         "cpu_median_ms": round(cpu[1], 2), "wall_min_ms": round(wall[0], 2),
                         "wall_median_ms": round(wall[1], 2),
                         "cpu_ratio_to_baseline": round(ratio, 3), "load1": round(load, 2)})
    append_csv(args.out, rows)


def append_csv(path: str, rows: list[dict]) -> None:
    """Append `rows` under the file's header; a file whose header names other columns is left
    alone (the run stops saying so) rather than mixed into."""
    fields = list(rows[0])
    have = None
    if os.path.exists(path):
        with open(path, newline="") as f:
            have = next(csv.reader(f), None)
        if have and have != fields:
            sys.exit(f"{path} has columns {have}; this run writes {fields}: pass --out")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a", newline="") as f:
        out = csv.writer(f)
        if not have:
            out.writerow(fields)
        out.writerows([r[k] for k in fields] for r in rows)


if __name__ == "__main__":
    main()
