"""Linear quantization with ONNX QuantizeLinear / DequantizeLinear semantics (opset 13+,
per-tensor and per-axis): `quantize`, `dequantize`, and the composite `fake_quantize` (their
round trip, for quantization-aware training).

The scale and zero point are scalars `[]` when `axis` is None, else 1-D of length
`x.shape[axis]`. Quantize rounds `x / scale` half to even (the division in float32 for float32,
float16 and bfloat16 x, as ONNX Runtime does), adds the zero point and saturates to the zero
point's dtype; NaN gives the dtype's minimum, as ONNX Runtime does. Dequantize computes
`(q - zero_point) * scale` in float32 (float64 for a float64 scale) and rounds once to the
scale's dtype."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dtypes import i8, i32, u8
from ..op import Op, require
from ..shapes import Shape

__all__ = ["Quantize", "Dequantize", "FakeQuantize", "QUANT_DTYPES", "quant_range"]

QUANT_DTYPES = (i8, u8)  # what quantize produces
_DEQUANT_DTYPES = (i8, u8, i32)  # what dequantize reads


def quant_range(dtype) -> tuple[int, int]:
    """(min, max) representable in the integer dtype `dtype` (a DType or NumPy dtype)."""
    info = np.iinfo(dtype.np if hasattr(dtype, "np") else dtype)
    return int(info.min), int(info.max)


def _check_params(op: Op, x: Shape, scale: Shape, zp: Shape) -> None:
    """Scale and zero point fit x and `op.axis` (scalars, or 1-D of length x.shape[axis])."""
    if op.axis is None:
        require(scale.rank == 0 and zp.rank == 0,
                f"{op.kind} with axis=None needs a scalar scale and zero_point, got "
                f"{scale} and {zp}; pass axis= for per-axis (per-channel) parameters")
        return
    require(0 <= op.axis < x.rank,
            f"{op.kind} axis {op.axis} is out of range for rank {x.rank}")
    n = x.dims[op.axis]
    for what, s in (("scale", scale), ("zero_point", zp)):
        require(s.dims == (n,), f"{op.kind} on axis {op.axis} needs a 1-D {what} of length "
                                f"{n} (x.shape[{op.axis}]), got {s}")


def _along(p: np.ndarray, axis: int | None, rank: int) -> np.ndarray:
    """A per-axis parameter reshaped to broadcast along `axis` of a rank-`rank` tensor."""
    if axis is None:
        return p
    return p.reshape([-1 if a == axis else 1 for a in range(rank)])


def _compute_type(dtype: np.dtype) -> type:
    return np.float64 if dtype == np.float64 else np.float32


@dataclass(frozen=True)
class Quantize(Op):
    """`saturate(round_half_to_even(x / scale) + zero_point)`; the output has zero_point's dtype
    (i8 or u8). Inputs `(x, scale, zero_point)`; scale has x's (float) dtype."""

    kind = "quantize"
    arity = 3
    axis: int | None = None

    def infer(self, ins):
        x, scale, zp = ins
        require(x.dtype.is_float, f"quantize needs a float x, got {x.dtype}")
        require(scale.dtype == x.dtype,
                f"quantize needs a scale of x's dtype {x.dtype}, got {scale.dtype}")
        require(zp.dtype in QUANT_DTYPES,
                f"quantize needs an i8 or u8 zero_point (it gives the output dtype), got "
                f"{zp.dtype}")
        _check_params(self, x, scale, zp)
        return x.with_dtype(zp.dtype)

    def reference(self, x, scale, zp):
        ct = _compute_type(x.dtype)
        rank = np.ndim(x)
        v = np.rint(x.astype(ct) / _along(scale.astype(ct), self.axis, rank))
        v = v.astype(np.float64) + _along(zp.astype(np.float64), self.axis, rank)
        lo, hi = quant_range(zp.dtype)
        v = np.where(np.isnan(v), lo, np.clip(v, lo, hi))
        return v.astype(zp.dtype)


@dataclass(frozen=True)
class Dequantize(Op):
    """`(q - zero_point) * scale` in the scale's (float) dtype. Inputs `(q, scale, zero_point)`;
    q is i8, u8 or i32 and zero_point has q's dtype."""

    kind = "dequantize"
    arity = 3
    axis: int | None = None

    def infer(self, ins):
        q, scale, zp = ins
        require(q.dtype in _DEQUANT_DTYPES, f"dequantize needs an i8, u8 or i32 q, got {q.dtype}")
        require(zp.dtype == q.dtype,
                f"dequantize needs a zero_point of q's dtype {q.dtype}, got {zp.dtype}")
        require(scale.dtype.is_float, f"dequantize needs a float scale, got {scale.dtype}")
        _check_params(self, q, scale, zp)
        return q.with_dtype(scale.dtype)

    def reference(self, q, scale, zp):
        ct = _compute_type(scale.dtype)
        rank = np.ndim(q)
        centered = q.astype(np.int64) - _along(zp.astype(np.int64), self.axis, rank)
        y = centered.astype(ct) * _along(scale.astype(ct), self.axis, rank)
        return y.astype(scale.dtype, copy=False)


@dataclass(frozen=True)
class FakeQuantize(Op):
    """`dequantize(quantize(x))` with one scale and zero point: x rounded to the grid the
    quantized dtype (zero_point's, i8 or u8) can represent, in x's dtype. Its gradient is
    straight-through inside the representable range and 0 outside it (torch's
    fake_quantize_per_tensor_affine / per_channel_affine)."""

    kind = "fake_quantize"
    arity = 3
    composite = True
    axis: int | None = None

    def infer(self, ins):
        Quantize(self.axis).infer(ins)
        return ins[0]

    def decompose(self, g, ins):
        x, scale, zp = ins
        q = g.add_node(Quantize(self.axis), (x, scale, zp))[0]
        return g.add_node(Dequantize(self.axis), (q, scale, zp))[0]
