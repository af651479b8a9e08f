"""ONNX element types <-> braze dtypes, and ONNX tensors as NumPy arrays without copies."""
from __future__ import annotations

import math
import sys

import numpy as np

from ...errors import FrontendError
from ...ir.dtypes import (
    DType,
    bf16,
    bool_,
    c64,
    dtype_from_numpy,
    f16,
    f32,
    f64,
    i8,
    i16,
    i32,
    i64,
    u8,
    u32,
)

__all__ = ["onnx_dtype", "onnx_type_name", "braze_dtype", "tensor_array", "ONNX_TO_BRAZE",
           "BRAZE_TO_ONNX"]

# TensorProto.DataType values (stable in the ONNX spec)
ONNX_TO_BRAZE: dict[int, DType] = {
    1: f32, 2: u8, 3: i8, 5: i16, 6: i32, 7: i64, 9: bool_, 10: f16, 11: f64, 12: u32, 14: c64,
    16: bf16,
}
BRAZE_TO_ONNX: dict[str, int] = {d.name: k for k, d in ONNX_TO_BRAZE.items()}


def onnx_type_name(code: int) -> str:
    """ONNX's name of element type `code` (FLOAT, UINT64, FLOAT8E4M3FN, ...)."""
    try:
        from onnx import TensorProto

        return TensorProto.DataType.Name(int(code))
    except (ImportError, ValueError):
        return f"unknown type code {code}"


def onnx_dtype(code: int, what: str = "tensor") -> DType:
    """The braze dtype of ONNX element type `code`; FrontendError for types braze lacks."""
    try:
        return ONNX_TO_BRAZE[int(code)]
    except KeyError:
        name = onnx_type_name(code)
        raise FrontendError(f"{what} has ONNX element type {name}, which braze does not support "
                            "(supported: float, float16, bfloat16, double, int8/16/32/64, uint8, "
                            "uint32, bool, complex64)") from None


_BY_NUMPY: dict[np.dtype, DType] = {}


def braze_dtype(np_dtype) -> DType:
    """The braze dtype of a NumPy dtype (memoized `dtype_from_numpy`)."""
    dt = _BY_NUMPY.get(np_dtype)
    if dt is None:
        dt = _BY_NUMPY[np_dtype] = dtype_from_numpy(np_dtype)
    return dt


def tensor_array(t, what: str) -> tuple[np.ndarray, DType]:
    """(values, braze dtype) of a TensorProto: raw bytes are viewed (read-only, no copy);
    typed fields go through onnx's converter. FrontendError names `what` when the tensor is
    corrupt or of a type braze lacks."""
    dt = onnx_dtype(t.data_type, what)
    dims = tuple(t.dims)
    if any(d < 0 for d in dims) or t.HasField("segment") or t.data_location == 1:
        raise FrontendError(f"{what} is corrupt or not self-contained (dims {dims})")
    if t.HasField("raw_data"):
        raw = t.raw_data
        n = math.prod(dims)
        if len(raw) != n * dt.itemsize:
            raise FrontendError(f"{what} is corrupt: {dt}{list(dims)} needs {n * dt.itemsize} "
                                f"bytes, its data has {len(raw)}")
        arr = np.frombuffer(raw, dtype=dt.np, count=n).reshape(dims)
        return (arr.byteswap() if sys.byteorder == "big" else arr), dt
    from onnx import numpy_helper

    try:
        arr = np.asarray(numpy_helper.to_array(t)).reshape(dims)
    except Exception as e:  # noqa: BLE001 - a corrupt tensor is a bad model file
        raise FrontendError(f"{what} is corrupt: {e}") from None
    return arr.astype(dt.np, copy=False), dt
