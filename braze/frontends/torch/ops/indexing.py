"""Indexing ATen ops: embedding, index_select, gather, diagonal, advanced indexing (`x[i, j]`
with integer index tensors, the way Hugging Face masks read attention_mask[batch_idx,
kv_idx]), a boolean `index_put` (x[mask] = v) and one with one integer index tensor (a scatter:
index_copy, a static KV cache's update), triu / tril.

Several integer index tensors become one gather on the flattened indexed dims (flat index
i * size_j + j, sizes possibly symbolic); negative indices wrap as in torch, with the wrap left
out when the indices provably are >= 0 (built from ranges)."""
from __future__ import annotations

import numpy as np

from ....ir.dtypes import bool_, i64
from ....ir.graph import Graph
from ....ir.ops.elementwise import Binary, BinaryFn, Cast, Where
from ....ir.ops.generate import Range, SymConst
from ....ir.ops.indexing import Slice
from ....ir.ops.io import Constant
from ....ir.ops.shape import Concat, Expand, Gather, Narrow, Reshape, Transpose
from ....ir.shapes import broadcast_shapes
from ....ir.symbolic import SymDim
from ...scatter import scatter_along
from ..context import Call, TorchContext, converter


def nonnegative(g, v, depth: int = 12) -> bool:
    """Whether integer value `v` is >= 0 for every input (ranges, sizes, their sums and
    products, rearranged)."""
    if depth <= 0:
        return False
    node = g.node(v)
    op = node.op
    if isinstance(op, Range):
        return op.start >= 0 and op.delta >= 0
    if isinstance(op, SymConst):
        return all(SymDim.of(x).lower_bound() is not None and SymDim.of(x).lower_bound() >= 0
                   for x in op.values)
    if isinstance(op, Constant):
        return bool((op.value >= 0).all()) if op.value.dtype.kind in "iub" else False
    if isinstance(op, (Reshape, Expand, Transpose, Narrow, Slice, Cast)):
        return nonnegative(g, node.inputs[0], depth - 1)
    if isinstance(op, Gather):
        return nonnegative(g, node.inputs[0], depth - 1)
    if isinstance(op, Concat):
        return all(nonnegative(g, x, depth - 1) for x in node.inputs)
    if isinstance(op, Binary) and op.fn in (BinaryFn.ADD, BinaryFn.MUL, BinaryFn.MAX,
                                            BinaryFn.DIV):
        return all(nonnegative(g, x, depth - 1) for x in node.inputs)
    if isinstance(op, Where):
        return all(nonnegative(g, x, depth - 1) for x in node.inputs[1:])
    return False


def wrapped(ctx: TorchContext, idx, size):
    """Index tensor `idx` with negative entries counted from the end of an axis of `size`."""
    if nonnegative(ctx.g, idx):
        return idx
    g, dt = ctx.g, ctx.dtype(idx)
    zero = ctx.value(0, dt)
    return g.where(g.lt(idx, zero), g.add(idx, ctx.value(SymDim.of(size), dt)), idx)


@converter("aten.embedding.default")
def embedding(ctx, c: Call):
    """A gather of rows; with a `padding_idx`, the rows read at that index are stop-gradient,
    so the padding row of the table gets no gradient (as in torch)."""
    g = ctx.g
    w, idx = ctx.value(c["weight"]), ctx.value(c["indices"])
    if c.get("scale_grad_by_freq", False):
        rows = _rows_with_gradient_by_frequency(ctx, w, idx)
    else:
        rows = g.gather(w, idx, 0)
    pad = ctx.static_int(c.get("padding_idx", -1), "padding_idx")
    if pad < 0:
        return rows
    at_pad = g.eq(g.unsqueeze(idx, -1), ctx.value(pad, ctx.dtype(idx)))
    return g.where(at_pad, g.stop_gradient(rows), rows)


def _rows_with_gradient_by_frequency(ctx: TorchContext, w, idx):
    """gather(w, idx, 0) whose weight gradient row r is divided by how often r occurs in idx
    (torch's scale_grad_by_freq): a custom_fn with that vjp."""
    ws, ids = ctx.g.shape_of(w), ctx.g.shape_of(idx)
    vocab = ws.dims[0]
    if not isinstance(vocab, int):
        raise ctx.fail(f"embedding with scale_grad_by_freq needs a static number of rows, "
                       f"got {vocab!r}")
    fwd = Graph("embedding")
    fwd.set_outputs([fwd.gather(fwd.input("w", ws), fwd.input("idx", ids), 0)])
    out = fwd.shape_of(fwd.outputs[0])
    vjp = Graph("embedding_scaled_by_frequency_vjp")
    vjp.input("w", ws)
    bi = vjp.input("idx", ids)
    vjp.input("y", out)
    ct = vjp.input("ct", out)
    ones = vjp.unsqueeze(vjp.cast(vjp.eq(bi, bi), ws.dtype), -1)  # [*idx, 1]
    count = vjp.gather_backward(ones, bi, 0, vocab)  # [rows, 1]
    dw = vjp.div(vjp.gather_backward(ct, bi, 0, vocab), vjp.maximum(count, 1.0))
    vjp.set_outputs([dw, vjp.sub(bi, bi)])  # the indices take a zero cotangent
    return ctx.g.custom_fn([w, idx], fwd, vjp_body=vjp)


@converter("aten.index_select.default")
def index_select(ctx, c):
    x = ctx.value(c["self"])
    axis = ctx.axis(ctx.static_int(c["dim"], "dim"), ctx.rank(x))
    idx = ctx.value(c["index"])
    if ctx.rank(idx) == 0:
        idx = ctx.g.reshape(idx, (1,))
    return ctx.g.gather(x, idx, axis)


@converter("aten.gather.default")
def gather(ctx, c):
    x, idx = ctx.value(c["self"]), ctx.value(c["index"])
    axis = ctx.axis(ctx.static_int(c["dim"], "dim"), ctx.rank(x))
    if ctx.rank(x) == 0:
        return x
    return ctx.g.gather_elements(x, idx, axis, negative_indices=False)  # torch raises on them


@converter("aten.index.Tensor", "aten._unsafe_index.Tensor")
def index(ctx, c):
    x = ctx.value(c["self"])
    picked = [(axis, ctx.value(i)) for axis, i in enumerate(c["indices"]) if i is not None]
    for _, i in picked:
        if ctx.dtype(i) in (bool_,) or not ctx.dtype(i).is_int:
            raise ctx.fail("indexing with a boolean mask gives a data-dependent shape; braze "
                           "needs shapes known from the input sizes (use torch.where instead)")
    if not picked:
        return x
    return advanced_index(ctx, x, picked)


def advanced_index(ctx, x, picked: list):
    """torch's advanced indexing of `x` by integer tensors at the given axes (the rest whole)."""
    g = ctx.g
    dims = ctx.dims(x)
    axes = [a for a, _ in picked]
    adjacent = axes == list(range(axes[0], axes[0] + len(axes)))
    if len(picked) == 1:
        a, i = picked[0]
        return g.gather(x, i, a)
    if not adjacent:  # torch puts the broadcast index dims first
        rest = [a for a in range(len(dims)) if a not in axes]
        x = g.transpose(x, tuple(axes + rest))
        dims = ctx.dims(x)
        axes = list(range(len(axes)))
    first, last = axes[0], axes[-1]
    try:
        bdims = broadcast_shapes(*(ctx.dims(i) for _, i in picked))
    except Exception as e:
        raise ctx.fail(f"index tensors do not broadcast: {e}") from None
    flat = None
    for (_, i), a in zip(picked, axes):
        i = wrapped(ctx, ctx.cast(i, i64), dims[a])
        stride = SymDim.of(1)
        for d in dims[a + 1:last + 1]:
            stride = stride * SymDim.of(d)
        term = i if stride == 1 else g.mul(i, ctx.value(stride, i64))
        flat = term if flat is None else g.add(flat, term)
    if ctx.dims(flat) != bdims:
        flat = g.expand(flat, bdims)
    merged = SymDim.of(1)
    for d in dims[first:last + 1]:
        merged = merged * SymDim.of(d)
    x = g.reshape(x, dims[:first] + (merged.to_dim(),) + dims[last + 1:])
    return g.gather(x, flat, first)


@converter("aten.index_put.default", "aten._unsafe_index_put.default")
def index_put(ctx, c):
    x = ctx.value(c["self"])
    idx = c["indices"]
    picked = [(a, i) for a, i in enumerate(idx) if i is not None]
    if len(picked) == 1 and ctx.dtype(ctx.value(picked[0][1])) != bool_:
        return _index_put_axis(ctx, x, *picked[0], c)
    if c.get("accumulate", False):
        raise ctx.fail("index_put with accumulate=True is supported for one integer index "
                       "tensor only")
    if len(idx) == 1 and idx[0] is not None and ctx.dtype(ctx.value(idx[0])) == bool_:
        mask = ctx.value(idx[0])
        vals = ctx.value(c["values"], ctx.dtype(x))
        if ctx.rank(vals) == 0 or ctx.dims(vals) == (1,):
            m = mask
            if ctx.rank(mask) < ctx.rank(x):
                m = ctx.g.reshape(mask, ctx.dims(mask) + (1,) * (ctx.rank(x) - ctx.rank(mask)))
            if ctx.rank(vals):
                vals = ctx.g.reshape(vals, ())
            return ctx.g.where(m, vals, x)
    raise ctx.fail("index_put (x[idx] = v) is supported for a boolean mask and a scalar value, "
                   "or one integer index tensor on one axis; write the update with torch.where")


def _index_put_axis(ctx, x, axis: int, i, c):
    """x[..., i, ...] = v (index_copy: a static KV cache written at cache_position) with a 1-D
    integer index on one axis: a scatter along it (accumulate: a scatter-add)."""
    i = ctx.value(i)
    if ctx.rank(i) != 1:
        raise ctx.fail(f"index_put with a rank-{ctx.rank(i)} index tensor is not supported "
                       "(one 1-D index tensor on one axis is)")
    dims = ctx.dims(x)
    region = dims[:axis] + ctx.dims(i) + dims[axis + 1:]
    vals = ctx.value(c["values"], ctx.dtype(x))
    if ctx.dims(vals) != region:
        vals = ctx.g.expand(vals, region)
    at = ctx.g.reshape(ctx.cast(i, i64), (1,) * axis + ctx.dims(i) + (1,) * (len(dims) - axis - 1))
    return scatter_along(ctx.g, x, at, vals, axis, "add" if c.get("accumulate", False) else "none")


@converter("aten.triu.default", "aten.tril.default")
def trilu(ctx, c):
    x = ctx.value(c["self"])
    k = ctx.static_int(c.get("diagonal", 0), "diagonal")
    return ctx.g.trilu(x, c.key == "aten.triu.default", k)


@converter("aten.diagonal.default", "aten.diagonal_copy.default")
def diagonal(ctx, c):
    """x.diagonal(offset, dim1, dim2) (einsum's "ii->i"): dim1 and dim2 moved last and merged,
    then one gather of the flat positions i * n2 + i + offset; the diagonal is the last axis.
    Both dims must be static."""
    x = ctx.value(c["self"])
    dims = ctx.dims(x)
    rank = len(dims)
    if rank < 2:
        raise ctx.fail(f"diagonal needs at least 2 dims, got {rank}")
    a = ctx.axis(ctx.static_int(c.get("dim1", 0), "diagonal dim1"), rank)
    b = ctx.axis(ctx.static_int(c.get("dim2", 1), "diagonal dim2"), rank)
    if a == b:
        raise ctx.fail(f"diagonal dims {a} and {b} must differ")
    offset = ctx.static_int(c.get("offset", 0), "diagonal offset")
    n1 = ctx.static_int(SymDim.of(dims[a]), "diagonal dim1's size")
    n2 = ctx.static_int(SymDim.of(dims[b]), "diagonal dim2's size")
    rows = np.arange(max(0, min(n1 + min(offset, 0), n2 - max(offset, 0))), dtype=np.int64)
    flat = (rows - min(offset, 0)) * n2 + rows + max(offset, 0)
    g = ctx.g
    rest = [i for i in range(rank) if i not in (a, b)]
    if rest + [a, b] != list(range(rank)):
        x = g.transpose(x, rest + [a, b])
    x = g.reshape(x, tuple(dims[i] for i in rest) + (n1 * n2,))
    return g.gather(x, g.constant(flat, i64), len(rest))
