"""ONNX export speed on a BERT-base-sized graph (12 layers, 768 wide, fused for ONNX Runtime):
the model build alone, `bz.export_onnx` with inline weights (the default below 1.8 GB) and with
external data, against the unavoidable part - writing the same weight bytes with `ndarray.tofile`.
Best of `--repeat` runs; appends a row to bench/results/export_speed.csv.

    .venv/bin/python bench/export_speed.py [--layers 12] [--repeat 3]"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import tempfile
import time
from pathlib import Path

import braze as bz
import braze.models as models
from braze.export.onnx.exporter import _build


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    g = models.bert_encoder(args.layers, 768, 12, batch="batch", seq="seq", with_mask=True,
                            seed=0)
    fused, _ = bz.fuse(g, "onnxruntime")
    weights = list(fused.weights.values())
    mb = sum(w.nbytes for w in weights) / 1e6
    with tempfile.TemporaryDirectory() as d:
        def raw_write():
            with open(os.path.join(d, "raw.bin"), "wb") as f:
                for w in weights:
                    w.tofile(f)

        row = {
            "weights_mb": round(mb, 1),
            "build_s": best(lambda: _build(fused, "onnxruntime", 17, None), args.repeat),
            "raw_write_s": best(raw_write, args.repeat),
            "export_inline_s": best(lambda: bz.export_onnx(fused, os.path.join(d, "m.onnx")),
                                    args.repeat),
            "export_external_s": best(lambda: bz.export_onnx(
                fused, os.path.join(d, "e.onnx"), external_data=True), args.repeat),
        }
    row = {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
    row.update(layers=args.layers, machine=platform.machine(), cpus=os.cpu_count())
    for k, v in row.items():
        print(f"{k:>18}: {v}")
    out = Path(__file__).parent / "results" / "export_speed.csv"
    new = not out.exists()
    with open(out, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        if new:
            w.writeheader()
        w.writerow(row)


if __name__ == "__main__":
    main()
