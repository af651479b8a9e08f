"""ONNX reductions and normalizations: ReduceMean/Sum/Max/Min/Prod (axes as attribute or, in
newer opsets, as input), ReduceL1/L2/SumSquare/LogSum/LogSumExp as an elementwise map around a
sum (F.normalize exports ReduceL2), Softmax / LogSoftmax (opset < 13 flatten at `axis`),
LayerNormalization, CumSum, ArgMax / ArgMin, TopK (static k), OneHot (static depth and values)."""
from __future__ import annotations

import numpy as np

from ....ir.dtypes import i64
from ....ir.ops.reduce import ReduceFn
from ....ir.symbolic import SymDim
from ...norms import root_of_sum
from ..context import ImportContext, NodeView, converter
from ..dtypes import onnx_dtype

_REDUCE = {"ReduceMean": ReduceFn.MEAN, "ReduceSum": ReduceFn.SUM, "ReduceMax": ReduceFn.MAX,
           "ReduceMin": ReduceFn.MIN, "ReduceProd": ReduceFn.PROD}


# reductions written as pre(x) -> sum -> post(s): name -> (pre, post)
_SUM_OF = {
    "ReduceL1": ("abs", None),
    "ReduceL2": ("square", "sqrt"),
    "ReduceSumSquare": ("square", None),
    "ReduceLogSum": (None, "log"),
}


def _axes_input_opset(op_type: str) -> int:
    return 13 if op_type == "ReduceSum" else 18


def _reduce_axes(ctx: ImportContext, node: NodeView, rank: int) -> list[int] | None:
    """The reduced axes (normalized), or None for ONNX's no-op with empty axes."""
    if ctx.opset >= _axes_input_opset(node.op_type) and "axes" not in node.attrs:
        axes = ctx.static_ints(node, 1, "reduction axes") if ctx.has(node, 1) else None
    else:
        axes = node.attr("axes", None)
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return None
        axes = list(range(rank))
    return [a % rank for a in axes]


@converter(*_SUM_OF)
def reduce_sum_of(ctx: ImportContext, node: NodeView):
    x = ctx.value(node, 0)
    pre, post = _SUM_OF[node.op_type]
    axes = _reduce_axes(ctx, node, len(ctx.dims(x)))
    if axes is None:  # no reduction: the elementwise maps only
        y = ctx.g.activation(x, pre) if pre else x
        return [ctx.g.activation(y, post) if post else y]
    y = ctx.g.activation(x, pre) if pre else x
    y = ctx.g.reduce(y, ReduceFn.SUM, axes, bool(node.attr("keepdims", 1)))
    if post == "sqrt":  # a zero vector's L2 norm has a zero gradient, not NaN
        return [root_of_sum(ctx.g, y, ctx.g.sqrt)]
    return [ctx.g.activation(y, post) if post else y]


def _empty_reduction(ctx: ImportContext, node: NodeView, x, axes: list[int], fill: str):
    """The result of reducing over an empty set (a static 0 among the reduced dims): ONNX's
    identity element, broadcast to the output shape; None when the set is not empty."""
    dims = ctx.dims(x)
    if not any(dims[a] == 0 for a in axes):
        return None
    dt = ctx.dtype(x)
    if dt.kind == "bool":
        value = fill == "min_identity"  # any() of nothing is False, all() True
    elif dt.is_float:
        value = -np.inf if fill == "max_identity" else np.inf
    else:
        info = np.iinfo(dt.np)
        value = info.min if fill == "max_identity" else info.max
    keep = bool(node.attr("keepdims", 1))
    out = [1 if i in axes else d for i, d in enumerate(dims) if keep or i not in axes]
    c = ctx.g.constant(np.asarray(value, dt.np), dt)
    return ctx.g.expand(c, out) if out else c


@converter("ReduceLogSumExp")
def reduce_log_sum_exp(ctx: ImportContext, node: NodeView):
    """log(sum(exp(x))) computed as m + log(sum(exp(x - m))) with m the max (no overflow), m
    taken as 0 where it is infinite (all -inf is -inf and a +inf is +inf, not inf - inf = NaN),
    as the torch importer's logsumexp does."""
    x = ctx.value(node, 0)
    axes = _reduce_axes(ctx, node, len(ctx.dims(x)))
    if axes is None:
        return [x]
    empty = _empty_reduction(ctx, node, x, axes, "max_identity")  # log(0) = -inf
    if empty is not None:
        return [empty]
    g = ctx.g
    m = g.reduce(x, ReduceFn.MAX, axes, True)
    dt = ctx.dtype(x)
    m = g.where(g.isinf(m), g.constant(np.asarray(0, dt.np), dt), m)
    s = g.reduce(g.activation(g.sub(x, m), "exp"), ReduceFn.SUM, axes, True)
    y = g.add(g.activation(s, "log"), m)
    if not node.attr("keepdims", 1):
        y = g.reshape(y, tuple(d for i, d in enumerate(ctx.dims(x)) if i not in axes))
    return [y]


@converter(*_REDUCE)
def reduce(ctx: ImportContext, node: NodeView):
    x = ctx.value(node, 0)
    axes = _reduce_axes(ctx, node, len(ctx.dims(x)))
    if axes is None:
        return [x]
    fn = _REDUCE[node.op_type]
    if fn in (ReduceFn.MAX, ReduceFn.MIN):
        empty = _empty_reduction(ctx, node, x, axes,
                                 "max_identity" if fn is ReduceFn.MAX else "min_identity")
        if empty is not None:
            return [empty]
    return [ctx.g.reduce(x, fn, axes, bool(node.attr("keepdims", 1)))]


def _flattened(ctx, node, x, build):
    """Opset < 13 Softmax semantics: normalize over all dims from `axis` (flattened)."""
    dims = ctx.dims(x)
    rank = len(dims)
    ax = node.attr("axis", 1 if ctx.opset < 13 else -1)
    ax = ax % rank if rank else 0
    if ctx.opset >= 13 or ax == rank - 1:
        return build(x, ax)
    tail = SymDim.of(1)
    for d in dims[ax:]:
        tail = tail * SymDim.of(d)
    flat = ctx.g.reshape(x, tuple(dims[:ax]) + (tail.to_dim(),))
    return ctx.g.reshape(build(flat, -1), dims)


@converter("Softmax")
def softmax(ctx, node):
    return [_flattened(ctx, node, ctx.value(node, 0), ctx.g.softmax)]


@converter("LogSoftmax")
def log_softmax(ctx, node):
    return [_flattened(ctx, node, ctx.value(node, 0), ctx.g.log_softmax)]


@converter("LayerNormalization")
def layer_norm(ctx, node):
    """One layer_norm node; the optional Mean / InvStdDev outputs (training graphs read them)
    are computed beside it in primitives, in the stash type. A scale or bias that broadcasts
    to the normalized shape (ONNX's function body multiplies and adds with broadcasting:
    [1, D] for [S, D]) is expanded to it."""
    x = ctx.value(node, 0)
    rank = len(ctx.dims(x))
    axis, eps = node.attr("axis", -1), float(node.attr("epsilon", 1e-5))
    if not -rank <= axis < max(rank, 1):
        raise ctx.fail(node, f"axis {axis} is out of range for rank {rank}")
    normalized = tuple(ctx.dims(x)[axis % rank:])
    affine = []
    for v in (ctx.opt_value(node, 1), ctx.opt_value(node, 2)):
        dims = tuple(ctx.dims(v)) if v is not None else normalized
        if dims != normalized and len(dims) <= len(normalized) and all(
                d in (1, n) for d, n in zip(dims[::-1], normalized[::-1])):
            v = ctx.g.expand(ctx.g.reshape(v, (1,) * (len(normalized) - len(dims)) + dims),
                             normalized)
        affine.append(v)
    y = ctx.g.layer_norm(x, *affine, eps=eps, axis=axis)
    if not any(node.outputs[1:]):
        return [y]
    g = ctx.g
    stash = onnx_dtype(node.attr("stash_type", 1), f"{ctx.source}: node {node.label} stash_type")
    xs = x if ctx.dtype(x) == stash else g.cast(x, stash)
    axes = list(range(axis % rank, rank))
    mean = g.reduce(xs, ReduceFn.MEAN, axes, True)
    centered = g.sub(xs, mean)
    var = g.reduce(g.mul(centered, centered), ReduceFn.MEAN, axes, True)
    inv_std = g.activation(g.add(var, ctx.const_like(eps, var)), "rsqrt")
    return [y, mean, inv_std]


@converter("CumSum")
def cumsum(ctx, node):
    axis = int(ctx.scalar(node, 1, "CumSum axis"))
    return [ctx.g.cumsum(ctx.value(node, 0), axis, bool(node.attr("exclusive", 0)),
                         bool(node.attr("reverse", 0)))]


@converter("ArgMax", "ArgMin")
def arg_extreme(ctx, node):
    """ArgMax, and ArgMin as the ArgMax of an order-reversing map of x (-x for floats, -1 - x
    for signed and MAX - x for unsigned integers: none of them overflows)."""
    x = ctx.value(node, 0)
    dims = ctx.dims(x)
    axis, keepdims = node.attr("axis", 0), bool(node.attr("keepdims", 1))
    if not -len(dims) <= axis < max(len(dims), 1):
        raise ctx.fail(node, f"axis {axis} is out of range for rank {len(dims)}")
    g = ctx.g
    if node.op_type == "ArgMin":
        dt = ctx.dtype(x)
        if dt.is_float:
            x = g.neg(x)
        elif dt.is_int and np.issubdtype(dt.np, np.signedinteger):
            x = g.sub(ctx.const_like(-1, x), x)
        elif dt.is_int:
            x = g.sub(ctx.const_like(np.iinfo(dt.np).max, x), x)
        else:
            raise ctx.fail(node, f"ArgMin of a {dt} tensor is not defined (numbers only)")
    if not node.attr("select_last_index", 0):
        return [g.argmax(x, axis, keepdims)]
    # the last extreme: the first one of the reversed axis, counted from the end
    n = dims[axis]
    if not isinstance(n, int):
        raise ctx.fail(node, f"{node.op_type} with select_last_index=1 needs a static axis "
                             f"{axis}, got {n}; pass input_shapes= to import_onnx to fix it")
    first = g.argmax(g.slice(x, axis, -1, -(n + 1), -1), axis, keepdims)
    return [g.sub(ctx.const_like(n - 1, first), first)]


@converter("TopK")
def top_k(ctx, node):
    x = ctx.value(node, 0)
    k = node.attr("k") if ctx.opset < 10 else ctx.static_ints(node, 1, "TopK k")[0]
    return list(ctx.g.top_k(x, int(k), node.attr("axis", -1), bool(node.attr("largest", 1)),
                            bool(node.attr("sorted", 1))))


@converter("OneHot")
def one_hot(ctx, node):
    """`on` where an index (negative ones counted from `depth`) equals its position along the
    new `axis`, else `off` (values = [off, on]): a compare of the indices with a range, then a
    select. The depth must be known at import time."""
    g = ctx.g
    depth = ctx.scalar(node, 1, "OneHot depth")
    if isinstance(depth, SymDim):
        raise ctx.fail(node, f"OneHot depth {depth} must be static; pass input_shapes= to "
                             "import_onnx to fix the dims")
    depth = int(depth)
    idx = ctx.value(node, 0)
    rank = len(ctx.dims(idx)) + 1
    axis = node.attr("axis", -1)
    if not -rank <= axis < rank:
        raise ctx.fail(node, f"axis {axis} is out of range for output rank {rank}")
    axis %= rank
    idx = g.cast(idx, i64)
    idx = g.where(g.compare(idx, 0, "lt"), g.add(idx, depth), idx)
    classes = g.reshape(g.arange(depth), tuple(depth if a == axis else 1 for a in range(rank)))
    hit = g.compare(g.unsqueeze(idx, axis), classes, "eq")
    values = ctx.value(node, 2)
    off, on = (g.narrow(values, 0, i, 1) for i in (0, 1))  # [1]: broadcasts against hit
    return [g.where(hit, on, off)]
