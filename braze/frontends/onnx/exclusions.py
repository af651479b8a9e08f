"""Bindings an exported braze model refuses, as they travel in an ONNX file.

`bz.export_onnx` writes each graph input's `Input.excludes` into the model's metadata_props
(key `EXCLUDES_KEY`, JSON) and builds a run-time guard for them out of ONNX nodes whose names
start with `GUARD_PREFIX` / `REFUSE_PREFIX` (braze.export.onnx.guards). `import_onnx` reads the
exclusions back onto its inputs and drops the guard nodes, so braze -> ONNX -> braze keeps them
and imports no guard arithmetic as model ops."""
from __future__ import annotations

import json

from ...errors import FrontendError

__all__ = ["EXCLUDES_KEY", "GUARD_PREFIX", "REFUSE_PREFIX", "PASS_PREFIX", "encode_excludes",
           "decode_excludes", "is_guard_node"]

EXCLUDES_KEY = "braze.excludes"
GUARD_PREFIX = "braze_guard_"        # the guard's arithmetic
PASS_PREFIX = "braze_guard_pass_"    # a graph output passed through the guard: y on import
REFUSE_PREFIX = "braze_refuses_"     # the Reshape that fails at run time for a refused binding


def encode_excludes(inputs) -> str | None:
    """The metadata value for the Input ops `inputs` (None when none excludes anything)."""
    rows = [{"input": op.name, "dim": dim, "lo": lo, "hi": hi, "why": why}
            for op in inputs for dim, lo, hi, why in op.excludes]
    return json.dumps(rows) if rows else None


def decode_excludes(text: str, label: str) -> dict[str, tuple]:
    """Input name -> its excludes, from an `EXCLUDES_KEY` metadata value."""
    try:
        out: dict[str, list] = {}
        for row in json.loads(text):
            dim = row["dim"]
            hi = row["hi"]
            out.setdefault(str(row["input"]), []).append(
                (dim if isinstance(dim, int) else str(dim), int(row["lo"]),
                 None if hi is None else int(hi), str(row["why"])))
    except (ValueError, TypeError, KeyError) as e:
        raise FrontendError(f"{label}: metadata {EXCLUDES_KEY!r} is not the list braze writes "
                            f"({type(e).__name__}: {e}); remove it or re-export the model") from e
    return {k: tuple(v) for k, v in out.items()}


def is_guard_node(name: str) -> bool:
    return name.startswith((GUARD_PREFIX, REFUSE_PREFIX))
