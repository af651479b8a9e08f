"""Time `bz.fuse` on BERT-style encoders of 12, 48, 192 and 768 layers: nodes, seconds, and
microseconds per node. Linear scaling shows as a flat µs/node column. Results are appended to
bench/results/fusion_speed.csv and printed as a table.

    python bench/fusion_speed.py [--layers 12 48 192 768] [--repeat 1]
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import time

import braze as bz
from braze.models import bert_encoder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, nargs="*", default=[12, 48, 192, 768])
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                  "fusion_speed.csv"))
    args = ap.parse_args()
    rows = []
    print(f"{'layers':>7} {'nodes':>8} {'fused':>7} {'seconds':>9} {'us/node':>9}")
    for layers in args.layers:
        g = bert_encoder(layers=layers, hidden=args.hidden, heads=12, batch="batch", seq="seq")
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            fused, report = bz.fuse(g, "cpu")
            best = min(best, time.perf_counter() - t0)
        n = len(g.nodes)
        us = best / n * 1e6
        print(f"{layers:>7} {n:>8} {len(fused.nodes):>7} {best:>9.3f} {us:>9.1f}")
        rows.append({"date": datetime.date.today().isoformat(), "machine": platform.node(),
                     "python": platform.python_version(), "layers": layers, "nodes": n,
                     "nodes_after": len(fused.nodes), "seconds": round(best, 4),
                     "us_per_node": round(us, 2)})
    if len(rows) > 1:
        ratio = rows[-1]["us_per_node"] / rows[0]["us_per_node"]
        print(f"µs/node ratio largest/smallest: {ratio:.2f} (1.0 = perfectly linear)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    new = not os.path.exists(args.out)
    with open(args.out, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
