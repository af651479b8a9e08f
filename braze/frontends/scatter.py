"""Scatter (ONNX ScatterElements / ScatterND, torch scatter / scatter_add / scatter_reduce)
written with braze's existing ops, shared by the importers.

braze has no scatter op. `scatter_along` compares every index with every position of the
scattered axis (a one-hot mask with one more axis than the updates), reduces over the updates'
axis, and merges the result into the data with `where`. It is exact for every reduction; with
reduction "none", positions written twice take the last update, as ONNX Runtime and torch's CPU
kernels do. The cost is numel(updates) * size(axis) elements of work and memory: fine for the
small scatters models use (index tables, one-hot targets, pooling by segment), slow for a scatter
of many updates into a long axis."""
from __future__ import annotations

import numpy as np

from ..errors import FrontendError
from ..ir.dtypes import DType, i64
from ..ir.graph import Graph
from ..ir.op import Value
from ..ir.symbolic import SymDim

__all__ = ["REDUCTIONS", "scatter_along", "scatter_hot", "one_hot_positions"]

REDUCTIONS = ("none", "add", "mul", "max", "min", "mean")


def scatter_along(g: Graph, data: Value, indices: Value, updates: Value, axis: int,
                  reduction: str = "none", *, include_self: bool = True,
                  wrap_negative: bool = True) -> Value:
    """`data` with `updates[p]` written at `p` with its `axis` coordinate replaced by
    `indices[p]` (negative indices count from the end), combined by `reduction` (one of
    REDUCTIONS; "mean" averages, flooring for integers as torch does). `indices` broadcasts
    to `updates`' dims, which may be smaller than `data`'s off the axis; only the region they
    cover is written. `include_self=False` (torch's scatter_reduce) leaves the data out of
    the reduction at the written positions; `wrap_negative=False` skips counting negative
    indices from the end (for sources, such as torch, where they are an error)."""
    rank = len(g.shape_of(data).dims)
    hot = one_hot_positions(g, indices, g.shape_of(data).dims[axis], axis, rank, wrap_negative)
    return scatter_hot(g, data, hot, updates, axis, reduction, include_self=include_self)


def scatter_hot(g: Graph, data: Value, hot: Value, updates: Value, axis: int,
                reduction: str = "none", *, include_self: bool = True) -> Value:
    """`scatter_along` from the one-hot mask `hot` (bool, `updates`' rank + 1, broadcasting to
    `updates` with the data's `axis` size inserted after `axis`): true where the update at a
    source position writes a target position."""
    if reduction not in REDUCTIONS:
        raise FrontendError(f"scatter reduction {reduction!r}; known: {', '.join(REDUCTIONS)}")
    dims, udims = g.shape_of(data).dims, g.shape_of(updates).dims
    dt = g.shape_of(data).dtype
    n = dims[axis]
    upd = g.unsqueeze(updates, axis + 1)
    touched = g.gt(g.reduce_max(g.cast(hot, i64), axis), 0)
    region = tuple(udims[:axis]) + (n,) + tuple(udims[axis + 1:])
    base = _crop(g, data, region)
    if reduction == "none":
        out = g.where(touched, _last_write(g, hot, updates, axis, region), base)
    elif reduction in ("add", "mean"):
        total = g.sum(g.where(hot, upd, 0), axis)
        out = g.add(base, total) if include_self else total
        if reduction == "mean":
            count = g.sum(g.cast(hot, dt), axis)
            out = g.div(out, g.add(count, 1) if include_self else g.maximum(count, 1))
        out = g.where(touched, out, base)
    elif reduction == "mul":
        prod = g.prod(g.where(hot, upd, 1), axis)
        out = g.where(touched, g.mul(base, prod) if include_self else prod, base)
    else:
        most = _extreme(dt, low=reduction == "max")
        best = g.reduce(g.where(hot, upd, most), reduction, axis)
        if include_self:
            best = (g.maximum if reduction == "max" else g.minimum)(base, best)
        out = g.where(touched, best, base)
    return _uncrop(g, out, data, region)


def one_hot_positions(g: Graph, indices: Value, n, axis: int, rank: int,
                      wrap_negative: bool = True) -> Value:
    """`[..., source position, target position, ...]` (the target axis inserted after `axis`
    of the rank-`rank` indices): whether each index names each of the `n` positions. On a
    symbolic axis a negative index is matched against `p - n` instead of being shifted by `n`:
    every node that reads the size then has the axis' symbolic shape, which a compiled graph
    re-evaluates for each binding even when the indices are stored."""
    it = g.shape_of(indices).dtype
    pos = g.reshape(g.arange(n, 0, 1, it), (1,) * (axis + 1) + (n,) + (1,) * (rank - axis - 1))
    idx = g.unsqueeze(indices, axis + 1)
    if not wrap_negative:
        return g.eq(idx, pos)
    if isinstance(n, int):
        idx = g.where(g.lt(idx, 0), g.add(idx, n), idx)
        return g.eq(idx, pos)
    below = g.sub(pos, g.sym_const((n,), (), it))
    return g.logical_or(g.eq(idx, pos), g.eq(idx, below))


def _last_write(g: Graph, hot: Value, updates: Value, axis: int, region: tuple) -> Value:
    """Per target position, the update of the highest source position that writes it (any
    update where none does; the caller masks those)."""
    m = g.shape_of(hot).dims[axis]
    rank = len(g.shape_of(hot).dims)
    order = g.reshape(g.arange(m, 1, 1, i64), (1,) * axis + (m,) + (1,) * (rank - axis - 1))
    last = g.argmax(g.where(hot, order, 0), axis, keepdims=False)
    if tuple(g.shape_of(last).dims) != region:
        last = g.expand(last, region)
    return g.gather_elements(updates, last, axis)


def _extreme(dt: DType, *, low: bool):
    """The identity of max (low) or min: -inf / +inf, or the integer type's bounds."""
    if dt.is_float:
        return -np.inf if low else np.inf
    info = np.iinfo(dt.np)
    return int(info.min if low else info.max)


def _crop(g: Graph, data: Value, region: tuple) -> Value:
    """The leading `region` of `data` (the part the updates cover)."""
    for ax, (d, r) in enumerate(zip(g.shape_of(data).dims, region)):
        if d != r:
            data = g.narrow(data, ax, 0, r)
    return data


def _uncrop(g: Graph, out: Value, data: Value, region: tuple) -> Value:
    """`out` (covering `region`) with the rest of `data` concatenated back around it."""
    dims = g.shape_of(data).dims
    for ax in reversed(range(len(dims))):
        if dims[ax] == region[ax]:
            continue
        rest = data
        for lead in range(ax):
            if dims[lead] != region[lead]:
                rest = g.narrow(rest, lead, 0, region[lead])
        extra = (SymDim.of(dims[ax]) - SymDim.of(region[ax])).to_dim()
        rest = g.narrow(rest, ax, region[ax], extra)
        out = g.concat([out, rest], ax)
    return out
