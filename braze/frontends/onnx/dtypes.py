"""ONNX element types <-> braze dtypes."""
from __future__ import annotations

from ...errors import FrontendError
from ...ir.dtypes import DType, bf16, bool_, c64, f16, f32, f64, i8, i16, i32, i64, u8, u32

__all__ = ["onnx_dtype", "onnx_type_name", "ONNX_TO_BRAZE", "BRAZE_TO_ONNX"]

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
