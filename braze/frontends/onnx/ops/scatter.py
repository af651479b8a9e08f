"""ONNX scatters: ScatterElements and ScatterND, every reduction (none, add, mul, max, min).

Both become braze.frontends.scatter's one-hot compare and reduction (braze has no scatter op).
ScatterND flattens the indexed leading dims of the data into one axis; an index tuple names a
position of it when each of its entries matches that position's coordinate. A ScatterND whose
inputs are all stored (weights, constants) becomes a constant instead; one of compile-time
values folds earlier (known.py)."""
from __future__ import annotations

from ....ir.ops.io import Constant, Param
from ....ir.symbolic import SymDim
from ...scatter import one_hot_positions, scatter_along, scatter_hot
from ..context import ImportContext, NodeView, converter
from ..known import scatter_nd

_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _reduction(ctx: ImportContext, node: NodeView) -> str:
    r = node.attr("reduction", "none")
    if r not in _REDUCTIONS:
        raise ctx.fail(node, f"{node.op_type} reduction={r!r} is not defined (one of "
                             f"{', '.join(_REDUCTIONS)})")
    return r


@converter("ScatterElements")
def scatter_elements(ctx, node):
    """`out[..., indices[p], ...] = updates[p]` along `axis` (ONNX's default 0)."""
    data, idx, upd = (ctx.value(node, i) for i in range(3))
    dims, idims, udims = ctx.dims(data), ctx.dims(idx), ctx.dims(upd)
    rank = len(dims)
    axis = node.attr("axis", 0)
    if not -rank <= axis < max(rank, 1) or rank == 0:
        raise ctx.fail(node, f"axis {axis} is out of range for data of rank {rank}")
    axis %= rank
    if tuple(idims) != tuple(udims) or len(idims) != rank:
        raise ctx.fail(node, f"indices {tuple(idims)} and updates {tuple(udims)} must have one "
                             f"shape of the data's rank {rank}")
    for i, (u, d) in enumerate(zip(udims, dims)):
        if i != axis and isinstance(u, int) and isinstance(d, int) and u > d:
            raise ctx.fail(node, f"updates dim {i} ({u}) exceeds the data's ({d})")
    if not ctx.dtype(idx).is_int:
        raise ctx.fail(node, f"indices must be integers, got {ctx.dtype(idx)}")
    return [scatter_along(ctx.g, data, idx, upd, axis, _reduction(ctx, node))]


@converter("ScatterND")
def scatter_nd_(ctx, node):
    """Index tuples in the last axis of `indices` name slices of `data` that `updates`
    replaces (or combines with, by the reduction)."""
    reduction = _reduction(ctx, node)
    stored = [_stored_input(ctx, node, i) for i in range(3)]
    data = ctx.value(node, 0)
    if all(a is not None for a in stored):
        out = scatter_nd(*stored, reduction)
        return [ctx.g.constant(out.astype(ctx.dtype(data).np), ctx.dtype(data))]
    g = ctx.g
    idx, upd = ctx.value(node, 1), ctx.value(node, 2)
    dims, idims, udims = ctx.dims(data), ctx.dims(idx), ctx.dims(upd)
    if not ctx.dtype(idx).is_int or not idims:
        raise ctx.fail(node, f"indices must be integers of rank >= 1, got {ctx.dtype(idx)} "
                             f"{tuple(idims)}")
    k = idims[-1]
    if not isinstance(k, int) or not 1 <= k <= len(dims):
        raise ctx.fail(node, f"index tuples of length {k} do not fit data of rank {len(dims)}")
    lead, tail = tuple(idims[:-1]), tuple(dims[k:])
    if tuple(udims) != lead + tail:
        raise ctx.fail(node, f"updates {tuple(udims)} must have dims {lead + tail} (the "
                             "indices' leading dims, then the data's dims after the index tuple)")
    count, rows = _product(lead), _product(dims[:k])
    flat_idx = g.reshape(idx, (count, k))
    hot = None  # [count, dims[0], ..., dims[k-1]]: does index tuple j name this element?
    for i in range(k):
        part = g.reshape(g.narrow(flat_idx, 1, i, 1), (count,) + (1,) * (k - 1))
        match = one_hot_positions(g, part, dims[i], i, k)
        hot = match if hot is None else g.logical_and(hot, match)
    hot = g.reshape(hot, (count, rows) + (1,) * len(tail))
    flat = g.reshape(data, (rows,) + tail)
    out = scatter_hot(g, flat, hot, g.reshape(upd, (count,) + tail), 0, reduction)
    return [g.reshape(out, dims)]


def _product(dims) -> int | str:
    n = SymDim.of(1)
    for d in dims:
        n = n * SymDim.of(d)
    return n.to_dim()


def _stored_input(ctx, node, i: int):
    """Input `i`'s array when it is known at import time or stored (a weight or constant);
    None for a value computed at run time."""
    k = ctx.known(node, i)
    if k is not None and not k.symbolic:
        return k.array
    op = ctx.g.node(ctx.value(node, i)).op
    if isinstance(op, Param):
        return ctx.g.weights.get(op.name)
    return op.value if isinstance(op, Constant) else None
