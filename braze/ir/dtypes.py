"""Element types of braze tensors, each tied to the NumPy dtype the reference interpreter uses."""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class DType:
    """A tensor element type: its short name (`f32`) and NumPy equivalent."""

    name: str
    np_name: str
    kind: str  # "float", "int", "uint", "bool", "complex"

    @property
    def np(self) -> np.dtype:
        return _NP[self.name]

    @property
    def itemsize(self) -> int:
        return self.np.itemsize

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__


f32 = DType("f32", "float32", "float")
f16 = DType("f16", "float16", "float")
bf16 = DType("bf16", "bfloat16", "float")
f64 = DType("f64", "float64", "float")
i8 = DType("i8", "int8", "int")
i16 = DType("i16", "int16", "int")
i32 = DType("i32", "int32", "int")
i64 = DType("i64", "int64", "int")
u8 = DType("u8", "uint8", "uint")
u32 = DType("u32", "uint32", "uint")
bool_ = DType("bool", "bool", "bool")
c64 = DType("c64", "complex64", "complex")

ALL_DTYPES: tuple[DType, ...] = (f32, f16, bf16, f64, i8, i16, i32, i64, u8, u32, bool_, c64)
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_NP = {d.name: np.dtype(ml_dtypes.bfloat16 if d.name == "bf16" else d.np_name) for d in ALL_DTYPES}


def dtype_from_name(name: str) -> DType:
    """The DType called `name` (`f32`, `bf16`, `bool`, ...)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(_BY_NAME)}") from None


def dtype_from_numpy(dt) -> DType:
    """The DType matching a NumPy dtype (or anything `np.dtype` accepts)."""
    dt = np.dtype(dt)
    for d in ALL_DTYPES:
        if _NP[d.name] == dt:
            return d
    raise ValueError(f"NumPy dtype {dt} has no braze equivalent")
