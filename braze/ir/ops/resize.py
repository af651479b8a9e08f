"""Resize: spatial resampling of an NCHW image to an output size, with the interpolation
modes and coordinate conventions of ONNX Resize (what PyTorch, TensorFlow and Paddle exports
emit). `resize_nearest_2x` (conv.py) stays the kind for the common exact 2x nearest case.

Each output index i along an axis maps to a source coordinate (`CoordinateMode`), computed in
float32 as ONNX Runtime does, so ties in nearest rounding resolve the same way:
  half_pixel            (i + 0.5) / scale - 0.5
  half_pixel_symmetric  half_pixel, shifted so the resized grid is centred on the input
  pytorch_half_pixel    half_pixel, but 0 when the output length is 1
  align_corners         i * (in - 1) / (out - 1)  (0 when the output length is 1)
  asymmetric            i / scale
  tf_half_pixel_for_nn  (i + 0.5) / scale
`scale` is the op's `scale` attribute (the ONNX `scales` input) or out / in when None (ONNX
`sizes`). Nearest rounds (`NearestMode`) and clamps to the input; linear interpolates between the
two neighbours of the clamped coordinate; cubic uses Keys' kernel with coefficient `cubic_a`
over four neighbours (edge-replicated, or dropped and renormalized with `exclude_outside`).
Interpolation is separable: one [out, in] weight matrix per axis. The output size may be symbolic
("2*h" for an upsampling of a dynamic image): the tables are then built for each binding from
the actual lengths."""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ..op import Op, require
from ..shapes import Dim, Shape
from ..symbolic import canonical_dim, eval_dim

__all__ = ["Resize", "ResizeMode", "CoordinateMode", "NearestMode"]


class ResizeMode(enum.Enum):
    NEAREST = "nearest"
    LINEAR = "linear"
    CUBIC = "cubic"


class CoordinateMode(enum.Enum):
    HALF_PIXEL = "half_pixel"
    HALF_PIXEL_SYMMETRIC = "half_pixel_symmetric"
    PYTORCH_HALF_PIXEL = "pytorch_half_pixel"
    ALIGN_CORNERS = "align_corners"
    ASYMMETRIC = "asymmetric"
    TF_HALF_PIXEL_FOR_NN = "tf_half_pixel_for_nn"


class NearestMode(enum.Enum):
    ROUND_PREFER_FLOOR = "round_prefer_floor"
    ROUND_PREFER_CEIL = "round_prefer_ceil"
    FLOOR = "floor"
    CEIL = "ceil"


_F = np.float32


def source_coordinates(mode: CoordinateMode, n_in: int, n_out: int,
                       scale: float | None) -> np.ndarray:
    """Float32 source coordinate of every output index along one axis (unclamped)."""
    i = np.arange(n_out, dtype=_F)
    s = _F(scale) if scale is not None else _F(n_out) / _F(n_in)
    half = _F(0.5)
    if mode is CoordinateMode.ASYMMETRIC:
        return i / s
    if mode is CoordinateMode.TF_HALF_PIXEL_FOR_NN:
        return (i + half) / s
    if mode is CoordinateMode.ALIGN_CORNERS:
        if n_out == 1:
            return np.zeros(1, _F)
        return i * _F(n_in - 1) / _F(n_out - 1)
    if mode is CoordinateMode.PYTORCH_HALF_PIXEL and n_out == 1:
        return np.zeros(1, _F)
    x = (i + half) / s - half
    if mode is CoordinateMode.HALF_PIXEL_SYMMETRIC:
        adjustment = _F(n_out) / (s * _F(n_in))
        x = _F(n_in) / _F(2) * (_F(1) - adjustment) + x
    return x


def nearest_indices(coords: np.ndarray, mode: NearestMode, n_in: int) -> np.ndarray:
    """Rounded source indices, clamped to [0, n_in - 1]."""
    c = coords.astype(np.float64)
    if mode is NearestMode.FLOOR:
        idx = np.floor(c)
    elif mode is NearestMode.CEIL:
        idx = np.ceil(c)
    elif mode is NearestMode.ROUND_PREFER_CEIL:
        idx = np.floor(c + 0.5)
    else:
        idx = np.ceil(c - 0.5)
    return np.clip(idx, 0, n_in - 1).astype(np.int64)


def _linear_weights(coords: np.ndarray, n_in: int) -> np.ndarray:
    c = np.clip(coords.astype(np.float64), 0.0, n_in - 1)
    lo = np.minimum(np.floor(c).astype(np.int64), n_in - 1)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = c - lo
    m = np.zeros((len(c), n_in))
    rows = np.arange(len(c))
    np.add.at(m, (rows, lo), 1.0 - frac)
    np.add.at(m, (rows, hi), frac)
    return m


def _cubic_kernel(t: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel at distances t (>= 0)."""
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _cubic_weights(coords: np.ndarray, n_in: int, a: float, exclude_outside: bool
                   ) -> np.ndarray:
    c = coords.astype(np.float64)
    base = np.floor(c).astype(np.int64)
    m = np.zeros((len(c), n_in))
    rows = np.arange(len(c))
    taps = [(base + k, _cubic_kernel(c - (base + k), a)) for k in (-1, 0, 1, 2)]
    if exclude_outside:
        inside = [(idx >= 0) & (idx < n_in) for idx, _ in taps]
        total = sum(np.where(ok, w, 0.0) for ok, (_, w) in zip(inside, taps))
        taps = [(idx, np.where(ok, w, 0.0) / total) for ok, (idx, w) in zip(inside, taps)]
    for idx, w in taps:
        np.add.at(m, (rows, np.clip(idx, 0, n_in - 1)), w)
    return m


@dataclass(frozen=True)
class Resize(Op):
    """Resample H and W of x [N, C, H, W] to `size` (oh, ow); see the module docstring. H and
    W of the input may be symbolic (the coordinates are computed from the actual sizes)."""

    kind = "resize"
    arity = 1
    size: tuple[Dim, Dim]
    mode: ResizeMode = ResizeMode.NEAREST
    coordinate: CoordinateMode = CoordinateMode.HALF_PIXEL
    nearest: NearestMode = NearestMode.ROUND_PREFER_FLOOR
    scale: tuple[float, float] | None = None
    cubic_a: float = -0.75
    exclude_outside: bool = False

    def __post_init__(self):
        object.__setattr__(self, "size", tuple(canonical_dim(d) for d in self.size))

    @property
    def needs_symbols(self) -> bool:
        """The reference evaluates a symbolic output size under the binding."""
        return any(isinstance(d, str) for d in self.size)

    def infer(self, ins):
        (x,) = ins
        require(x.rank == 4, f"{self.kind} input must be [N, C, H, W], got rank {x.rank} ({x})")
        require(len(self.size) == 2 and all(isinstance(d, str) or d >= 1 for d in self.size),
                f"{self.kind} size must be two dims >= 1, got {self.size}")
        require(self.scale is None or (len(self.scale) == 2 and all(s > 0 for s in self.scale)),
                f"{self.kind} scale must be two positive numbers, got {self.scale}")
        if self.mode is not ResizeMode.NEAREST:
            require(x.dtype.is_float, f"{self.mode.value} {self.kind} needs a float input, got "
                    f"{x.dtype}")
        return Shape(x.dims[:2] + tuple(self.size), x.dtype)

    def coordinates(self, axis: int, n_in: int, n_out: int | None = None) -> np.ndarray:
        """Source coordinates along spatial `axis` (0: H, 1: W) for an input of length n_in
        and an output of length n_out (the op's size when static)."""
        scale = None if self.scale is None else self.scale[axis]
        return source_coordinates(self.coordinate, n_in, self._out(axis, n_out), scale)

    def indices(self, axis: int, n_in: int, n_out: int | None = None) -> np.ndarray:
        """Nearest mode: the source index of every output index along `axis`."""
        return nearest_indices(self.coordinates(axis, n_in, n_out), self.nearest, n_in)

    def weights(self, axis: int, n_in: int, n_out: int | None = None) -> np.ndarray:
        """Linear / cubic: the [out, in] float64 interpolation matrix along `axis`."""
        c = self.coordinates(axis, n_in, n_out)
        if self.mode is ResizeMode.LINEAR:
            return _linear_weights(c, n_in)
        return _cubic_weights(c, n_in, self.cubic_a, self.exclude_outside)

    def _out(self, axis: int, n_out: int | None) -> int:
        if n_out is not None:
            return n_out
        if not isinstance(self.size[axis], int):
            raise ValueError(f"{self.kind} to symbolic size {self.size}: pass the output length")
        return self.size[axis]

    def reference(self, x, symbols=None):
        h, w = x.shape[2:]
        oh, ow = (eval_dim(d, symbols or {}) for d in self.size)
        if self.mode is ResizeMode.NEAREST:
            return np.ascontiguousarray(x[:, :, self.indices(0, h, oh)][:, :, :,
                                                                       self.indices(1, w, ow)])
        ct = np.float64 if x.dtype == np.float64 else np.float32
        mh = self.weights(0, h, oh).astype(ct)
        mw = self.weights(1, w, ow).astype(ct)
        y = np.matmul(np.matmul(mh, x.astype(ct, copy=False)), mw.T)
        return y.astype(x.dtype, copy=False)
