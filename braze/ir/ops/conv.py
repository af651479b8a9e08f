"""Convolution family, NCHW: conv2d, conv_transpose2d, max/avg pooling, global average pooling
and 2x nearest-neighbour upsampling. Plain (non-composite) ops with vectorized NumPy references.

Padding is always a 4-tuple (top, left, bottom, right). Batch N may be symbolic, and so may H
and W where the output size stays a polynomial: stride 1, or a dim declared a multiple of the
stride ("32*h": a stride-2 3x3 window padded 1 gives "16*h")."""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ...errors import ShapeError
from ..op import Op, require, same_dtype
from ..shapes import Dim, Shape
from ..symbolic import SymDim, to_dim

__all__ = ["Conv2d", "ConvTranspose2d", "PoolKind", "Pool2d", "GlobalAvgPool", "ResizeNearest2x"]


# -- shared helpers -----------------------------------------------------------------------------
def _check_attrs(op: Op, **pairs: tuple[int, ...]) -> None:
    for name, vals in pairs.items():
        floor = 0 if name in ("padding", "output_padding") else 1
        require(all(isinstance(v, int) and v >= floor for v in vals),
                f"{op.kind} {name} must be ints >= {floor}, got {vals}")


def _conv_out(op: Op, axis: str, size: Dim, k: int, s: int, lo: int, hi: int, d: int) -> Dim:
    """Output length of a strided, padded, dilated window along one spatial axis."""
    span = d * (k - 1) + 1
    if isinstance(size, str):
        if s == 1 and lo + hi == span - 1:
            return size
        split = (SymDim.of(size) + (lo + hi - span)).divmod_int(s)
        if split is None:
            raise ShapeError(f"{op.kind} with stride {s} needs {axis} static or declared a "
                             f"multiple of the stride (got {size!r}; e.g. '{s}*{axis.lower()}' "
                             "or '32*h' for a 5-stage CNN), or pad 'same' at stride 1")
        out = split[0] + 1
        low = out.lower_bound()
        require(low is None or low >= 1, f"{op.kind} window ({span} along {axis}) is larger "
                f"than the padded input ({size}+{lo + hi}) for the smallest {size} (symbols "
                f"may be as small as 2): make {axis} static, or pad the window")
        return out.to_dim()
    padded = size + lo + hi
    require(padded >= span, f"{op.kind} window ({span} along {axis}) is larger than the padded "
            f"input ({padded})")
    return (padded - span) // s + 1


def _windows(xp: np.ndarray, kh: int, kw: int, stride, dilation) -> np.ndarray:
    """View [N, C, Ho, Wo, kh, kw] of every window of the (already padded) input."""
    (sh, sw), (dh, dw) = stride, dilation
    v = sliding_window_view(xp, (dh * (kh - 1) + 1, dw * (kw - 1) + 1), axis=(2, 3))
    return v[:, :, ::sh, ::sw, ::dh, ::dw]


def _compute_dtype(dt: np.dtype) -> np.dtype:
    """f16 / bf16 accumulate in f32; f32 and f64 in themselves."""
    return np.dtype(np.float32) if dt.itemsize < 4 else dt


def _pad(x: np.ndarray, padding, value=0) -> np.ndarray:
    t, left, b, r = padding
    if not any(padding):
        return x
    return np.pad(x, ((0, 0), (0, 0), (t, b), (left, r)), constant_values=value)


def _image(op: Op, s: Shape, what: str = "input") -> None:
    require(s.rank == 4, f"{op.kind} {what} must be [N, C, H, W], got rank {s.rank} ({s})")


class _OptionalBias:
    """Arity of the conv kinds: (x, w) plus b when `has_bias`."""

    @property
    def n_inputs(self) -> int:
        return 3 if self.has_bias else 2

    def check_arity(self, n: int) -> None:
        require(n == self.n_inputs, f"{self.kind} with has_bias={self.has_bias} takes "
                f"{self.n_inputs} inputs, got {n}")


# -- convolution --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Conv2d(_OptionalBias, Op):
    """2-D cross-correlation: x [N, C, H, W], w [O, C/groups, kh, kw], optional b [O]."""

    kind = "conv2d"
    arity = None
    min_arity = 2
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    has_bias: bool = False

    def infer(self, ins):
        x, w = ins[0], ins[1]
        same_dtype(self, ins)
        require(x.dtype.is_float, f"{self.kind} needs float inputs, got {x.dtype}")
        _image(self, x)
        _image(self, w, "weight")
        _check_attrs(self, stride=self.stride, padding=self.padding, dilation=self.dilation,
                     groups=(self.groups,))
        o, cg, kh, kw = w.dims
        require(all(isinstance(d, int) for d in (o, cg, kh, kw)),
                f"{self.kind} weight must be static, got {w}")
        require(o % self.groups == 0, f"{self.kind} out channels {o} not divisible by groups "
                f"{self.groups}")
        c = x.dims[1]
        require(c == cg * self.groups, f"{self.kind} input has {c} channels but weight expects "
                f"{cg} x groups {self.groups} = {cg * self.groups}")
        if self.has_bias:
            require(ins[2].dims == (o,), f"{self.kind} bias must be [{o}], got {ins[2]}")
        t, left, b, r = self.padding
        ho = _conv_out(self, "H", x.dims[2], kh, self.stride[0], t, b, self.dilation[0])
        wo = _conv_out(self, "W", x.dims[3], kw, self.stride[1], left, r, self.dilation[1])
        return Shape((x.dims[0], o, ho, wo), x.dtype)

    def reference(self, x, w, b=None):
        ct = _compute_dtype(x.dtype)
        o, cg, kh, kw = w.shape
        g, og = self.groups, o // self.groups
        v = _windows(_pad(x.astype(ct, copy=False), self.padding), kh, kw, self.stride,
                     self.dilation)
        n, _, ho, wo = v.shape[:4]
        v = v.reshape(n, g, cg, ho, wo, kh, kw)
        wg = w.astype(ct, copy=False).reshape(g, og, cg, kh, kw)
        out = np.empty((n, o, ho, wo), ct)
        for gi in range(g):
            r = np.tensordot(v[:, gi], wg[gi], axes=([1, 4, 5], [1, 2, 3]))  # [N, Ho, Wo, Og]
            out[:, gi * og:(gi + 1) * og] = r.transpose(0, 3, 1, 2)
        if b is not None:
            out += b.astype(ct, copy=False).reshape(1, o, 1, 1)
        return out.astype(x.dtype, copy=False)


@dataclass(frozen=True)
class ConvTranspose2d(_OptionalBias, Op):
    """Transposed 2-D convolution (the gradient of conv2d w.r.t. its input): x [N, C, H, W],
    w [C, O/groups, kh, kw], optional b [O]. Output H = (H-1)*s - top - bottom + d*(kh-1)
    + output_padding + 1 (likewise W); `padding` crops, `output_padding` extends bottom/right."""

    kind = "conv_transpose2d"
    arity = None
    min_arity = 2
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    output_padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    has_bias: bool = False

    def _out_len(self, axis: str, size: Dim, k: int, i: int) -> Dim:
        s, d, op = self.stride[i], self.dilation[i], self.output_padding[i]
        require(op < max(s, d), f"{self.kind} output_padding {op} along {axis} must be smaller "
                f"than stride or dilation ({s}, {d})")
        lo, hi = self.padding[i], self.padding[i + 2]
        out = (SymDim.of(size) - 1) * s - lo - hi + d * (k - 1) + op + 1
        low = out.lower_bound()
        require(low is None or low > 0, f"{self.kind} padding {self.padding} leaves no output "
                f"along {axis}")
        return out.to_dim()

    def infer(self, ins):
        x, w = ins[0], ins[1]
        same_dtype(self, ins)
        require(x.dtype.is_float, f"{self.kind} needs float inputs, got {x.dtype}")
        _image(self, x)
        _image(self, w, "weight")
        _check_attrs(self, stride=self.stride, padding=self.padding, dilation=self.dilation,
                     groups=(self.groups,), output_padding=self.output_padding)
        c, og, kh, kw = w.dims
        require(all(isinstance(d, int) for d in (c, og, kh, kw)),
                f"{self.kind} weight must be static, got {w}")
        require(x.dims[1] == c, f"{self.kind} input has {x.dims[1]} channels but weight "
                f"expects {c}")
        require(c % self.groups == 0, f"{self.kind} in channels {c} not divisible by groups "
                f"{self.groups}")
        o = og * self.groups
        if self.has_bias:
            require(ins[2].dims == (o,), f"{self.kind} bias must be [{o}], got {ins[2]}")
        ho = self._out_len("H", x.dims[2], kh, 0)
        wo = self._out_len("W", x.dims[3], kw, 1)
        return Shape((x.dims[0], o, ho, wo), x.dtype)

    def reference(self, x, w, b=None):
        ct = _compute_dtype(x.dtype)
        n, c, h, wd = x.shape
        _, og, kh, kw = w.shape
        g, cg = self.groups, c // self.groups
        (sh, sw), (dh, dw) = self.stride, self.dilation
        (oph, opw), (t, left) = self.output_padding, self.padding[:2]
        ho = (h - 1) * sh - t - self.padding[2] + dh * (kh - 1) + oph + 1
        wo = (wd - 1) * sw - left - self.padding[3] + dw * (kw - 1) + opw + 1
        full = np.zeros((n, g, og, max(t + ho, (h - 1) * sh + dh * (kh - 1) + 1),
                         max(left + wo, (wd - 1) * sw + dw * (kw - 1) + 1)), ct)
        xg = x.astype(ct, copy=False).reshape(n, g, cg, h, wd)
        wg = w.astype(ct, copy=False).reshape(g, cg, og, kh, kw)
        for gi in range(g):
            # [N, cg, H, W] x [cg, og, kh, kw] -> [N, H, W, og, kh, kw]
            r = np.tensordot(xg[:, gi], wg[gi], axes=([1], [0]))
            for i in range(kh):
                for j in range(kw):
                    full[:, gi, :, i * dh:i * dh + (h - 1) * sh + 1:sh,
                         j * dw:j * dw + (wd - 1) * sw + 1:sw] += r[..., i, j].transpose(0, 3, 1, 2)
        out = full.reshape(n, g * og, *full.shape[3:])[:, :, t:t + ho, left:left + wo]
        if b is not None:
            out = out + b.astype(ct, copy=False).reshape(1, -1, 1, 1)
        return np.ascontiguousarray(out).astype(x.dtype, copy=False)


# -- pooling and resizing -----------------------------------------------------------------------
class PoolKind(enum.Enum):
    MAX = "max"
    AVG = "avg"


@dataclass(frozen=True)
class Pool2d(Op):
    """Max or average pooling over [N, C, H, W] windows. Max pads with -inf; average divides by
    the count of real elements unless `count_include_pad`. Each pad must be below the kernel."""

    kind = "pool2d"
    arity = 1
    pool: PoolKind = PoolKind.MAX
    kernel: tuple[int, int] = (2, 2)
    stride: tuple[int, int] = (2, 2)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    count_include_pad: bool = False

    @property
    def label(self) -> str:
        return f"{self.pool.value}_pool2d"

    @classmethod
    def labels(cls) -> tuple[str, ...]:
        return tuple(f"{p.value}_pool2d" for p in PoolKind)

    def infer(self, ins):
        (x,) = ins
        _image(self, x)
        _check_attrs(self, kernel=self.kernel, stride=self.stride, padding=self.padding)
        kh, kw = self.kernel
        t, left, b, r = self.padding
        require(max(t, b) < kh and max(left, r) < kw,
                f"{self.label} padding {self.padding} must be smaller than kernel {self.kernel}")
        if self.pool is PoolKind.AVG:
            require(x.dtype.is_float, f"avg_pool2d needs a float input, got {x.dtype}")
        else:
            require(x.dtype.is_float or x.dtype.is_int,
                    f"max_pool2d needs a numeric input, got {x.dtype}")
        ho = _conv_out(self, "H", x.dims[2], kh, self.stride[0], t, b, 1)
        wo = _conv_out(self, "W", x.dims[3], kw, self.stride[1], left, r, 1)
        return Shape((x.dims[0], x.dims[1], ho, wo), x.dtype)

    def reference(self, x):
        kh, kw = self.kernel
        if self.pool is PoolKind.MAX:
            low = -np.inf if x.dtype.kind == "f" or x.dtype.name == "bfloat16" else \
                np.iinfo(x.dtype).min
            v = _windows(_pad(x, self.padding, low), kh, kw, self.stride, (1, 1))
            return v.max(axis=(4, 5))
        ct = _compute_dtype(x.dtype)
        v = _windows(_pad(x.astype(ct, copy=False), self.padding), kh, kw, self.stride, (1, 1))
        total = v.sum(axis=(4, 5))
        if self.count_include_pad:
            count = np.asarray(kh * kw, ct)
        else:
            ones = _pad(np.ones((1, 1) + x.shape[2:], ct), self.padding)
            count = _windows(ones, kh, kw, self.stride, (1, 1)).sum(axis=(4, 5))
        return (total / count).astype(x.dtype, copy=False)


@dataclass(frozen=True)
class GlobalAvgPool(Op):
    """Mean over H and W: [N, C, H, W] -> [N, C, 1, 1]."""

    kind = "global_avg_pool"
    arity = 1

    def infer(self, ins):
        (x,) = ins
        _image(self, x)
        require(x.dtype.is_float, f"{self.kind} needs a float input, got {x.dtype}")
        return Shape((x.dims[0], x.dims[1], 1, 1), x.dtype)

    def reference(self, x):
        ct = _compute_dtype(x.dtype)
        return x.astype(ct, copy=False).mean(axis=(2, 3), keepdims=True).astype(x.dtype)


@dataclass(frozen=True)
class ResizeNearest2x(Op):
    """Nearest-neighbour 2x upsampling: [N, C, H, W] -> [N, C, 2H, 2W]."""

    kind = "resize_nearest_2x"
    arity = 1

    def infer(self, ins):
        (x,) = ins
        _image(self, x)
        h, w = x.dims[2:]
        return Shape((x.dims[0], x.dims[1], to_dim(2 * SymDim.of(h)), to_dim(2 * SymDim.of(w))),
                     x.dtype)

    def reference(self, x):
        return np.repeat(np.repeat(x, 2, axis=2), 2, axis=3)
