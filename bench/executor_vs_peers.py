"""braze's compiled CPU executor against PyTorch (eager, bf16 autocast, torch.compile), ONNX
Runtime (all graph optimizations) and OpenVINO, side by side in one run: median latency per
model, batch and precision, and each tool's ratio to the fastest peer. Appends rows to
bench/results/executor_vs_peers.csv.

    python bench/executor_vs_peers.py [--models bert,gpt2,llama,minilm] [--batches 1,8]
                                      [--seq 128] [--repeat 10] [--peers ort,torch,ov]

Models are Hugging Face base-size configs with random weights (braze.models.hf), exported once
to bench/.cache with the TorchScript exporter (sdpa attention); every tool runs that model.
braze runs the ONNX file: import -> fuse -> compile."""
from __future__ import annotations

import argparse
import csv
import datetime
import logging
import os
import platform
import statistics
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
RESULTS = HERE / "results" / "executor_vs_peers.csv"
THREADS = os.cpu_count() or 2


def median_ms(fn, repeat: int) -> float:
    fn()
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def model_files(family: str):
    from braze.models.hf import export_onnx_variant, hf_module

    CACHE.mkdir(exist_ok=True)
    size = "base" if family != "minilm" else "tiny"
    path = CACHE / f"{family}_base_sdpa.onnx"
    module = hf_module(family, size=size, attn="sdpa")
    if not path.exists():
        export_onnx_variant(module, path.with_suffix(".partial.onnx"), "sdpa")
        os.replace(path.with_suffix(".partial.onnx"), path)
    return module, path


def run_braze(path, feeds, repeat, precision=None):
    import braze as bz

    t0 = time.perf_counter()
    g = bz.import_onnx(str(path))
    exe = bz.compile(g, precision=precision)
    out = exe(feeds)[0]
    compile_s = time.perf_counter() - t0
    return median_ms(lambda: exe(feeds), repeat), out, compile_s


def run_ort(path, feeds, repeat):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = THREADS
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    out = sess.run(None, feeds)[0]
    return median_ms(lambda: sess.run(None, feeds), repeat), out


def run_torch(module, feeds, repeat, mode):
    import torch

    torch.set_num_threads(THREADS)
    args = [torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask")]
    m = module
    if mode == "compile":
        m = torch.compile(module)
    with torch.inference_mode():
        if mode == "bf16":
            def call():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return m(*args)
        else:
            def call():
                return m(*args)
        out = call().float().numpy()
        return median_ms(call, repeat), out


def run_openvino(path, feeds, repeat, hint="f32"):
    import openvino as ov

    core = ov.Core()
    cfg = {"INFERENCE_NUM_THREADS": THREADS}
    if hint == "f32":
        cfg["INFERENCE_PRECISION_HINT"] = "f32"
    compiled = core.compile_model(str(path), "CPU", cfg)
    req = compiled.create_infer_request()
    out = req.infer(feeds)[compiled.output(0)]
    return median_ms(lambda: req.infer(feeds), repeat), np.asarray(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="bert,gpt2,llama")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--peers", default="ort,torch,torch_bf16,compile,ov,ov_default")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    from braze.models.hf import hf_inputs

    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    rows = []
    peers = args.peers.split(",")
    for family in args.models.split(","):
        module, path = model_files(family)
        for batch in (int(b) for b in args.batches.split(",")):
            feeds = hf_inputs(batch, args.seq, vocab=module.vocab_size, padding="none")
            results = {}
            ms, ref, compile_s = run_braze(path, feeds, args.repeat)
            results["braze"] = (ms, ref)
            runners = {"ort": lambda: run_ort(path, feeds, args.repeat),
                       "torch": lambda: run_torch(module, feeds, args.repeat, "eager"),
                       "torch_bf16": lambda: run_torch(module, feeds, args.repeat, "bf16"),
                       "compile": lambda: run_torch(module, feeds, args.repeat, "compile"),
                       "ov": lambda: run_openvino(path, feeds, args.repeat, "f32"),
                       "ov_default": lambda: run_openvino(path, feeds, args.repeat, "default")}
            for peer in peers:
                try:
                    results[peer] = runners[peer]()
                except Exception as e:  # noqa: BLE001 - a peer failing is a result
                    print(f"  {peer} failed: {type(e).__name__}: {str(e)[:100]}")
            fp32 = [v[0] for k, v in results.items() if k in ("ort", "torch", "compile", "ov")]
            best = min(fp32) if fp32 else float("nan")
            for tool, (ms, out) in results.items():
                err = float(np.max(np.abs(out - ref)) / max(np.max(np.abs(ref)), 1e-6))
                row = {"when": stamp, "host": platform.node(), "model": family,
                       "batch": batch, "seq": args.seq, "tool": tool, "ms": round(ms, 2),
                       "ratio_to_best_fp32_peer": round(ms / best, 3),
                       "max_rel_diff_vs_braze": f"{err:.1e}",
                       "braze_compile_s": round(compile_s, 2) if tool == "braze" else ""}
                rows.append(row)
                print(f"{family:6} b{batch:<2} {tool:11} {ms:9.2f} ms  x{ms / best:5.2f}  "
                      f"diff {err:.1e}", flush=True)
    RESULTS.parent.mkdir(exist_ok=True)
    new = not RESULTS.exists()
    with open(RESULTS, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
