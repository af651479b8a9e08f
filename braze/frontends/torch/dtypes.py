"""torch dtypes <-> braze dtypes, and torch tensors as NumPy arrays of braze's element types."""
from __future__ import annotations

import numpy as np

from ...errors import FrontendError
from ...ir.dtypes import DType, bf16, bool_, c64, f16, f32, f64, i8, i16, i32, i64, u8, u32

__all__ = ["braze_dtype", "torch_dtype", "to_numpy"]


def _table():
    import torch

    return {torch.float32: f32, torch.float16: f16, torch.bfloat16: bf16, torch.float64: f64,
            torch.int8: i8, torch.int16: i16, torch.int32: i32, torch.int64: i64,
            torch.uint8: u8, torch.uint32: u32, torch.bool: bool_, torch.complex64: c64}


_TO_BRAZE: dict = {}


def braze_dtype(dt, where: str = "") -> DType:
    """The braze DType of torch dtype `dt`; FrontendError (naming `where`) when braze has none."""
    if not _TO_BRAZE:
        _TO_BRAZE.update(_table())
    try:
        return _TO_BRAZE[dt]
    except KeyError:
        known = ", ".join(str(t).replace("torch.", "") for t in _TO_BRAZE)
        raise FrontendError(f"{where}: torch dtype {dt} has no braze equivalent (braze has "
                            f"{known})") from None


def torch_dtype(dt: DType):
    """The torch dtype of braze DType `dt`."""
    if not _TO_BRAZE:
        _TO_BRAZE.update(_table())
    for t, b in _TO_BRAZE.items():
        if b == dt:
            return t
    raise FrontendError(f"braze dtype {dt} has no torch equivalent")


def to_numpy(t, where: str = "") -> np.ndarray:
    """A detached CPU copy of tensor `t` as a NumPy array of its braze element type (bfloat16
    through float32, which holds every bfloat16 exactly)."""
    import torch

    dt = braze_dtype(t.dtype, where)
    t = t.detach().to("cpu")
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(dt.np)
    if t.dtype == torch.uint32:
        return t.to(torch.int64).numpy().astype(np.uint32)
    return np.array(t.numpy(), copy=True)
