"""braze's float -> integer conversion, defined for every value (NaN, infinities, values out of
the target's range), so the interpreter, the NumPy kernels and the generated C agree on any
machine (a C cast of such a value is undefined behaviour, and CPUs differ).

The values are what ONNX Runtime, PyTorch and NumPy give on x86-64 (its truncating
conversions; checked against ONNX Runtime in tests/runtime/test_float_to_int_casts.py),
written as rules: in range, the value truncated toward zero. Otherwise:
- int64: INT64_MIN for NaN, +-inf and values outside [-2^63, 2^63).
- int8, int16, int32, uint8: convert to int32 (truncated; INT32_MIN for NaN, +-inf and values
  outside [-2^31, 2^31)), then keep the low bits (wrap modulo 2^bits): 300 -> int8 44,
  -1.0 -> uint8 255, NaN -> int8 0, NaN -> int32 -2147483648.
- uint32: convert to int64 as above, then keep the low 32 bits: NaN, +-inf, 2^32 -> 0,
  -1.0 -> 4294967295, -3e9 -> 1294967296. (This is the peers' element-at-a-time result; their
  vectorized uint32 loops give 2147483648 for NaN, -inf and -3e9 instead: they disagree with
  themselves, so braze takes the rule that is one conversion for every element.)
- bool: x != 0 (NaN is true).
Every float dtype converts through float64, which holds its values exactly."""
from __future__ import annotations

import numpy as np

__all__ = ["float_to_int"]


def float_to_int(x, dtype: np.dtype) -> np.ndarray:
    """`x` (a float array) converted to the integer or bool NumPy `dtype` as described above."""
    dtype = np.dtype(dtype)
    v = np.asarray(x).astype(np.float64)
    if dtype == np.bool_:
        return v != 0
    if dtype == np.int64:
        return _truncated_or_min(v, np.int64)
    if dtype == np.uint32:
        return _truncated_or_min(v, np.int64).astype(np.uint32)
    if dtype.kind in "iu" and dtype.itemsize <= 4:
        return _truncated_or_min(v, np.int32).astype(dtype)
    raise TypeError(f"no float -> {dtype} conversion is defined")


def _truncated_or_min(v: np.ndarray, int_type) -> np.ndarray:
    """trunc(v) where it lies in int_type's range, int_type's minimum elsewhere (NaN too)."""
    low = float(np.iinfo(int_type).min)
    ok = (v >= low) & (v < -low)
    return np.where(ok, np.trunc(np.where(ok, v, 0.0)), low).astype(int_type)
