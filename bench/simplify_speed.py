"""Time `bz.simplify` (algebraic rules, constant folding, CSE, DCE to a fixed point) on graphs of
growing size: microseconds per node must stay flat (linear passes, no quadratic rescans).

Two families: BERT-style encoders with stored weights (hidden 64, so the weights stay small),
where simplify mostly confirms there is nothing to do, and "noisy" stacks in which every block
gives every cleanup pass work: a constant subgraph to fold, a transposed stored weight (a
weight fold), x * 1 and x + 0, a reshape of a reshape, and a duplicated expression for CSE.
Results are appended to bench/results/simplify_speed.csv and printed as a table.

    python bench/simplify_speed.py [--layers 12 48 192 384] [--repeat 1]
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import time

import numpy as np

import braze as bz
from braze.models import bert_encoder
from braze.passes.canonicalize.simplify import simplify_with_stats

WIDTH = 16


def noisy_stack(blocks: int) -> bz.Graph:
    """`blocks` blocks of ~40 nodes, each with work for every cleanup pass."""
    rng = np.random.default_rng(0)
    g = bz.Graph("noisy", record_provenance=False)
    x = g.input("x", bz.Shape(("batch", WIDTH)))
    for i in range(blocks):
        w = g.param(f"w{i}", bz.Shape((WIDTH, WIDTH)),
                    rng.standard_normal((WIDTH, WIDTH)).astype(np.float32))
        c = g.constant(np.linspace(0, 1, WIDTH, dtype=np.float32))
        scale = g.div(g.exp(g.neg(c)), g.sqrt(g.add(g.mul(c, c), 1.0)))      # folds
        h = g.mm(x, g.transpose(w, (1, 0)))                                   # weight fold
        h = g.add(g.mul(h, g.constant(np.ones((WIDTH,), np.float32))), 0.0)   # x*1, x+0
        h = g.reshape(g.reshape(h, ("batch", 4, WIDTH // 4)), ("batch", WIDTH))
        a = g.tanh(g.mul(h, scale))
        b = g.tanh(g.mul(h, scale))                                           # CSE
        x = g.add(g.add(a, b), x)
    g.set_outputs([x])
    return g


def bench(kind: str, g: bz.Graph, repeat: int) -> dict:
    best, out, stats = float("inf"), g, {}
    for _ in range(repeat):
        t0 = time.perf_counter()
        out, stats = simplify_with_stats(g)
        best = min(best, time.perf_counter() - t0)
    n = len(g.nodes)
    folds = stats["ConstantFolding"].matches
    return {"date": datetime.date.today().isoformat(), "machine": platform.node(),
            "python": platform.python_version(), "graph": kind, "nodes": n,
            "nodes_after": len(out.nodes), "folds": folds, "seconds": round(best, 4),
            "us_per_node": round(best / n * 1e6, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, nargs="*", default=[12, 48, 192, 384])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                  "simplify_speed.csv"))
    args = ap.parse_args()
    rows = []
    print(f"{'graph':>14} {'nodes':>7} {'after':>7} {'folds':>6} {'seconds':>8} {'us/node':>8}")
    for layers in args.layers:
        cases = [(f"bert{layers}", bert_encoder(layers=layers, hidden=64, heads=4, batch="batch",
                                                seq="seq", seed=0)),
                 (f"noisy{layers * 12}", noisy_stack(layers * 12))]
        for kind, g in cases:
            r = bench(kind, g, args.repeat)
            rows.append(r)
            print(f"{kind:>14} {r['nodes']:>7} {r['nodes_after']:>7} {r['folds']:>6} "
                  f"{r['seconds']:>8.3f} {r['us_per_node']:>8.1f}")
    for fam in ("bert", "noisy"):
        mine = [r for r in rows if r["graph"].startswith(fam)]
        if len(mine) > 1:
            ratio = mine[-1]["us_per_node"] / mine[0]["us_per_node"]
            print(f"{fam}: µs/node largest/smallest {ratio:.2f} (1.0 = perfectly linear)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    new = not os.path.exists(args.out)
    with open(args.out, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
