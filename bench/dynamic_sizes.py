"""One compile for every image size: the rapidocr PP-OCRv4 text detector imported with its size
dynamic ("32*h", "32*w") and compiled once, against ONNX Runtime on the original file, over a
sequence of image sizes as an OCR service meets them (rendered text, so the detector has
something to find). Per size: the first call (braze plans a
program for the new size: memory plan, kernels, the conv path taken from a measured nearby size),
then the median of steady calls, side by side in interleaved rounds (2 threads). Appends rows to
bench/results/dynamic_sizes.csv.

    python bench/dynamic_sizes.py [--sizes 320x320,480x640,...] [--repeat 10] [--label NAME]"""
from __future__ import annotations

import os

THREADS = 2
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, str(THREADS))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import datetime  # noqa: E402
import importlib.util  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from fuse_time import append_csv  # noqa: E402  (bench/ is the script's directory)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "dynamic_sizes.csv"
SIZES = "320x320,480x640,640x480,352x288,736x736,320x320"


def _detector() -> Path:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("needs rapidocr-onnxruntime (pip install -e '.[bench]')")
    return Path(spec.submodule_search_locations[0]) / "models" / "ch_PP-OCRv4_det_infer.onnx"


def _text_image(h: int, w: int) -> np.ndarray:
    """Lines of black text on white, normalized as rapidocr does, NCHW (noise gives the
    detector nothing to find: outputs near 0 make relative differences meaningless)."""
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (w, h), (255, 255, 255))
    font = ImageFont.load_default(size=24)
    draw = ImageDraw.Draw(img)
    for y in range(8, h - 24, 40):
        draw.text((8, y), "braze compiles every size 0123456789", fill=(0, 0, 0), font=font)
    a = np.asarray(img, np.float32) / 255.0
    return np.ascontiguousarray(((a - 0.5) / 0.5).transpose(2, 0, 1)[None])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=SIZES)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    import onnxruntime as ort

    import braze as bz

    path = _detector()
    t = time.perf_counter()
    exe = bz.compile(bz.import_onnx(path, input_shapes={"x": (1, 3, "32*h", "32*w")}))
    print(f"import + compile: {time.perf_counter() - t:.2f} s (programs are planned per size)")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    tools = {"braze": lambda x: exe({"x": x})[0], "ort": lambda x: sess.run(None, {"x": x})[0]}
    rows, when = [], datetime.datetime.now().isoformat(timespec="seconds")
    for size in args.sizes.split(","):
        h, w = (int(v) for v in size.split("x"))
        x = _text_image(h, w)
        first, outs = {}, {}
        for name, fn in tools.items():
            t = time.perf_counter()
            outs[name] = fn(x)
            first[name] = time.perf_counter() - t
        times = {name: [] for name in tools}
        for r in range(args.repeat):
            for name in (list(tools) if r % 2 else list(tools)[::-1]):
                t = time.perf_counter()
                tools[name](x)
                times[name].append(time.perf_counter() - t)
        ms = {name: statistics.median(v) * 1e3 for name, v in times.items()}
        scale = float(np.abs(outs["ort"]).max()) or 1.0
        load = f"{os.getloadavg()[0]:.2f}"
        for name in tools:
            diff = float(np.abs(outs[name] - outs["ort"]).max()) / scale
            rows.append(dict(when=when, label=args.label, load_avg=load, size=size, tool=name,
                             first_ms=round(first[name] * 1e3, 1), ms=round(ms[name], 2),
                             x_ort=round(ms[name] / ms["ort"], 3),
                             max_rel_diff_vs_ort=f"{diff:.1e}"))
            print(f"{size:>9} {name:6} first {first[name] * 1e3:8.1f} ms  steady "
                  f"{ms[name]:7.2f} ms  x ort {ms[name] / ms['ort']:.3f}  diff {diff:.1e}")
    append_csv(str(RESULTS), rows)


if __name__ == "__main__":
    main()
