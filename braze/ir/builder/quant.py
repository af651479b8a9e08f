"""Builder methods for linear quantization: quantize, dequantize and fake_quantize. A scale or
zero point given as a Python number, sequence or NumPy array becomes a constant of the right
dtype (the scale x's dtype, the zero point the quantized dtype); axes are stored non-negative."""
from __future__ import annotations

import numpy as np

from ...errors import GraphError
from ..dtypes import DType, dtype_from_numpy, i8
from ..op import Value
from ..ops.quant import Dequantize, FakeQuantize, Quantize

__all__ = ["QuantBuilder"]


class QuantBuilder:
    def quantize(self, x: Value, scale, zero_point=0, *, axis: int | None = None,
                 dtype: DType = i8) -> Value:
        """`saturate(round_half_to_even(x / scale) + zero_point)` as `dtype` (i8 or u8; a
        zero_point Value gives its own dtype). `axis` makes scale / zero_point per-axis 1-D."""
        x, scale, zp, ax = self._quant_args(x, scale, zero_point, axis, dtype)
        return self.add_node(Quantize(ax), (x, scale, zp))[0]

    def dequantize(self, q: Value, scale, zero_point=0, *, axis: int | None = None) -> Value:
        """`(q - zero_point) * scale` in the scale's dtype (a NumPy float's, else f32)."""
        qs = self.shape_of(q)
        ax = _axis(axis, qs.rank)
        float_array = isinstance(scale, (np.ndarray, np.floating)) and scale.dtype.kind == "f"
        scale = self._quant_param(scale, scale.dtype if float_array else np.float32, qs, ax)
        zero_point = self._quant_param(zero_point, qs.dtype.np, qs, ax)
        return self.add_node(Dequantize(ax), (q, scale, zero_point))[0]

    def fake_quantize(self, x: Value, scale, zero_point=0, *, axis: int | None = None,
                      dtype: DType = i8) -> Value:
        """`dequantize(quantize(x))`: x on the grid `dtype` (i8 or u8) represents, in x's
        dtype. Its gradient is straight-through inside that range and 0 outside."""
        x, scale, zp, ax = self._quant_args(x, scale, zero_point, axis, dtype)
        return self.add_node(FakeQuantize(ax), (x, scale, zp))[0]

    def _quant_args(self, x: Value, scale, zero_point, axis, dtype: DType):
        xs = self.shape_of(x)
        ax = _axis(axis, xs.rank)
        scale = self._quant_param(scale, xs.dtype.np, xs, ax)
        zero_point = self._quant_param(zero_point, dtype.np, xs, ax)
        return x, scale, zero_point, ax

    def _quant_param(self, p, np_dtype, xs, axis: int | None) -> Value:
        """`p` as a Value: a number becomes a constant, repeated along a static per-axis dim."""
        if isinstance(p, Value):
            return p
        np_dtype = np.dtype(np_dtype)
        if np_dtype.kind in "iu":
            raw = np.asarray(p)
            info = np.iinfo(np_dtype)
            if raw.size and (raw.min() < info.min or raw.max() > info.max):
                raise GraphError(f"zero_point {p!r} does not fit {dtype_from_numpy(np_dtype)} "
                                 f"[{info.min}, {info.max}]; pass dtype=bz.u8 or bz.i8 to match")
        arr = np.asarray(p, np_dtype)
        if axis is not None and 0 <= axis < xs.rank and arr.ndim == 0 \
                and isinstance(xs.dims[axis], int):
            arr = np.full(xs.dims[axis], arr, np_dtype)
        return self.constant(arr, dtype_from_numpy(arr.dtype))


def _axis(axis: int | None, rank: int) -> int | None:
    """`axis` made non-negative when in range; an out-of-range axis is left for the op's
    inference to refuse, naming the node."""
    if axis is None:
        return None
    return int(axis) % rank if rank and -rank <= axis < rank else int(axis)
