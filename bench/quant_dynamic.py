"""Dynamic int8 quantization (`bz.quantize_dynamic`) on the builtin BERT encoder (bz.models,
BERT-base: 12 layers, hidden 768, weights `bz.init_params`-random, batch 1, seq 128 by
default): accuracy of the quantized graph against float32, and time per call of braze fp32,
braze bf16 (the mixed-precision policy), braze int8 and, where the model exports, ONNX
Runtime's fp32 and its own `quantize_dynamic` (per-channel int8 weights, per-tensor u8
activations) of the same model. Every call runs on one thread; the tools are timed
interleaved, round by round, in process CPU time (`--clock wall` for wall time), so load that
comes and goes hits them alike. Run it pinned (`taskset -c 0`) on a shared machine.
`--model hf-bert` runs Hugging Face's BERT-base instead (built from its config with random
weights, exported to ONNX by the TorchScript exporter with sdpa attention, imported with
`bz.import_onnx`): ONNX Runtime then runs that export and quantizes it.

    python bench/quant_dynamic.py [--model builtin|hf-bert] [--layers 12] [--seq 128]
        [--repeat 10] [--csv PATH]
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import tempfile
import time

import numpy as np

FIELDS = ["date", "load", "model", "layers", "seq", "clock", "tool", "ms_median", "ms_fastest",
          "max_abs_err", "rel_err", "mean_rel_err", "quantized", "left"]


def _model(args, tmp: str):
    """(braze graph, feeds, ONNX path of the same model or None)."""
    import braze as bz

    if args.model == "hf-bert":
        from braze.models.hf import export_onnx_variant, hf_inputs, hf_module

        module = hf_module("bert", size="base")
        path = os.path.join(tmp, "hf_bert.onnx")
        export_onnx_variant(module, path, "sdpa")
        g = bz.import_onnx(path)
        names = {g.nodes[i].op.name for i in g.input_ids}
        feeds = {k: v for k, v in hf_inputs(1, args.seq, vocab=module.vocab_size).items()
                 if k in names}
        return g, feeds, path
    g = bz.models.bert_encoder(args.layers, 768, 12, batch=1, seq=args.seq, seed=0)
    feeds = {"hidden": np.random.default_rng(1).standard_normal((1, args.seq, 768),
                                                                np.float32)}
    return g, feeds, bz.export_onnx(g, os.path.join(tmp, "bert.onnx"), target="standard")


def _tools(args):
    """{name: (call, output)} for every tool that runs here; the fp32 output first."""
    import braze as bz

    tmp = tempfile.mkdtemp(prefix="braze_quant_")
    g, feeds, onnx_path = _model(args, tmp)
    q, report = bz.quantize_dynamic(g)
    print(report.summary_line())
    tools = {}
    for name, graph, precision in (("braze_fp32", g, None), ("braze_bf16", g, "bf16"),
                                   ("braze_int8", q, None)):
        exe = bz.compile(graph, precision=precision, threads=1)
        tools[name] = (lambda exe=exe: exe(feeds), exe(feeds)[0])
    tools.update(_ort_tools(onnx_path, feeds, tmp))
    counts = q.op_counts()
    return tools, counts.get("dynamic_quant_matmul", 0), len(report.misses)


def _ort_tools(fp32: str, feeds, tmp: str) -> dict:
    try:
        import onnxruntime as ort
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError:
        return {}
    out = {}
    int8 = os.path.join(tmp, "model_int8.onnx")
    quantize_dynamic(fp32, int8, weight_type=QuantType.QInt8, per_channel=True)
    for name, path in (("ort_fp32", fp32), ("ort_int8", int8)):
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        out[name] = (lambda sess=sess: sess.run(None, feeds), sess.run(None, feeds)[0])
    return out


def _timed(tools: dict, repeat: int, clock) -> dict:
    """{name: (median, fastest) ms}, one call of each per round, the order rotated."""
    for call, _ in tools.values():
        call()
    times = {k: [] for k in tools}
    order = list(tools)
    for r in range(repeat):
        for name in order[r % len(order):] + order[:r % len(order)]:
            t0 = clock()
            tools[name][0]()
            times[name].append(clock() - t0)
    return {k: (float(np.median(v)) * 1e3, min(v) * 1e3) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("builtin", "hf-bert"), default="builtin")
    ap.add_argument("--layers", type=int, default=12, help="layers of the builtin model")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    ap.add_argument("--csv", default="")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    tools, quantized, left = _tools(args)
    ref = tools["braze_fp32"][1]
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    res = _timed(tools, args.repeat, clock)
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    rows = []
    print(f"# {args.model} BERT {args.layers} layers, seq {args.seq}, 1 thread, {args.clock} "
          f"time, load {load:.2f} -> {os.getloadavg()[0]:.2f}; {quantized} matmuls quantized, "
          f"{left} left")
    for name, (med, best) in res.items():
        diff = np.abs(tools[name][1] - ref)
        err = float(diff.max())
        rel = err / float(np.abs(ref).max())
        mean_rel = float(diff.mean() / np.abs(ref).mean())
        print(f"{name:12s} median {med:8.2f} ms  fastest {best:8.2f} ms  "
              f"vs fp32 {res['braze_fp32'][0] / med:5.2f}x  max |err| {err:.3e} (/ max |fp32| "
              f"{rel:.2e}, mean |err| / mean |fp32| {mean_rel:.2e})")
        rows.append(dict(date=stamp, load=f"{load:.2f}/{os.getloadavg()[0]:.2f}",
                         model=args.model, layers=args.layers, seq=args.seq,
                         clock=args.clock, tool=name,
                         ms_median=f"{med:.2f}", ms_fastest=f"{best:.2f}",
                         max_abs_err=f"{err:.3e}", rel_err=f"{rel:.2e}",
                         mean_rel_err=f"{mean_rel:.2e}", quantized=quantized,
                         left=left))
    if args.csv:
        new = not os.path.exists(args.csv)
        with open(args.csv, "a", newline="") as f:
            w = csv.DictWriter(f, FIELDS)
            if new:
                w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
