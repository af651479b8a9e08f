"""A KV-cache decode step's attention layer compiled fused (one FusedAttentionBlock with the
cache, braze's default pipeline) against the same graph compiled unfused (`fuse=False`): one
new token of a GPT-2-small-sized layer (768 wide, 12 heads) and a LLaMA-style one (12 query /
4 kv heads, rope), caches of 16 and 256 positions. One thread, process time per call, the two
executables interleaved in rounds (the machine is shared and noisy), median of the rounds.
Appends rows to bench/results/decode_step.csv.

    python bench/decode_step.py [--rounds 9] [--calls 200] [--label NAME]"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from fuse_time import append_csv  # noqa: E402  (bench/ is the script's directory)

import braze as bz  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "decode_step.csv"
# name -> (width, query heads, kv heads, head dim, rope)
LAYERS = {"gpt2_small": (768, 12, 12, 64, False), "llama_gqa": (768, 12, 4, 64, True)}


def decode_layer(width: int, heads: int, kv_heads: int, d: int, rope: bool, past: int):
    """x [1, 1, width] over a [1, kv_heads, past, d] cache -> (y, present k, present v)."""
    g = bz.Graph("decode_step")
    x = g.input("x", bz.Shape((1, 1, width)))
    cache = {r: g.input(f"past_{r}", bz.Shape((1, kv_heads, past, d))) for r in "kv"}
    t = {}
    for r, h in zip("qkv", (heads, kv_heads, kv_heads)):
        p = g.add(g.mm(x, g.param(f"w_{r}", bz.Shape((width, h * d)))),
                  g.param(f"b_{r}", bz.Shape((h * d,))))
        t[r] = g.transpose(g.reshape(p, (1, 1, h, d)), (0, 2, 1, 3))
    if rope:
        cos, sin = (g.input(n, bz.Shape((1, d // 2))) for n in ("cos", "sin"))
        t["q"], t["k"] = (g.rope(t[r], cos, sin) for r in "qk")
    k, v = (g.concat([cache[r], t[r]], 2) for r in "kv")
    o = g.attention(t["q"], k, v, kind="causal")
    y = g.mm(g.reshape(g.transpose(o, (0, 2, 1, 3)), (1, 1, heads * d)),
             g.param("w_o", bz.Shape((heads * d, width))))
    g.set_outputs([g.add(y, g.param("b_o", bz.Shape((width,)))), k, v])
    return g


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    when = datetime.datetime.now().isoformat(timespec="seconds")
    rows = []
    for name, shape in LAYERS.items():
        for past in (16, 256):
            g = decode_layer(*shape, past=past)
            params = bz.init_params(g, 0)
            exes = {"fused": bz.compile(g, "cpu", params=params),
                    "unfused": bz.compile(g, "cpu", params=params, fuse=False)}
            feeds = bz.random_feeds(g, 0)
            outs = {k: e(feeds) for k, e in exes.items()}
            diff = max(float(np.abs(a - b).max()) for a, b in zip(*outs.values()))
            times = {k: [] for k in exes}
            for _ in range(args.rounds):
                for k, e in exes.items():
                    t0 = time.process_time()
                    for _ in range(args.calls):
                        e(feeds)
                    times[k].append((time.process_time() - t0) / args.calls * 1e6)
            med = {k: statistics.median(v) for k, v in times.items()}
            load = f"{os.getloadavg()[0]:.2f}"
            print(f"{name} past={past}: fused {med['fused']:.1f} us, unfused "
                  f"{med['unfused']:.1f} us, ratio {med['fused'] / med['unfused']:.2f}")
            rows.append(dict(when=when, label=args.label, load_avg=load, layer=name, past=past,
                             fused_us=f"{med['fused']:.1f}", unfused_us=f"{med['unfused']:.1f}",
                             ratio=f"{med['fused'] / med['unfused']:.3f}",
                             max_abs_diff=f"{diff:.1e}"))
    append_csv(str(RESULTS), rows)


if __name__ == "__main__":
    main()
