"""Backward of a BERT encoder (BERT-base by default: 12 layers, hidden 768, 12 heads, batch 8,
seq 128): braze's compiled training step (`bz.compile_training`, the fused grad_with_loss graph
on the CPU executor; forward recomputed inside it) against PyTorch eager (forward +
`loss.backward()`, nn.TransformerEncoderLayer with BERT's post-norm GELU layout, the same
weights), side by side in one run. Loss: mean(h^2) of the last hidden states; gradients with
respect to every weight.

Each framework runs in its own subprocess so its memory is its own: time is the median of
`--repeat` steps after one warm-up; peak memory is the rise of the process's peak RSS (VmHWM,
reset through /proc/self/clear_refs) over its RSS once the weights are in place, across the
warm-up and the steps; braze also reports its planned arena. Appends rows to
bench/results/backward_vs_torch.csv.

    python bench/backward_vs_torch.py [--configs base,small] [--repeat 3] [--threads 2]
"""
from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__":  # thread pools are sized at library load: pin before any import
    _threads = sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv else "2"
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                 "NUMBA_NUM_THREADS"):
        os.environ.setdefault(_var, _threads)

import csv  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "backward_vs_torch.csv"
CONFIGS = {  # layers, hidden, heads, batch, seq
    "base": (12, 768, 12, 8, 128),
    "small": (2, 768, 12, 8, 128),
}


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def _timed(fn, repeat: int) -> tuple[list[float], float]:
    """Seconds per call (after one warm-up) and the peak RSS rise in MiB over all calls, the
    warm-up included (where braze plans and allocates its arena)."""
    base = _rss_kib("VmRSS")
    _reset_peak()
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times, (_rss_kib("VmHWM") - base) / 1024


def _model(config: str):
    import braze as bz
    from braze.autodiff.reverse import clone_into
    from braze.models.bert import bert_encoder

    layers, hidden, heads, batch, seq = CONFIGS[config]
    enc = bert_encoder(layers, hidden, heads, batch=batch, seq=seq, seed=0)
    g = bz.Graph(f"bert_{config}_loss")
    vmap = clone_into(g, enc)
    h = vmap[enc.outputs[0]]
    g.set_outputs([g.mean(g.mul(h, h))])
    x = np.random.default_rng(0).normal(size=(batch, seq, hidden)).astype(np.float32)
    return g, x


def run_braze(config: str, repeat: int, threads: int) -> dict:
    import braze as bz

    g, x = _model(config)
    t0 = time.perf_counter()
    step = bz.compile_training(g, [n.op.name for n in g.params], bz.SGD(lr=0.0))
    compile_s = time.perf_counter() - t0
    feeds = {"hidden": x}
    losses = []
    times, peak = _timed(lambda: losses.append(step.gradients(feeds)), repeat)
    mem = step.memory()
    counts = step.backward.graph.op_counts()
    fused = {k: v for k, v in counts.items() if k.startswith("fused") or "region" in k}
    return {"seconds": times, "peak_rss_mib": peak, "loss": losses[-1],
            "arena_mib": mem.backward_peak / 2**20, "weights_mib": mem.weights / 2**20,
            "compile_s": compile_s, "fused": fused,
            "summary": step.report.summary_line(),
            "grad_norm": float(np.sqrt(sum((v.astype(np.float64) ** 2).sum()
                                           for v in step.grads.values())))}


def _torch_layer(enc_weights: dict, i: int, hidden: int, heads: int):
    import torch

    layer = torch.nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.0,
                                             activation="gelu", batch_first=True,
                                             layer_norm_eps=1e-12)
    w = {k[len(f"layer{i}."):]: torch.from_numpy(v) for k, v in enc_weights.items()
         if k.startswith(f"layer{i}.")}
    with torch.no_grad():
        layer.self_attn.in_proj_weight.copy_(torch.cat(
            [w[f"attn.{t}.weight"].T for t in "qkv"]))
        layer.self_attn.in_proj_bias.copy_(torch.cat([w[f"attn.{t}.bias"] for t in "qkv"]))
        layer.self_attn.out_proj.weight.copy_(w["attn.out.weight"].T)
        layer.self_attn.out_proj.bias.copy_(w["attn.out.bias"])
        layer.linear1.weight.copy_(w["ffn.up.weight"].T)
        layer.linear1.bias.copy_(w["ffn.up.bias"])
        layer.linear2.weight.copy_(w["ffn.down.weight"].T)
        layer.linear2.bias.copy_(w["ffn.down.bias"])
        for norm, name in ((layer.norm1, "ln1"), (layer.norm2, "ln2")):
            norm.weight.copy_(w[f"{name}.gamma"])
            norm.bias.copy_(w[f"{name}.beta"])
    return layer


def run_torch(config: str, repeat: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    g, x = _model(config)
    layers, hidden, heads, _, _ = CONFIGS[config]
    model = torch.nn.Sequential(*[_torch_layer(g.weights, i, hidden, heads)
                                  for i in range(layers)])
    model.train()  # the fast-path inference kernels are not differentiable
    tx = torch.from_numpy(x)
    losses = []

    def step():
        model.zero_grad(set_to_none=True)
        h = model(tx)
        loss = (h * h).mean()
        loss.backward()
        losses.append(loss.item())

    times, peak = _timed(step, repeat)
    norm = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters())))
    return {"seconds": times, "peak_rss_mib": peak, "loss": losses[-1], "grad_norm": norm,
            "torch": torch.__version__}


def _child(tool: str, config: str, repeat: int, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--child", tool, "--configs", config, "--repeat",
           str(repeat), "--threads", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{tool} {config} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="base,small")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", choices=("braze", "torch"))
    args = ap.parse_args()
    if args.child:
        fn = run_braze if args.child == "braze" else run_torch
        print(json.dumps(fn(args.configs, args.repeat, args.threads)))
        return
    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    rows = []
    for config in args.configs.split(","):
        tb = _child("torch", config, args.repeat, args.threads)
        bb = _child("braze", config, args.repeat, args.threads)
        t_med, b_med = statistics.median(tb["seconds"]), statistics.median(bb["seconds"])
        layers, hidden, heads, batch, seq = CONFIGS[config]
        row = {"date": stamp, "config": config, "layers": layers, "hidden": hidden,
               "batch": batch, "seq": seq, "threads": args.threads, "repeat": args.repeat,
               "torch_s": round(t_med, 3), "braze_s": round(b_med, 3),
               "braze_over_torch": round(b_med / t_med, 3),
               "torch_peak_rss_mib": round(tb["peak_rss_mib"], 1),
               "braze_peak_rss_mib": round(bb["peak_rss_mib"], 1),
               "braze_arena_mib": round(bb["arena_mib"], 1),
               "weights_mib": round(bb["weights_mib"], 1),
               "braze_compile_s": round(bb["compile_s"], 2),
               "loss_rel_diff": f"{abs(bb['loss'] - tb['loss']) / abs(tb['loss']):.1e}",
               "grad_norm_rel_diff":
                   f"{abs(bb['grad_norm'] - tb['grad_norm']) / tb['grad_norm']:.1e}",
               "backward_fused": " ".join(f"{k}={v}" for k, v in sorted(bb["fused"].items())),
               "torch_version": tb["torch"]}
        rows.append(row)
        print(f"{config}: torch {t_med:.3f}s braze {b_med:.3f}s "
              f"(x{b_med / t_med:.2f}); peak RSS rise torch {tb['peak_rss_mib']:.0f} MiB, "
              f"braze {bb['peak_rss_mib']:.0f} MiB (arena {bb['arena_mib']:.0f} MiB); "
              f"loss diff {row['loss_rel_diff']}, grad-norm diff {row['grad_norm_rel_diff']}")
        print(f"  {bb['summary']}")
    new = not RESULTS.exists()
    with RESULTS.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
