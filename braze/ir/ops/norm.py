"""Normalization ops, all logical composites (a direct NumPy reference plus a decomposition into
reduce / sub / mul / add / rsqrt): layer_norm, rms_norm, group_norm and inference batch_norm.

Optional gamma / beta are inputs, present when `has_gamma` / `has_beta` say so, in that order."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..op import Op, require, same_dtype
from ..shapes import Shape, normalize_axis
from .reduce import ReduceFn, compute_dtype

__all__ = ["LayerNorm", "RmsNorm", "GroupNorm", "BatchNorm"]


def _affine_inputs(op, ins: tuple[Shape, ...], want: tuple, what: str) -> None:
    """Check input count and that gamma / beta have dims `want` and x's dtype."""
    n = 1 + op.has_gamma + op.has_beta
    require(len(ins) == n, f"{op.kind} with has_gamma={op.has_gamma}, has_beta={op.has_beta} "
            f"takes {n} inputs, got {len(ins)}")
    require(ins[0].dtype.is_float, f"{op.kind} needs a float input, got {ins[0].dtype}")
    same_dtype(op, ins)
    names = [name for name, present in (("gamma", op.has_gamma), ("beta", op.has_beta))
             if present]
    for s, name in zip(ins[1:], names):
        require(s.dims == want, f"{op.kind} {name} must have dims {want} ({what}), got {s}")


def _apply_affine(op, y: np.ndarray, rest, shape=None) -> np.ndarray:
    it = iter(rest)
    if op.has_gamma:
        gamma = next(it)
        y = y * (gamma if shape is None else gamma.reshape(shape))
    if op.has_beta:
        beta = next(it)
        y = y + (beta if shape is None else beta.reshape(shape))
    return y


def _decompose_affine(op, g, y, rest, shape=None):
    it = iter(rest)
    if op.has_gamma:
        gamma = next(it)
        y = g.mul(y, gamma if shape is None else g.reshape(gamma, shape))
    if op.has_beta:
        beta = next(it)
        y = g.add(y, beta if shape is None else g.reshape(beta, shape))
    return y


def _gamma_hint(op, position: int) -> str | None:
    return "one" if op.has_gamma and position == 1 else None


@dataclass(frozen=True)
class _TrailingNorm(Op):
    """Shared shape rule of LayerNorm and RmsNorm: normalize over axes `axis..rank-1`, with
    optional gamma / beta shaped like those trailing dims."""

    min_arity = 1
    composite = True
    eps: float = 1e-5
    axis: int = -1
    has_gamma: bool = False
    has_beta: bool = False

    def infer(self, ins):
        x = ins[0]
        ax = normalize_axis(self.axis, x.rank)
        _affine_inputs(self, ins, x.dims[ax:], f"x's dims from axis {ax}")
        return x

    def norm_axes(self, rank: int) -> tuple[int, ...]:
        """The normalized axes for an input of this rank."""
        return tuple(range(normalize_axis(self.axis, rank), rank))

    param_init_hint = _gamma_hint


@dataclass(frozen=True)
class LayerNorm(_TrailingNorm):
    """`(x - mean) / sqrt(var + eps) * gamma + beta` over axes `axis..rank-1` (biased variance).
    gamma / beta have the normalized trailing dims."""

    kind = "layer_norm"
    eps: float = 1e-5

    def reference(self, x, *rest):
        axes = self.norm_axes(x.ndim)
        y = x.astype(compute_dtype(x), copy=False)
        d = y - y.mean(axis=axes, keepdims=True)
        var = (d * d).mean(axis=axes, keepdims=True)
        y = d / np.sqrt(var + np.asarray(self.eps, dtype=y.dtype))
        return _apply_affine(self, y, rest).astype(x.dtype, copy=False)

    def decompose(self, g, ins):
        x, *rest = ins
        axes = self.norm_axes(g.shape_of(x).rank)
        d = g.sub(x, g.reduce(x, ReduceFn.MEAN, axes, keepdims=True))
        var = g.reduce(g.mul(d, d), ReduceFn.MEAN, axes, keepdims=True)
        y = g.mul(d, g.rsqrt(g.add(var, self.eps)))
        return _decompose_affine(self, g, y, rest)


@dataclass(frozen=True)
class RmsNorm(_TrailingNorm):
    """`x / sqrt(mean(x^2) + eps) * gamma (+ beta)` over axes `axis..rank-1`."""

    kind = "rms_norm"
    eps: float = 1e-6

    def reference(self, x, *rest):
        axes = self.norm_axes(x.ndim)
        y = x.astype(compute_dtype(x), copy=False)
        ms = (y * y).mean(axis=axes, keepdims=True)
        y = y / np.sqrt(ms + np.asarray(self.eps, dtype=y.dtype))
        return _apply_affine(self, y, rest).astype(x.dtype, copy=False)

    def decompose(self, g, ins):
        x, *rest = ins
        axes = self.norm_axes(g.shape_of(x).rank)
        ms = g.reduce(g.mul(x, x), ReduceFn.MEAN, axes, keepdims=True)
        y = g.mul(x, g.rsqrt(g.add(ms, self.eps)))
        return _decompose_affine(self, g, y, rest)


def _channel_shape(rank: int, c) -> tuple:
    """Dims that broadcast a [C] vector along axis 1 of a rank-`rank` tensor."""
    return (c,) + (1,) * (rank - 2)


@dataclass(frozen=True)
class GroupNorm(Op):
    """Normalize x `[N, C, *spatial]` over each group of `C / num_groups` channels and all
    spatial positions; gamma / beta are per channel `[C]`."""

    kind = "group_norm"
    min_arity = 1
    composite = True
    num_groups: int
    eps: float = 1e-5
    has_gamma: bool = False
    has_beta: bool = False

    def infer(self, ins):
        x = ins[0]
        require(x.rank >= 2, f"group_norm needs x of rank >= 2 ([N, C, ...]), got {x}")
        c = x.dims[1]
        require(isinstance(c, int), f"group_norm needs a static channel dim, got {c!r}")
        require(self.num_groups >= 1 and c % self.num_groups == 0,
                f"group_norm: {c} channels do not split into {self.num_groups} groups")
        _affine_inputs(self, ins, (c,), "one per channel")
        return x

    def reference(self, x, *rest):
        n, c = x.shape[:2]
        per_group = int(np.prod(x.shape[1:])) // self.num_groups  # not -1: a batch may be 0
        y = x.astype(compute_dtype(x), copy=False).reshape(n, self.num_groups, per_group)
        d = y - y.mean(axis=-1, keepdims=True)
        var = (d * d).mean(axis=-1, keepdims=True)
        y = (d / np.sqrt(var + np.asarray(self.eps, dtype=y.dtype))).reshape(x.shape)
        y = _apply_affine(self, y, rest, _channel_shape(x.ndim, c))
        return y.astype(x.dtype, copy=False)

    def decompose(self, g, ins):
        x, *rest = ins
        dims = g.shape_of(x).dims
        c = dims[1]
        grouped = g.reshape(x, (dims[0], self.num_groups, c // self.num_groups) + dims[2:])
        axes = tuple(range(2, len(dims) + 1))
        d = g.sub(grouped, g.reduce(grouped, ReduceFn.MEAN, axes, keepdims=True))
        var = g.reduce(g.mul(d, d), ReduceFn.MEAN, axes, keepdims=True)
        y = g.reshape(g.mul(d, g.rsqrt(g.add(var, self.eps))), dims)
        shape = None if len(dims) == 2 else _channel_shape(len(dims), c)
        return _decompose_affine(self, g, y, rest, shape)

    param_init_hint = _gamma_hint


@dataclass(frozen=True)
class BatchNorm(Op):
    """Inference batch norm over channel axis 1: `(x - mean) / sqrt(var + eps) * gamma + beta`
    with inputs (x, gamma, beta, mean, var), the last four `[C]`."""

    kind = "batch_norm"
    arity = 5
    composite = True
    eps: float = 1e-5

    def infer(self, ins):
        x = ins[0]
        require(x.rank >= 2, f"batch_norm needs x of rank >= 2 ([N, C, ...]), got {x}")
        require(x.dtype.is_float, f"batch_norm needs a float input, got {x.dtype}")
        same_dtype(self, ins)
        for s, name in zip(ins[1:], ("gamma", "beta", "mean", "var")):
            require(s.dims == (x.dims[1],),
                    f"batch_norm {name} must have dims ({x.dims[1]},) (one per channel), got {s}")
        return x

    def reference(self, x, gamma, beta, mean, var):
        acc = compute_dtype(x)
        shape = _channel_shape(x.ndim, x.shape[1])
        col = lambda v: v.astype(acc, copy=False).reshape(shape)
        y = (x.astype(acc, copy=False) - col(mean)) / np.sqrt(col(var) + acc.type(self.eps))
        return (y * col(gamma) + col(beta)).astype(x.dtype, copy=False)

    def decompose(self, g, ins):
        x, gamma, beta, mean, var = ins
        dims = g.shape_of(x).dims
        shape = _channel_shape(len(dims), dims[1])
        col = (lambda v: v) if len(dims) == 2 else (lambda v: g.reshape(v, shape))
        scale = g.mul(g.rsqrt(g.add(col(var), self.eps)), col(gamma))
        return g.add(g.mul(g.sub(x, col(mean)), scale), col(beta))

    def param_init_hint(self, position: int) -> str | None:
        return {1: "one", 4: "positive"}.get(position)
