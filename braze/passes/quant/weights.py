"""Weight quantization at compile time: symmetric int8 with a scale per output column (or one
for the whole tensor), the weight layout of DynamicQuantMatMul."""
from __future__ import annotations

import numpy as np

__all__ = ["quantize_weight"]


def quantize_weight(w: np.ndarray, per_channel: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(q int8 [K, N], scale float32 [N]) with q * scale ~ w for a [K, N] weight: scale =
    max |w| / 127 over each column (`per_channel`) or over all of w (repeated per column), 1
    where that is 0; q = clip(round_half_even(w / scale), -127, 127), divided in float32 as
    ONNX's QuantizeLinear does. -128 stays unused, so the range is symmetric."""
    w = np.asarray(w, np.float32)
    peak = np.abs(w).max(axis=0) if per_channel else np.full(w.shape[1], np.abs(w).max())
    scale = (peak / np.float32(127)).astype(np.float32)
    scale[~(scale > 0)] = 1
    q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
    return q, scale
