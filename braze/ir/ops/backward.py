"""Backward ops: closed-form gradients that beat differentiating a decomposition, for the
elementwise activations, the norms, rope, cumsum and gather. Each takes the output cotangent
`dy` first, then the forward op's inputs it needs, and returns one input's cotangent.

All are composites: a direct NumPy reference (float64-safe) plus a `decompose` into primitives,
which `LowerBackwardOps` and `prepare_graph_for_ad` (a second reverse pass) use. The attention,
conv and pool backward ops live in `backward_attention.py` and `backward_conv.py`."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..op import Op, require, same_dtype
from ..shapes import Shape, normalize_axis
from ._erf import erf
from .elementwise import UnaryFn
from .reduce import compute_dtype

__all__ = ["ReluBackward", "ActivationBackward", "ACTIVATION_BACKWARD_FNS",
           "LayerNormBackwardInput", "LayerNormBackwardGamma", "RmsNormBackwardInput",
           "RmsNormBackwardGamma", "RmsNormBackwardBeta", "GroupNormBackwardInput",
           "GroupNormBackwardGamma", "GroupNormBackwardBeta", "RopeBackward", "CumsumBackward",
           "GatherBackward"]

_GELU_C = math.sqrt(2.0 / math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_QUICK = 1.702


def _like(dy: Shape, x: Shape, op: Op) -> Shape:
    """dy has x's shape and both are float of one dtype."""
    require(dy.dims == x.dims, f"{op.kind}: dy {dy} must have x's shape {x}")
    require(x.dtype.is_float, f"{op.kind} needs float inputs, got {x.dtype}")
    same_dtype(op, (dy, x))
    return x


def _in_compute(*xs: np.ndarray) -> tuple[np.ndarray, ...]:
    ct = compute_dtype(xs[0])
    return tuple(a.astype(ct, copy=False) for a in xs)


# -- activations ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReluBackward(Op):
    """`dy * (x > 0)`: the cotangent of relu(x)."""

    kind = "relu_backward"
    arity = 2
    composite = True

    def infer(self, ins):
        return _like(ins[0], ins[1], self)

    def reference(self, dy, x):
        return np.where(x > 0, dy, np.zeros((), dy.dtype)).astype(dy.dtype, copy=False)

    def decompose(self, g, ins):
        dy, x = ins
        return g.where(g.gt(x, 0.0), dy, 0.0)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _np_derivative(fn: UnaryFn, x: np.ndarray) -> np.ndarray:
    t = x.dtype.type
    if fn is UnaryFn.GELU:
        return 0.5 * (1.0 + erf(x / t(math.sqrt(2.0)))) + x * np.exp(-0.5 * x * x) * t(
            _INV_SQRT_2PI)
    if fn is UnaryFn.GELU_APPROX:
        th = np.tanh(t(_GELU_C) * (x + t(0.044715) * x ** 3))
        return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * t(_GELU_C) * (
            1.0 + t(3 * 0.044715) * x * x)
    if fn is UnaryFn.SILU:
        s = _sigmoid(x)
        return s * (1.0 + x * (1.0 - s))
    if fn is UnaryFn.SIGMOID:
        s = _sigmoid(x)
        return s * (1.0 - s)
    if fn is UnaryFn.TANH:
        th = np.tanh(x)
        return 1.0 - th * th
    s = _sigmoid(t(_QUICK) * x)  # QUICK_GELU
    return s + t(_QUICK) * x * s * (1.0 - s)


def _graph_derivative(g, fn: UnaryFn, x):
    if fn is UnaryFn.GELU:
        cdf = g.mul(g.add(g.erf(g.mul(x, 1.0 / math.sqrt(2.0))), 1.0), 0.5)
        pdf = g.mul(g.exp(g.mul(g.mul(x, x), -0.5)), _INV_SQRT_2PI)
        return g.add(cdf, g.mul(x, pdf))
    if fn is UnaryFn.GELU_APPROX:
        x2 = g.mul(x, x)
        th = g.tanh(g.mul(g.mul(x, g.add(g.mul(x2, 0.044715), 1.0)), _GELU_C))
        left = g.mul(g.add(th, 1.0), 0.5)
        sech2 = g.sub(1.0, g.mul(th, th))
        inner = g.mul(g.add(g.mul(x2, 3 * 0.044715), 1.0), 0.5 * _GELU_C)
        return g.add(left, g.mul(g.mul(x, sech2), inner))
    if fn is UnaryFn.TANH:
        th = g.tanh(x)
        return g.sub(1.0, g.mul(th, th))
    scaled = g.mul(x, _QUICK) if fn is UnaryFn.QUICK_GELU else x
    s = g.sigmoid(scaled)
    ds = g.mul(s, g.sub(1.0, s))
    if fn is UnaryFn.SIGMOID:
        return ds
    return g.add(s, g.mul(scaled, ds))  # silu: s + x s (1-s); quick_gelu: same at 1.702 x


ACTIVATION_BACKWARD_FNS = frozenset({UnaryFn.GELU, UnaryFn.GELU_APPROX, UnaryFn.SILU,
                                     UnaryFn.SIGMOID, UnaryFn.TANH, UnaryFn.QUICK_GELU})


@dataclass(frozen=True)
class ActivationBackward(Op):
    """`dy * fn'(x)` for fn in gelu, gelu_approx, silu, sigmoid, tanh, quick_gelu."""

    kind = "activation_backward"
    arity = 2
    composite = True
    fn: UnaryFn = UnaryFn.GELU

    def infer(self, ins):
        names = ", ".join(sorted(f.value for f in ACTIVATION_BACKWARD_FNS))
        require(self.fn in ACTIVATION_BACKWARD_FNS,
                f"activation_backward supports {names}; got {self.fn.value}")
        return _like(ins[0], ins[1], self)

    def reference(self, dy, x):
        dyc, xc = _in_compute(dy, x)
        return (dyc * _np_derivative(self.fn, xc)).astype(dy.dtype, copy=False)

    def decompose(self, g, ins):
        dy, x = ins
        return g.mul(dy, _graph_derivative(g, self.fn, x))


# -- layer norm and rms norm ---------------------------------------------------------------------
@dataclass(frozen=True)
class _TrailingNormBackward(Op):
    """Shared attributes and shape rule of the layer / rms norm backward ops: the forward op's
    eps and first normalized axis; inputs (dy, x[, gamma])."""

    min_arity = 2
    composite = True
    centered: ClassVar[bool] = False  # layer norm subtracts the mean; rms norm does not
    eps: float = 1e-5
    axis: int = -1

    def axes(self, rank: int) -> tuple[int, ...]:
        return tuple(range(normalize_axis(self.axis, rank), rank))

    def check_inputs(self, ins, with_gamma: bool) -> Shape:
        n = 3 if with_gamma else 2
        require(len(ins) == n, f"{self.kind} takes {n} inputs, got {len(ins)}")
        x = _like(ins[0], ins[1], self)
        ax = normalize_axis(self.axis, x.rank)
        if with_gamma:
            same_dtype(self, ins)
            require(ins[2].dims == x.dims[ax:],
                    f"{self.kind} gamma must have dims {x.dims[ax:]}, got {ins[2]}")
        return x

    def np_xhat(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(x normalized, 1 / std) in NumPy, keepdims over the normalized axes."""
        axes = self.axes(x.ndim)
        centered = self.centered
        d = x - x.mean(axis=axes, keepdims=True) if centered else x
        r = 1.0 / np.sqrt((d * d).mean(axis=axes, keepdims=True) + x.dtype.type(self.eps))
        return d * r, r

    def graph_xhat(self, g, x):
        axes = self.axes(g.shape_of(x).rank)
        d = g.sub(x, g.mean(x, axes, keepdims=True)) if self.centered else x
        r = g.rsqrt(g.add(g.mean(g.mul(d, d), axes, keepdims=True), self.eps))
        return g.mul(d, r), r


def _np_norm_dx(op, dy, x, gamma, axes):
    xhat, r = op.np_xhat(x)
    gd = dy * gamma if gamma is not None else dy
    proj = xhat * (gd * xhat).mean(axis=axes, keepdims=True)
    if op.centered:
        gd = gd - gd.mean(axis=axes, keepdims=True)
    return r * (gd - proj)


def _graph_norm_dx(op, g, dy, x, gamma, axes):
    xhat, r = op.graph_xhat(g, x)
    gd = g.mul(dy, gamma) if gamma is not None else dy
    proj = g.mul(xhat, g.mean(g.mul(gd, xhat), axes, keepdims=True))
    if op.centered:
        gd = g.sub(gd, g.mean(gd, axes, keepdims=True))
    return g.mul(r, g.sub(gd, proj))


@dataclass(frozen=True)
class _NormInputGrad(_TrailingNormBackward):
    """infer / reference / decompose of d x for (dy, x[, gamma]) with `has_gamma`."""

    has_gamma: bool = False

    def infer(self, ins):
        return self.check_inputs(ins, self.has_gamma)

    def reference(self, dy, x, gamma=None):
        dyc, xc = _in_compute(dy, x)
        gc = None if gamma is None else gamma.astype(dyc.dtype, copy=False)
        return _np_norm_dx(self, dyc, xc, gc, self.axes(x.ndim)).astype(dy.dtype, copy=False)

    def decompose(self, g, ins):
        dy, x, *rest = ins
        axes = self.axes(g.shape_of(x).rank)
        return _graph_norm_dx(self, g, dy, x, rest[0] if rest else None, axes)


@dataclass(frozen=True)
class _NormGammaGrad(_TrailingNormBackward):
    """infer / reference / decompose of d gamma = sum over leading axes of dy * xhat."""

    def infer(self, ins):
        x = self.check_inputs(ins, False)
        return x.with_dims(x.dims[normalize_axis(self.axis, x.rank):])

    def reference(self, dy, x):
        dyc, xc = _in_compute(dy, x)
        lead = tuple(range(normalize_axis(self.axis, x.ndim)))
        return (dyc * self.np_xhat(xc)[0]).sum(axis=lead).astype(dy.dtype, copy=False)

    def decompose(self, g, ins):
        dy, x = ins
        lead = tuple(range(normalize_axis(self.axis, g.shape_of(x).rank)))
        prod = g.mul(dy, self.graph_xhat(g, x)[0])
        return g.sum(prod, lead) if lead else prod


@dataclass(frozen=True)
class LayerNormBackwardInput(_NormInputGrad):
    """d x of layer_norm: `r * (g - mean(g) - xhat * mean(g * xhat))`, g = dy * gamma, over
    axes `axis..rank-1`; inputs (dy, x[, gamma])."""

    kind = "layer_norm_backward_input"
    centered = True


@dataclass(frozen=True)
class LayerNormBackwardGamma(_NormGammaGrad):
    """d gamma of layer_norm: `sum(dy * xhat)` over the leading axes; inputs (dy, x). (d beta is
    a plain sum of dy over the same axes.)"""

    kind = "layer_norm_backward_gamma"
    centered = True


@dataclass(frozen=True)
class RmsNormBackwardInput(_NormInputGrad):
    """d x of rms_norm: `r * (g - xhat * mean(g * xhat))`, g = dy * gamma; inputs
    (dy, x[, gamma])."""

    kind = "rms_norm_backward_input"
    eps: float = 1e-6


@dataclass(frozen=True)
class RmsNormBackwardGamma(_NormGammaGrad):
    """d gamma of rms_norm: `sum(dy * x / rms(x))` over the leading axes; inputs (dy, x)."""

    kind = "rms_norm_backward_gamma"
    eps: float = 1e-6


@dataclass(frozen=True)
class RmsNormBackwardBeta(Op):
    """d beta of rms_norm (and layer_norm): `sum(dy)` over axes `0..axis-1`; input (dy,)."""

    kind = "rms_norm_backward_beta"
    arity = 1
    composite = True
    axis: int = -1

    def infer(self, ins):
        (dy,) = ins
        require(dy.dtype.is_float, f"{self.kind} needs a float input, got {dy.dtype}")
        return dy.with_dims(dy.dims[normalize_axis(self.axis, dy.rank):])

    def reference(self, dy):
        lead = tuple(range(normalize_axis(self.axis, dy.ndim)))
        return dy.astype(compute_dtype(dy)).sum(axis=lead).astype(dy.dtype, copy=False)

    def decompose(self, g, ins):
        (dy,) = ins
        lead = tuple(range(normalize_axis(self.axis, g.shape_of(dy).rank)))
        return g.sum(dy, lead) if lead else dy


# -- group norm ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _GroupNormBackward(Op):
    """Group norm backward over x [N, C, *spatial]: reshaped to [N, G, C/G, *spatial], each
    group normalized over axes 2.. like a layer norm."""

    min_arity = 1
    composite = True
    centered: ClassVar[bool] = True
    num_groups: int = 1
    eps: float = 1e-5

    def channels(self, x: Shape) -> int:
        require(x.rank >= 2, f"{self.kind} needs x of rank >= 2 ([N, C, ...]), got {x}")
        c = x.dims[1]
        require(isinstance(c, int) and self.num_groups >= 1 and c % self.num_groups == 0,
                f"{self.kind}: channels {c!r} do not split into {self.num_groups} groups")
        return c

    def grouped_dims(self, dims: tuple) -> tuple:
        return (dims[0], self.num_groups, dims[1] // self.num_groups) + tuple(dims[2:])

    def axes(self, rank: int) -> tuple[int, ...]:
        return tuple(range(2, rank))

    np_xhat = _TrailingNormBackward.np_xhat
    graph_xhat = _TrailingNormBackward.graph_xhat

    def channel_sum_axes(self, rank: int) -> tuple[int, ...]:
        return (0,) + tuple(range(2, rank))


@dataclass(frozen=True)
class GroupNormBackwardInput(_GroupNormBackward):
    """d x of group_norm; inputs (dy, x[, gamma [C]])."""

    kind = "group_norm_backward_input"
    has_gamma: bool = False

    def infer(self, ins):
        n = 3 if self.has_gamma else 2
        require(len(ins) == n, f"{self.kind} takes {n} inputs, got {len(ins)}")
        x = _like(ins[0], ins[1], self)
        c = self.channels(x)
        if self.has_gamma:
            same_dtype(self, ins)
            require(ins[2].dims == (c,), f"{self.kind} gamma must be [{c}], got {ins[2]}")
        return x

    def reference(self, dy, x, gamma=None):
        dyc, xc = _in_compute(dy, x)
        if gamma is not None:
            dyc = dyc * gamma.astype(dyc.dtype).reshape((-1,) + (1,) * (x.ndim - 2))
        shape = self.grouped_dims(x.shape)
        dx = _np_norm_dx(self, dyc.reshape(shape), xc.reshape(shape), None,
                         self.axes(len(shape)))
        return dx.reshape(x.shape).astype(dy.dtype, copy=False)

    def decompose(self, g, ins):
        dy, x, *rest = ins
        dims = g.shape_of(x).dims
        if rest:
            gamma = rest[0] if len(dims) == 2 else g.reshape(rest[0], (dims[1],) + (1,) * (
                len(dims) - 2))
            dy = g.mul(dy, gamma)
        shape = self.grouped_dims(dims)
        dx = _graph_norm_dx(self, g, g.reshape(dy, shape), g.reshape(x, shape), None,
                            self.axes(len(shape)))
        return g.reshape(dx, dims)


@dataclass(frozen=True)
class GroupNormBackwardGamma(_GroupNormBackward):
    """d gamma [C] of group_norm: `sum(dy * xhat)` over N and the spatial axes; inputs (dy, x)."""

    kind = "group_norm_backward_gamma"

    def infer(self, ins):
        require(len(ins) == 2, f"{self.kind} takes 2 inputs, got {len(ins)}")
        x = _like(ins[0], ins[1], self)
        return x.with_dims((self.channels(x),))

    def reference(self, dy, x):
        dyc, xc = _in_compute(dy, x)
        shape = self.grouped_dims(x.shape)
        xhat = self.np_xhat(xc.reshape(shape))[0].reshape(x.shape)
        return (dyc * xhat).sum(axis=self.channel_sum_axes(x.ndim)).astype(dy.dtype, copy=False)

    def decompose(self, g, ins):
        dy, x = ins
        dims = g.shape_of(x).dims
        xhat = g.reshape(self.graph_xhat(g, g.reshape(x, self.grouped_dims(dims)))[0], dims)
        return g.sum(g.mul(dy, xhat), self.channel_sum_axes(len(dims)))


@dataclass(frozen=True)
class GroupNormBackwardBeta(_GroupNormBackward):
    """d beta [C] of group_norm: `sum(dy)` over N and the spatial axes; input (dy,)."""

    kind = "group_norm_backward_beta"

    def infer(self, ins):
        require(len(ins) == 1, f"{self.kind} takes 1 input, got {len(ins)}")
        require(ins[0].dtype.is_float, f"{self.kind} needs a float input, got {ins[0].dtype}")
        return ins[0].with_dims((self.channels(ins[0]),))

    def reference(self, dy):
        out = dy.astype(compute_dtype(dy)).sum(axis=self.channel_sum_axes(dy.ndim))
        return out.astype(dy.dtype, copy=False)

    def decompose(self, g, ins):
        return g.sum(ins[0], self.channel_sum_axes(g.shape_of(ins[0]).rank))


# -- rope, cumsum, gather ------------------------------------------------------------------------
@dataclass(frozen=True)
class RopeBackward(Op):
    """d x of rope: the inverse rotation, i.e. rope of dy by (cos, -sin); inputs (dy, cos, sin)
    with the forward op's `interleaved` and `n_rot`."""

    kind = "rope_backward"
    arity = 3
    composite = True
    interleaved: bool = False
    n_rot: int | None = None

    def forward(self):
        from .attention import Rope

        return Rope(self.interleaved, self.n_rot)

    def infer(self, ins):
        return self.forward().infer(ins)

    def reference(self, dy, cos, sin):
        return self.forward().reference(dy, cos, -sin)

    def decompose(self, g, ins):
        dy, cos, sin = ins
        return self.forward().decompose(g, (dy, cos, g.neg(sin)))


@dataclass(frozen=True)
class CumsumBackward(Op):
    """d x of cumsum: the running sum of dy in the opposite direction (same `exclusive`)."""

    kind = "cumsum_backward"
    arity = 1
    composite = True
    axis: int = 0
    exclusive: bool = False
    reverse: bool = False

    def transposed(self):
        from .reduce import Cumsum

        return Cumsum(self.axis, self.exclusive, not self.reverse)

    def infer(self, ins):
        return self.transposed().infer(ins)

    def reference(self, dy):
        return self.transposed().reference(dy)

    def decompose(self, g, ins):
        return g.cumsum(ins[0], self.axis, self.exclusive, not self.reverse)


@dataclass(frozen=True)
class GatherBackward(Op):
    """d table of gather(table, indices, axis): dy scatter-added into a table whose `axis` has
    `size` entries (repeated indices accumulate; negative indices count from the end); inputs
    (dy, indices)."""

    kind = "gather_backward"
    arity = 2
    composite = True
    axis: int = 0
    size: int = 1

    def infer(self, ins):
        dy, idx = ins
        require(idx.dtype.is_int, f"{self.kind} indices must be integers, got {idx.dtype}")
        require(dy.dtype.is_float, f"{self.kind} needs a float dy, got {dy.dtype}")
        require(self.size >= 1, f"{self.kind} size must be >= 1, got {self.size}")
        ax, k = self.axis, idx.rank
        require(0 <= ax and ax + k <= dy.rank and dy.dims[ax:ax + k] == idx.dims,
                f"{self.kind}: dy {dy} must hold the indices' dims {idx.dims} at axis {ax}")
        return dy.with_dims(dy.dims[:ax] + (self.size,) + dy.dims[ax + k:])

    def reference(self, dy, idx):
        ax, k = self.axis, idx.ndim
        out = np.zeros(dy.shape[:ax] + (self.size,) + dy.shape[ax + k:], compute_dtype(dy))
        moved = np.moveaxis(out, ax, 0)
        src = np.moveaxis(dy.reshape(dy.shape[:ax] + (-1,) + dy.shape[ax + k:]), ax, 0)
        np.add.at(moved, idx.reshape(-1).astype(np.int64), src)
        return out.astype(dy.dtype, copy=False)

    def decompose(self, g, ins):
        dy, idx = ins
        ds, ax, n = g.shape_of(dy), self.axis, self.size
        k = g.shape_of(idx).rank
        lead, mid, tail = ds.dims[:ax], ds.dims[ax:ax + k], ds.dims[ax + k:]
        require(all(isinstance(d, int) for d in ds.dims),
                f"{self.kind} decomposes only with static dims, got {ds}")
        m = math.prod(mid)
        flat = g.reshape(idx, (m, 1))
        flat = g.where(g.lt(flat, 0), g.add(flat, n), flat)
        hot = g.cast(g.eq(flat, g.arange(n, dtype=g.shape_of(idx).dtype)), ds.dtype)  # [m, n]
        rows = g.reshape(dy, (math.prod(lead), m, math.prod(tail)))
        summed = g.matmul(g.transpose(hot, (1, 0)), rows)  # [lead, n, tail]
        return g.reshape(summed, lead + (n,) + tail)

