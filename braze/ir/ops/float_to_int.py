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
    x = np.asarray(x)
    if dtype == np.bool_:
        return x != 0
    if dtype in (np.int64, np.uint32):
        wide = np.int64
    elif dtype.kind in "iu" and dtype.itemsize <= 4:
        wide = np.int32
    else:
        raise TypeError(f"no float -> {dtype} conversion is defined")
    v = x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)  # f16 / bf16: exact
    low = np.iinfo(wide).min
    with np.errstate(invalid="ignore"):
        out = v.astype(wide)  # truncation in range; the rest is replaced below
    # both bounds are powers of two (exact); min / max are NaN when a NaN is present
    if v.size and not (v.min() >= float(low) and v.max() < -float(low)):
        out[~((v >= float(low)) & (v < -float(low)))] = low
    return out if wide == dtype else out.astype(dtype)  # integer narrowing wraps
