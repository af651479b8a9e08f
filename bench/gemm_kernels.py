"""float32 GEMM throughput at transformer shapes (BERT-base / GPT-2 by default, `--shapes llama`
or `minilm`, or MxKxN): braze's packed-weight kernel (packed_gemm.py, weight packed once
outside the timing) against NumPy's matmul (its OpenBLAS), MKL's cblas_sgemm (whole matrix,
MKL's own threading), ONNX Runtime's MLAS (a one-MatMul model with the weight as an
initializer, which MLAS pre-packs; output bound in place) and braze's MKL path (gemm_bias_act:
MKL sgemm per output tile in one OpenMP region). `--baseline REV` adds the packed kernel as of
git revision REV (`braze_packed_base`). Every method computes out = x @ w (+ bias, + GELU for
the `_gelu` rows, which only the braze kernels fuse) into a preallocated output; the methods
run interleaved, round by round, so machine load hits them alike. `--cold C` rotates C copies
of the weight (C x the weight's size past the 32 MB L3: the weights come from memory, as in a
model). GFLOP/s from the median and the best round. `--clock cpu` times process CPU time
instead of wall time (GFLOP per CPU second, all threads summed): on a loaded machine it shows
the kernels' own cost without the time the OS gives to other processes.

Each thread count runs in its own process (OMP_NUM_THREADS / OPENBLAS_NUM_THREADS /
MKL_NUM_THREADS are read when the libraries load).

`braze_int8` is the int8 GEMM of dynamic quantization (int8_gemm.py: the weight quantized per
column and packed once outside the timing, the operand quantized per row inside it, the
epilogue dequantizing); its error is the quantization's, not the kernel's. `--methods a,b`
runs only those methods (e.g. `braze_packed,braze_int8`).

    python bench/gemm_kernels.py [--threads 1,2] [--repeat 15] [--csv PATH] [--shapes bert]
        [--cold 1] [--baseline REV]

`--model bert` (or gpt2, llama, minilm: executor_vs_peers' models) instead runs that model
end to end at seq 128 (batch 1, or `--batch B`), compiled twice in one process, with the packed
GEMM (the default) and with BRAZE_PACKED_GEMM=0 (the MKL tiles), or with `--baseline REV` with
the packed kernel as of REV instead of the MKL tiles; calls interleaved; it prints both and the
process RSS growth of each compile (the packed copies of the weights).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import os
import platform
import subprocess
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPE_SETS = {  # (k, n) of each GEMM of a layer, at M = 128 and 1024 (batch 1 and 8, seq 128)
    "bert": ((768, 2304), (768, 768), (768, 3072), (3072, 768)),
    "llama": ((768, 1280), (768, 768), (768, 4096), (2048, 768)),
    "minilm": ((384, 1152), (384, 384), (384, 1536), (1536, 384)),
}
FIELDS = ["date", "machine", "load", "clock", "threads", "m", "k", "n", "method", "gflops_median",
          "gflops_best", "ms_median", "max_abs_err", "cold"]


def baseline_module(rev: str) -> types.ModuleType:
    """braze/runtime/kernels/packed_gemm.py as of git revision `rev`, loaded beside the current
    one (its library compiles under its own source hash)."""
    src = subprocess.run(["git", "show", f"{rev}:braze/runtime/kernels/packed_gemm.py"],
                         cwd=HERE, capture_output=True, text=True, check=True).stdout
    mod = types.ModuleType("braze.runtime.kernels._packed_gemm_baseline")
    mod.__package__ = "braze.runtime.kernels"
    exec(compile(src, f"packed_gemm.py@{rev}", "exec"), mod.__dict__)  # noqa: S102
    return mod


@contextlib.contextmanager
def packed_kernel(mod):
    """The executor's packed GEMM (pack and gemm) taken from `mod` inside the block."""
    from braze.runtime.kernels import packed_gemm as pg  # noqa: PLC0415

    saved = pg.pack, pg.gemm
    pg.pack, pg.gemm = mod.pack, mod.gemm
    try:
        yield
    finally:
        pg.pack, pg.gemm = saved


def _ort_matmul(w, threads: int):
    """(session, binder factory) for y = x @ w in ONNX Runtime (w an initializer), or None."""
    try:
        import onnxruntime as ort  # noqa: PLC0415
        from onnx import TensorProto, helper, numpy_helper  # noqa: PLC0415
    except ImportError:
        return None
    k, n = w.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # see main()
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def _ort_call(sess, x, out):
    """A zero-argument call running sess on x into `out` (both bound in place)."""
    import numpy as np  # noqa: PLC0415

    binding = sess.io_binding()
    binding.bind_input("x", "cpu", 0, np.float32, list(x.shape), x.ctypes.data)
    binding.bind_output("y", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
    return lambda: sess.run_with_iobinding(binding)


def _methods(x, ws, bias, out, threads, baseline):
    """name -> callable(i) computing into `out` with the i-th weight copy (of `ws`)."""
    import numpy as np  # noqa: PLC0415 - loaded after the thread env vars are set

    from braze.runtime.kernels import blas, c_snippets, fused, native  # noqa: PLC0415
    from braze.runtime.kernels import packed_gemm as pg  # noqa: PLC0415

    lib = native.lib()
    copies = len(ws)
    gelu = c_snippets.ACT_CODES["gelu"]
    sgemm = blas._mkl()  # noqa: SLF001 - the raw cblas_sgemm, for the whole-matrix MKL row
    m, k = x.shape
    n = ws[0].shape[1]
    methods = {"numpy_openblas": lambda i: np.matmul(x, ws[i % copies], out=out)}
    kernels = {"braze_packed": pg} | ({"braze_packed_base": baseline} if baseline else {})
    for name, mod in kernels.items():
        packs = [mod.pack(w) for w in ws]
        methods[name] = lambda i, mod=mod, p=packs: mod.gemm(x, p[i % copies], out, None, 0)
        methods[name + "_gelu"] = (lambda i, mod=mod, p=packs:
                                   mod.gemm(x, p[i % copies], out, bias, gelu))
    if sgemm is not None:
        methods["mkl_sgemm"] = lambda i: sgemm(101, 111, 111, m, n, k, 1.0, x.ctypes.data, k,
                                               ws[i % copies].ctypes.data, n, 0.0,
                                               out.ctypes.data, n)
        methods["braze_mkl_tiles"] = lambda i: fused.gemm_bias_act(lib, x, ws[i % copies], out,
                                                                   None, 0)
        methods["braze_mkl_tiles_gelu"] = lambda i: fused.gemm_bias_act(
            lib, x, ws[i % copies], out, bias, gelu)
    _int8_methods(methods, x, ws, bias, out)
    sessions = [_ort_matmul(w, threads) for w in ws]
    if sessions[0] is not None:
        runs = [_ort_call(sess, x, out) for sess in sessions]
        methods["ort_mlas"] = lambda i: runs[i % copies]()
    return methods


def _int8_methods(methods: dict, x, ws, bias, out) -> None:
    """braze_int8 (+ _gelu) into `methods`, where the CPU has AVX512-VNNI."""
    import numpy as np  # noqa: PLC0415

    from braze.passes.quant import quantize_weight  # noqa: PLC0415
    from braze.runtime.kernels import c_snippets, int8_gemm  # noqa: PLC0415

    if not int8_gemm.available():
        return
    weights = [int8_gemm.Int8Weight(*quantize_weight(w)) for w in ws]
    scratch = np.empty(int8_gemm.scratch_bytes(*x.shape), np.uint8)
    gelu, copies = c_snippets.ACT_CODES["gelu"], len(ws)
    methods["braze_int8"] = lambda i: int8_gemm.gemm(x, weights[i % copies], out, None, 0,
                                                     scratch)
    methods["braze_int8_gelu"] = lambda i: int8_gemm.gemm(x, weights[i % copies], out, bias,
                                                          gelu, scratch)


def _gelu(v, erf):
    return 0.5 * v * (1.0 + erf(v / 2 ** 0.5))


def _shapes(spec: str) -> list[tuple[int, int, int]]:
    """`bert,llama` (SHAPE_SETS at M = 128 and 1024) or `MxKxN` entries, comma separated."""
    out = []
    for part in spec.split(","):
        if part in SHAPE_SETS:
            out += [(m, k, n) for m in (128, 1024) for k, n in SHAPE_SETS[part]]
        else:
            m, k, n = (int(v) for v in part.split("x"))
            out.append((m, k, n))
    return out


def _child(threads: int, args) -> None:
    import numpy as np  # noqa: PLC0415
    from scipy.special import erf  # noqa: PLC0415

    from braze.runtime.kernels import native  # noqa: PLC0415

    repeat, csv_path, clock = args.repeat, args.csv, args.clock
    baseline = baseline_module(args.baseline) if args.baseline else None
    native.lib().braze_set_threads(threads)
    now = time.process_time if clock == "cpu" else time.perf_counter
    rng = np.random.default_rng(0)
    load = os.getloadavg()[0]
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    rows = []
    for m, k, n in _shapes(args.shapes):
        x = rng.standard_normal((m, k), dtype=np.float32)
        ws = [rng.standard_normal((k, n), dtype=np.float32) / np.float32(k ** 0.5)
              for _ in range(max(args.cold, 1))]
        bias = rng.standard_normal(n, dtype=np.float32)
        out = np.empty((m, n), np.float32)
        methods = _methods(x, ws, bias, out, threads, baseline)
        if args.methods:
            methods = {k: v for k, v in methods.items() if k in args.methods.split(",")}
        exact = x.astype(np.float64) @ ws[0].astype(np.float64)
        err = {}
        for name, fn in methods.items():
            out[...] = np.nan
            fn(0)
            want = _gelu(exact + bias, erf) if name.endswith("_gelu") else exact
            err[name] = float(np.abs(out - want).max())
        times = {name: [] for name in methods}
        order = list(methods)
        for r in range(repeat * len(ws)):  # a new order each round: no method always runs
            rng.shuffle(order)               # first, or right after the same other one
            for name in order:
                t0 = now()
                methods[name](r)
                times[name].append(now() - t0)
        flops = 2 * m * k * n
        for name, ts in times.items():
            med, best = float(np.median(ts)), min(ts)
            rows.append(dict(date=stamp, machine=platform.machine(), load=f"{load:.2f}",
                             clock=clock, threads=threads, m=m, k=k, n=n, method=name,
                             cold=len(ws),
                             gflops_median=f"{flops / med / 1e9:.1f}",
                             gflops_best=f"{flops / best / 1e9:.1f}", ms_median=f"{med * 1e3:.3f}",
                             max_abs_err=f"{err[name]:.2e}"))
            print(f"t={threads} {m:5d} {k:5d} {n:5d} {name:22s} median {flops / med / 1e9:6.1f}"
                  f"  best {flops / best / 1e9:6.1f} GFLOP/s  err {err[name]:.1e}", flush=True)
    _append_csv(csv_path, FIELDS, rows)


def _append_csv(path: str, fields: list[str], rows: list[dict]) -> None:
    """Append rows; a file written before a column was added keeps its own header."""
    if os.path.exists(path):
        with open(path, newline="") as f:
            fields = next(csv.reader(f), fields)
        new = False
    else:
        new = True
    with open(path, "a", newline="") as f:
        wr = csv.DictWriter(f, fields, extrasaction="ignore")
        if new:
            wr.writeheader()
        wr.writerows(rows)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def _cpu_interleaved_ms(calls: dict, repeat: int) -> dict:
    """{name: (median, fastest) ms of process CPU time}, calls interleaved round by round."""
    import numpy as np  # noqa: PLC0415

    times: dict = {k: [] for k in calls}
    for fn in calls.values():
        fn()
    for _ in range(repeat):
        for k, fn in calls.items():
            t0 = time.process_time()
            fn()
            times[k].append(time.process_time() - t0)
    return {k: (float(np.median(v)) * 1e3, min(v) * 1e3) for k, v in times.items()}


MODEL_FIELDS = ["date", "load", "model", "batch", "threads", "clock", "variant", "ms_median",
                "ms_fastest", "vs_reference_median", "vs_reference_fastest", "rounds"]


def _model_ab(name: str, args) -> None:
    """The model compiled twice in one process: `reference` (the MKL tiles, or with
    --baseline the packed kernel as of that revision) and `packed` (the current kernel);
    calls interleaved."""
    sys.path.insert(0, HERE)
    import executor_vs_peers as peers  # noqa: PLC0415 - bench/ sibling

    threads, clock, batch = int(args.threads.split(",")[-1]), args.clock, args.batch
    base = baseline_module(args.baseline) if args.baseline else None
    model = peers.load_model(name)
    feeds = peers.make_feeds(model, batch, 128)
    ref_label = f"packed@{args.baseline}" if base else "mkl_tiles"
    exes, rss, kernels = {}, {}, {}
    for label, flag in ((ref_label, "1" if base else "0"), ("packed", "1")):
        kernels[label] = ((lambda: packed_kernel(base)) if base and label == ref_label
                          else contextlib.nullcontext)
        os.environ["BRAZE_PACKED_GEMM"] = flag
        before = _rss_mb()
        with kernels[label]():
            exe = peers.braze_executable(model, None, threads)
            exe(feeds)  # the program (and the packing) is built on the first call
        rss[label] = _rss_mb() - before
        exes[label] = exe
    os.environ.pop("BRAZE_PACKED_GEMM")

    def call(label):
        with kernels[label]():
            return exes[label](feeds)

    a, b = (call(k)[0] for k in (ref_label, "packed"))
    load = os.getloadavg()[0]
    print(f"# {name} b{batch} s128, {threads} threads, {clock} time, load {load:.2f}, "
          f"max |packed - {ref_label}| {float(abs(a - b).max()):.2e}")
    calls = {k: (lambda k=k: call(k)) for k in exes}
    res = (_cpu_interleaved_ms(calls, args.repeat) if clock == "cpu"
           else peers.interleaved_ms(calls, args.repeat))
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    rows = []
    for label, (med, best) in res.items():
        print(f"{name} {label:16s} median {med:8.2f} ms  fastest {best:8.2f} ms  "
              f"compile RSS +{rss[label]:.0f} MB")
        rows.append(dict(date=stamp, load=f"{load:.2f}/{os.getloadavg()[0]:.2f}", model=name,
                         batch=batch, threads=threads, clock=clock, variant=label,
                         ms_median=f"{med:.2f}", ms_fastest=f"{best:.2f}",
                         vs_reference_median=f"{med / res[ref_label][0]:.3f}",
                         vs_reference_fastest=f"{best / res[ref_label][1]:.3f}",
                         rounds=args.repeat))
    print(f"packed / {ref_label}: median {res['packed'][0] / res[ref_label][0]:.3f}, "
          f"fastest {res['packed'][1] / res[ref_label][1]:.3f}  "
          f"(load now {os.getloadavg()[0]:.2f})")
    if args.model_csv:
        _append_csv(args.model_csv, MODEL_FIELDS, rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--csv", default="bench/results/gemm_kernels.csv")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--model", default="", help="end-to-end A/B on this model instead")
    ap.add_argument("--batch", type=int, default=1, help="batch of the --model A/B")
    ap.add_argument("--shapes", default="bert", help="bert, llama, minilm or MxKxN, comma "
                    "separated")
    ap.add_argument("--cold", type=int, default=1, help="weight copies rotated")
    ap.add_argument("--baseline", default="", help="also the packed kernel of this git revision")
    ap.add_argument("--model-csv", default="", help="append the --model A/B rows here")
    ap.add_argument("--methods", default="", help="only these methods, comma separated")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.model:
        for name in args.model.split(","):
            _model_ab(name, args)
        return
    if args.child:
        _child(args.child, args)
        return
    for t in (int(v) for v in args.threads.split(",")):
        # idle pool threads sleep at once (OpenBLAS spins 2^28 cycles by default, ONNX Runtime
        # spins too): a pool still spinning after its own call took a core from the method
        # timed next (2 threads: the packed kernel lost 15-40% when it ran after OpenBLAS)
        env = dict(os.environ, OMP_NUM_THREADS=str(t), OPENBLAS_NUM_THREADS=str(t),
                   MKL_NUM_THREADS=str(t), OPENBLAS_THREAD_TIMEOUT="4")
        print(f"# {t} thread(s), load {os.getloadavg()[0]:.2f}", flush=True)
        subprocess.run([sys.executable, __file__, "--child", str(t), *sys.argv[1:]], env=env,
                       check=True)


if __name__ == "__main__":
    main()
