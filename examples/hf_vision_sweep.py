"""Sweep the Hugging Face vision families (braze.models.hf_vision) through the whole pipeline
and print a table of which stage passes for which family and export:

    import (TorchScript ONNX, dynamo ONNX, bz.import_torch) -> interpreter matches PyTorch ->
    bz.fuse("cpu") matches PyTorch, with the fused kinds counted -> bz.fuse("onnxruntime") +
    bz.export_onnx runs in ONNX Runtime and matches -> bz.compile(fused, "cpu") matches the
    interpreter.

    .venv/bin/python examples/hf_vision_sweep.py [family ...] [--json out.json] [--keep DIR]

Tolerance: 1e-4 relative to the output's largest magnitude. Each failure prints the braze
error (or the largest mismatch) so it can be traced to a node."""
from __future__ import annotations

import argparse
import json
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

import numpy as np

import braze as bz
from braze.models.hf_vision import (
    VISION_FAMILIES,
    export_vision_onnx,
    hf_vision_module,
    vision_inputs,
)

COUNTED = ("conv2d", "batch_norm", "fused_conv_bias_act", "fused_attention_block", "attention",
           "softmax", "fused_residual_ln", "layer_norm", "fused_matmul_bias_act",
           "elementwise_region")


def _close(got, want) -> str:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    scale = float(np.abs(want).max()) or 1.0
    err = float(np.abs(got - want).max()) / scale
    return "ok" if err <= 1e-4 else f"max error {err:.2e} of max |want|"


def _stage(row: dict, name: str, fn):
    """Run one stage; record ok / the mismatch / the error's first line."""
    t = time.perf_counter()
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - the sweep records every failure
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        row[name] = f"ERROR {type(exc).__name__}: {first[:300]}"
        row.setdefault("tracebacks", {})[name] = traceback.format_exc(limit=-4)
        return None
    row[name] = result if isinstance(result, str) else "ok"
    row.setdefault("seconds", {})[name] = round(time.perf_counter() - t, 2)
    return result


def sweep_one(family: str, variant: str, folder: Path) -> dict:
    import onnxruntime as ort
    import torch

    m = hf_vision_module(family)
    feeds = vision_inputs(3, m.image_size, seed=5)
    with torch.no_grad():
        want = m(torch.from_numpy(feeds["pixel_values"])).numpy()
    row: dict = {"family": family, "variant": variant}

    def load():
        if variant == "torch":
            x = torch.from_numpy(vision_inputs(2, m.image_size)["pixel_values"])
            return bz.import_torch(m, (x,), dynamic_shapes={"pixel_values": {0: "batch"}})
        path = folder / f"{family}_{variant}.onnx"
        if not path.exists():
            export_vision_onnx(m, path, variant)
        return bz.import_onnx(str(path))

    g = _stage(row, "import", load)
    if g is None:
        return row
    if _stage(row, "interpret", lambda: _close(bz.interpret(g, feeds)[0], want)) is None:
        return row
    fused = _stage(row, "fuse", lambda: bz.fuse(g, "cpu"))
    if fused is None:
        return row
    fused, report = fused
    row["counts"] = {k: fused.count(k) for k in COUNTED if fused.count(k)}
    row["before"] = {k: g.count(k) for k in COUNTED if g.count(k)}
    row["misses"] = dict(Counter(f"{x.pattern}: {x.reason}" for x in report.misses))
    _stage(row, "fused_matches", lambda: _close(bz.interpret(fused, feeds)[0], want))

    def ort_export():
        ofused, _ = bz.fuse(g, "onnxruntime")
        path = bz.export_onnx(ofused, folder / f"{family}_{variant}_fused.onnx",
                              target="onnxruntime")
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return _close(sess.run(None, feeds)[0], want)

    _stage(row, "ort_export", ort_export)

    def compiled():
        exe = bz.compile(fused, "cpu")
        ref = bz.interpret(fused, feeds)[0]
        return _close(exe(feeds)[0], ref)

    _stage(row, "compile", compiled)
    return row


STAGES = ("import", "interpret", "fuse", "fused_matches", "ort_export", "compile")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("families", nargs="*", default=list(VISION_FAMILIES))
    ap.add_argument("--variants", default="torchscript,dynamo,torch")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--keep", help="folder for the exports (default: a temporary one)")
    args = ap.parse_args()
    folder = Path(args.keep or tempfile.mkdtemp(prefix="hf_vision_"))
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for family in args.families:
        for variant in args.variants.split(","):
            row = sweep_one(family, variant, folder)
            rows.append(row)
            marks = " ".join("." if row.get(s) == "ok" else ("-" if s not in row else "X")
                             for s in STAGES)
            print(f"{family:13s} {variant:11s} {marks}  {row.get('counts', '')}", flush=True)
            for s in STAGES:
                if s in row and row[s] != "ok":
                    print(f"    {s}: {row[s]}", flush=True)
            for miss, n in row.get("misses", {}).items():
                print(f"    miss x{n}: {miss[:160]}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
