"""braze vs ONNX Runtime's transformer optimizer, side by side in one run.

For each base-size export (BERT-base in the three export variants, GPT-2 and a LLaMA-style
decoder), times braze's import + fuse + export (and fuse alone) against
`onnxruntime.transformers.optimizer.optimize_model` (load + optimize + save), and compares what
each fused: attention blocks, skip/residual norms, bias-activation matmuls. braze's export is
timed twice: weights inline (`export_s`, `total_s`: the default below 1.8 GB, what ORT's save
writes too) and as external data (`export_external_s`, `total_external_s`). Appends one row per
model and tool to bench/results/vs_ort_optimizer.csv and prints a table.

    python bench/vs_ort_optimizer.py [--models bert:sdpa,gpt2:sdpa] [--repeat 3]

Exports are cached in bench/.cache (delete it to re-export)."""
from __future__ import annotations

import argparse
import csv
import datetime
import logging
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
RESULTS = HERE / "results" / "vs_ort_optimizer.csv"
DEFAULT = ("bert:sdpa", "bert:eager", "bert:dynamo", "gpt2:sdpa", "llama:sdpa")
ORT_TYPE = {"bert": ("bert", 12, 768), "gpt2": ("gpt2", 12, 768), "llama": ("gpt2", 12, 768)}
# what each tool calls the fused kinds we count
BRAZE_KINDS = {"attention": ("fused_attention_block", "fused_transformer_layer"),
               "residual_norm": ("fused_residual_ln", "fused_residual_rms_norm"),
               "bias_act": ("fused_matmul_bias_act",)}
ORT_KINDS = {"attention": ("Attention", "MultiHeadAttention", "GroupQueryAttention"),
             "residual_norm": ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization"),
             "bias_act": ("BiasGelu", "FastGelu", "FusedMatMul", "Gelu")}


def export(family: str, variant: str) -> Path:
    from braze.models.hf import export_onnx_variant, hf_module

    CACHE.mkdir(exist_ok=True)
    path = CACHE / f"{family}_base_{variant}.onnx"
    if not path.exists():
        print(f"exporting {family}-base ({variant}) ...", flush=True)
        m = hf_module(family, size="base", attn="eager" if variant == "eager" else "sdpa")
        export_onnx_variant(m, path.with_suffix(".partial.onnx"), variant)
        os.replace(path.with_suffix(".partial.onnx"), path)
    return path


def run_braze(path: Path, out: Path) -> dict:
    import braze as bz

    t0 = time.perf_counter()
    g = bz.import_onnx(str(path))
    t1 = time.perf_counter()
    fused, report = bz.fuse(g, "onnxruntime")
    t2 = time.perf_counter()
    bz.export_onnx(fused, str(out), target="onnxruntime")
    t3 = time.perf_counter()
    ext = out.with_name(out.stem + "_ext.onnx")
    bz.export_onnx(fused, str(ext), target="onnxruntime", external_data=True)
    t4 = time.perf_counter()
    counts = {k: sum(fused.count(kind) for kind in kinds) for k, kinds in BRAZE_KINDS.items()}
    counts["layers_whole"] = fused.count("fused_transformer_layer")
    return {"import_s": t1 - t0, "fuse_s": t2 - t1, "export_s": t3 - t2, "total_s": t3 - t0,
            "export_external_s": t4 - t3, "total_external_s": t2 - t0 + t4 - t3,
            "misses": len(report.misses), **counts}


def run_ort(path: Path, out: Path, family: str) -> dict:
    from onnxruntime.transformers.optimizer import optimize_model

    model_type, heads, hidden = ORT_TYPE[family]
    t0 = time.perf_counter()
    try:
        m = optimize_model(str(path), model_type=model_type, num_heads=heads,
                           hidden_size=hidden)
        t1 = time.perf_counter()
        m.save_model_to_file(str(out))
        t2 = time.perf_counter()
        ops = {}
        for n in m.model.graph.node:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
        counts = {k: sum(ops.get(o, 0) for o in kinds) for k, kinds in ORT_KINDS.items()}
        return {"import_s": 0.0, "fuse_s": t1 - t0, "export_s": t2 - t1, "total_s": t2 - t0,
                "misses": "", "layers_whole": 0, **counts}
    except Exception as e:  # noqa: BLE001 - the peer failing is a result to record
        return {"error": f"{type(e).__name__}: {str(e)[:120]}", "total_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    rows = []
    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.models.split(","):
            family, variant = spec.split(":")
            path = export(family, variant)
            for tool in ("braze", "onnxruntime"):
                runs = []
                for i in range(args.repeat):
                    out = Path(tmp) / f"{tool}_{family}_{variant}_{i}.onnx"
                    runs.append(run_braze(path, out) if tool == "braze"
                                else run_ort(path, out, family))
                best = dict(runs[-1])
                for key in ("import_s", "fuse_s", "export_s", "total_s", "export_external_s",
                            "total_external_s"):
                    vals = [r[key] for r in runs if isinstance(r.get(key), float)]
                    if vals:
                        best[key] = statistics.median(vals)
                rows.append({"when": stamp, "host": platform.node(), "model": f"{family}-base",
                             "variant": variant, "tool": tool, **best})
                print(_line(rows[-1]), flush=True)
                for f in Path(tmp).iterdir():  # keep the disk free of GBs of old outputs
                    f.unlink()
    _append(rows)


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['model']:11} {r['variant']:7} {r['tool']:11} FAILED {r['error']}"
    ext = (f" / {r['total_external_s']:5.2f} s external" if "total_external_s" in r
           else " " * 17)
    return (f"{r['model']:11} {r['variant']:7} {r['tool']:11} total {r['total_s']:5.2f} s{ext} "
            f"(import {r['import_s'] * 1e3:4.0f} ms, fuse {r['fuse_s'] * 1e3:5.0f} ms)  "
            f"attention {r['attention']:3}  residual_norm {r['residual_norm']:3}  bias_act "
            f"{r['bias_act']:3}")


def _append(rows: list[dict]) -> None:
    RESULTS.parent.mkdir(exist_ok=True)
    fields = ["when", "host", "model", "variant", "tool", "import_s", "fuse_s", "export_s",
              "total_s", "attention", "residual_norm", "bias_act", "layers_whole", "misses",
              "error", "export_external_s", "total_external_s"]
    new = not RESULTS.exists()
    if not new:  # rows written before a column was added: rewrite them under the new header
        with open(RESULTS, newline="") as f:
            old = list(csv.DictReader(f))
        if old and set(old[0]) != set(fields):
            with open(RESULTS, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
                w.writeheader()
                w.writerows(old)
    with open(RESULTS, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
