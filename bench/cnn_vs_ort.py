"""braze's compiled executor on CNNs (fp32, and the bf16 policy) against ONNX Runtime (all
graph optimizations), OpenVINO (f32, and its default precision: bf16 on AMX) and the NumPy
reference interpreter, side by side in one run: the three rapidocr-onnxruntime OCR models
(PP-OCRv4 det and rec, the mobile direction classifier), the builtin ResNet basic block,
ResNet-50, MobileNetV2 and RegNet-Y (Hugging Face's, random weights, 224x224, exported once to
bench/.cache). Median latency per tool (2
threads), ratios to ONNX Runtime, and each tool's max difference from ONNX Runtime relative to
the output's largest magnitude. Appends rows to bench/results/cnn_vs_ort.csv.

    python bench/cnn_vs_ort.py [--models det,rec,cls,resnet,resnet50,mobilenet_v2,regnet]
                               [--repeat 20] [--ref-repeat 2] [--det-size 320] [--settle 0.2]
                               [--label NAME]

The tools are timed in interleaved rounds (one call each per round), so load from other
processes on a shared machine falls on all of them alike; each call starts `--settle` seconds
after the one before, and every tool runs with its default thread pool settings (until
session 18 this script set OMP_WAIT_POLICY=PASSIVE and turned ONNX Runtime's spinning off
instead: braze's OpenMP workers then slept after every step, 2.5 ms of MobileNetV2's 8).
braze runs import -> fuse (cpu target) -> compile; the reference is `bz.interpret` on the
imported graph. braze's threads are capped by OMP_NUM_THREADS / MKL_NUM_THREADS, not
`bz.compile(threads=2)`: on this machine that call starts numba's thread pool, and the runs
then measured ~50x slower."""
from __future__ import annotations

import os

THREADS = 2
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, str(THREADS))

import argparse  # noqa: E402
import csv  # noqa: E402
import datetime  # noqa: E402
import importlib.util  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "cnn_vs_ort.csv"
FIELDS = ["when", "label", "cpu", "threads", "load_avg", "model", "input", "tool", "ms",
          "x_ort", "max_rel_diff_vs_ort", "compile_s", "fused_convs", "reference_nodes"]


def rapidocr_models(det_size: int) -> dict[str, tuple[Path, tuple[int, ...]]]:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None:
        return {}
    root = Path(spec.submodule_search_locations[0]) / "models"
    return {"det": (root / "ch_PP-OCRv4_det_infer.onnx", (1, 3, det_size, det_size)),
            "rec": (root / "ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 320)),
            "cls": (root / "ch_ppocr_mobile_v2.0_cls_infer.onnx", (1, 3, 48, 192))}


def resnet_model(tmp: Path) -> tuple[Path, tuple[int, ...]]:
    """The builtin ResNet basic block (64 channels, 56x56, seeded weights) as standard ONNX."""
    import braze as bz
    from braze.models import resnet_basic_block

    path = tmp / "resnet_block.onnx"
    bz.export_onnx(resnet_basic_block(seed=0), path, target="standard")
    return path, (1, 64, 56, 56)


def ort_session(path: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


HF_VISION = {"resnet50": ("ResNetModel", "ResNetConfig"),
             "mobilenet_v2": ("MobileNetV2Model", "MobileNetV2Config"),
             "regnet": ("RegNetModel", "RegNetConfig")}


def hf_vision_model(name: str) -> tuple[Path, tuple[int, ...]]:
    """A Hugging Face vision backbone of HF_VISION (its default config, random weights, eval
    mode, the pooled features) exported once with the TorchScript exporter to bench/.cache:
    ResNet-50, MobileNetV2 (TF-style "same" pads as Pad nodes, ReLU6 as Clip) and RegNet-Y
    (grouped 3x3 convs of 64-channel groups, squeeze-excitation)."""
    from executor_vs_peers import CACHE, _export_once

    def export(path: Path) -> None:
        import torch
        import transformers

        model_cls, config_cls = HF_VISION[name]
        torch.manual_seed(0)
        net = getattr(transformers, model_cls)(getattr(transformers, config_cls)()).eval()

        class Pooled(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = net

            def forward(self, x):
                return self.net(pixel_values=x).pooler_output

        torch.onnx.export(Pooled(), (torch.randn(1, 3, 224, 224),), str(path), dynamo=False,
                          input_names=["x"], output_names=["features"], opset_version=17)

    return _export_once(CACHE / f"{name}.onnx", export), (1, 3, 224, 224)


def openvino_call(path: Path, feeds: dict, hint: str):
    """(call, output) of OpenVINO on the ONNX file at `hint` precision ("f32" or its
    "default"), as executor_vs_peers sets it up; None without the openvino package."""
    if importlib.util.find_spec("openvino") is None:
        return None
    from types import SimpleNamespace

    from executor_vs_peers import setup_openvino

    return setup_openvino(SimpleNamespace(path=path), feeds, THREADS, hint)


def interleaved_medians(calls: dict, repeat: int, ref_repeat: int, settle: float
                        ) -> dict[str, float]:
    """Median ms per tool over rounds of one call each; the slow reference runs in the first
    `ref_repeat` rounds only. Every tool is called twice first to warm up. Each call starts
    `settle` seconds after the previous one ended (as executor_vs_peers.interleaved_ms): a
    thread pool still spinning after its call would slow whichever tool runs next."""
    for name, fn in calls.items():
        for _ in range(1 if name == "reference" else 2):
            fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(repeat):
        for name, fn in calls.items():
            if name == "reference" and r >= ref_repeat:
                continue
            time.sleep(settle)
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def bench_model(name: str, path: Path, shape, repeat: int, ref_repeat: int, settle: float
                ) -> list[dict]:
    import braze as bz
    from braze.runtime.kernels import Dispatch

    rng = np.random.default_rng(0)
    x = rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
    sess = ort_session(path)
    input_name = sess.get_inputs()[0].name
    feeds = {input_name: x}
    (want,) = sess.run(None, feeds)
    t0 = time.perf_counter()
    g = bz.import_onnx(path, input_shapes={input_name: shape})
    exe = bz.compile(g, "cpu")  # threads come from OMP/MKL_NUM_THREADS (see the docstring)
    (got,) = exe(feeds)
    compile_s = time.perf_counter() - t0
    dispatch = exe.dispatch_report()
    fused = sum(1 for r in dispatch.rows if r[1] == "fused_conv_bias_act")
    on_reference = len(dispatch.by_dispatch(Dispatch.REFERENCE))
    (ref_out,) = bz.interpret(g, feeds)
    scale = float(np.abs(want).max()) or 1.0
    low = bz.compile(g, "cpu", precision="bf16")
    (low_out,) = low(feeds)
    calls = {"braze": lambda: exe(feeds), "braze_bf16": lambda: low(feeds),
             "onnxruntime": lambda: sess.run(None, feeds)}
    diffs = {"braze": float(np.abs(got - want).max()) / scale,
             "braze_bf16": float(np.abs(low_out - want).max()) / scale, "onnxruntime": 0.0}
    for tool, hint in (("openvino_f32", "f32"), ("openvino_default", "default")):
        ov = openvino_call(path, feeds, hint)
        if ov is not None:
            calls[tool], out = ov
            diffs[tool] = float(np.abs(out - want).max()) / scale
    if ref_repeat > 0:  # --ref-repeat 0 leaves the slow reference out of the timing
        calls["reference"] = lambda: bz.interpret(g, feeds)
        diffs["reference"] = float(np.abs(ref_out - want).max()) / scale
    ms = interleaved_medians(calls, repeat, ref_repeat, settle)
    rows = []
    for tool, t in ms.items():
        rows.append({"model": name, "input": "x".join(map(str, shape)), "tool": tool,
                     "ms": f"{t:.2f}", "x_ort": f"{t / ms['onnxruntime']:.3f}",
                     "max_rel_diff_vs_ort": f"{diffs[tool]:.1e}",
                     "compile_s": f"{compile_s:.2f}" if tool == "braze" else "",
                     "fused_convs": fused if tool == "braze" else "",
                     "reference_nodes": on_reference if tool == "braze" else ""})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="det,rec,cls,resnet,resnet50,mobilenet_v2,regnet")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--ref-repeat", type=int, default=2)
    ap.add_argument("--det-size", type=int, default=320)
    ap.add_argument("--settle", type=float, default=0.2)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    if args.repeat < 1 or args.ref_repeat < 0:
        ap.error("--repeat must be at least 1 and --ref-repeat at least 0")
    ocr = rapidocr_models(args.det_size)
    when = datetime.datetime.now().isoformat(timespec="seconds")
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), "?")
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for name in args.models.split(","):
            if name == "resnet":
                path, shape = resnet_model(Path(tmp))
            elif name in HF_VISION:
                path, shape = hf_vision_model(name)
            elif name in ocr:
                path, shape = ocr[name]
            else:
                print(f"skip {name}: rapidocr-onnxruntime is not installed or unknown model")
                continue
            load = f"{os.getloadavg()[0]:.2f}"
            for row in bench_model(name, path, shape, args.repeat, args.ref_repeat,
                                   args.settle):
                row.update(when=when, label=args.label, cpu=cpu, threads=THREADS, load_avg=load)
                rows.append(row)
                print(f"{row['model']:<7} {row['input']:<14} {row['tool']:<16} "
                      f"{row['ms']:>10} ms  x_ort {row['x_ort']:>8}  "
                      f"diff {row['max_rel_diff_vs_ort']}", flush=True)
    new = not RESULTS.exists()
    with open(RESULTS, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
