"""Small graph-building helpers the autodiff rules and engines share: zeros of a (possibly
symbolic) shape, scalar constants of a value's dtype, keepdims re-insertion, and the sum of
optional cotangents."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..ir.graph import Graph
from ..ir.op import Value
from ..ir.shapes import Dim, Shape
from ..ir.symbolic import SymDim

__all__ = ["zeros", "ones", "zeros_like", "scalar", "keep_reduced_axes", "add_optional", "is_float",
           "count_of"]


def is_float(shape: Shape) -> bool:
    """Whether values of this type carry gradients (float dtypes only)."""
    return shape.dtype.is_float


def scalar(b: Graph, value: float, like: Value) -> Value:
    """A 0-d constant `value` of `like`'s dtype."""
    dt = b.shape_of(like).dtype
    return b.constant(np.asarray(value, dtype=dt.np), dt)


def zeros(b: Graph, shape: Shape) -> Value:
    """Zeros of `shape` (dims may be symbolic: a scalar 0 expanded, bound at run time)."""
    z = b.constant(np.zeros((), dtype=shape.dtype.np), shape.dtype)
    return b.expand(z, shape.dims) if shape.dims else z


def ones(b: Graph, shape: Shape) -> Value:
    """Ones of the static `shape`."""
    return b.constant(np.ones(tuple(int(d) for d in shape.dims), dtype=shape.dtype.np),
                      shape.dtype)


def zeros_like(b: Graph, v: Value) -> Value:
    return zeros(b, b.shape_of(v))


def keep_reduced_axes(b: Graph, v: Value, axes: Sequence[int], rank: int) -> Value:
    """Reshape a reduction's result `v` (axes dropped) back to rank `rank` with 1 at `axes`."""
    dims: list[Dim] = list(b.shape_of(v).dims)
    for a in sorted(axes):
        dims.insert(a, 1)
    return b.reshape(v, tuple(dims))


def count_of(b: Graph, dims: Sequence[Dim], like: Value) -> Value:
    """The product of `dims` as a 0-d value of `like`'s dtype (a run-time value when symbolic)."""
    n = SymDim.of(1)
    for d in dims:
        n = n * SymDim.of(d)
    if n.is_const:
        return scalar(b, float(n.const), like)
    return b.sym_const((n.to_dim(),), shape=(), dtype=b.shape_of(like).dtype)


def add_optional(b: Graph, a: Value | None, c: Value | None) -> Value | None:
    """`a + c`, where None is zero."""
    if a is None:
        return c
    if c is None:
        return a
    return b.add(a, c)
