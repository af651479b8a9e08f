"""LowerNonLastAxisReduce: reductions a backend can only run over the trailing axis.

A `reduce` over other or several axes transposes those axes to the end (kept axes first, in
order), merges them into one with a reshape, and reduces the last axis; `keepdims` becomes a
reshape that puts size-1 dims back. argmax moves its axis last (a keepdims result is a reshape);
cumsum, softmax and log_softmax move their axis last and transpose the result back. A reduce
over no axes is the identity. Which nodes it rewrites is exactly what the target constraint
"reduce_last_axis_only" refuses (braze/passes/constraints.py), so the two never disagree."""
from __future__ import annotations

from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.op import Value
from ...ir.ops.reduce import ArgMax, Cumsum, LogSoftmax, Reduce, Softmax
from ..constraints import reduces_last_axis_only
from .layout import inverse_permutation, product_dim, reshape_if_needed, transpose_if_needed
from .registry import Lowering, register_lowering

REDUCE_KINDS = frozenset({"reduce", "argmax", "cumsum", "softmax", "log_softmax"})


def _axis_last(rank: int, axes: tuple[int, ...]) -> tuple[int, ...]:
    """The permutation that keeps the other axes in order and puts `axes` at the end."""
    return tuple(i for i in range(rank) if i not in axes) + tuple(axes)


def _lower_reduce(g: Graph, op: Reduce, x: Value) -> Value:
    dims = g.shape_of(x).dims
    if not op.axes:
        return x
    kept = [d for i, d in enumerate(dims) if i not in op.axes]
    moved = transpose_if_needed(g, x, _axis_last(len(dims), op.axes))
    merged = reshape_if_needed(g, moved, kept + [product_dim([dims[i] for i in op.axes])])
    out = g.reduce(merged, op.fn, len(kept))
    if op.keepdims:
        out = g.reshape(out, [1 if i in op.axes else d for i, d in enumerate(dims)])
    return out


def _lower_argmax(g: Graph, op: ArgMax, x: Value) -> Value:
    dims = g.shape_of(x).dims
    ax = op.axis % len(dims)
    out = g.argmax(transpose_if_needed(g, x, _axis_last(len(dims), (ax,))), -1)
    if op.keepdims:
        out = g.reshape(out, [1 if i == ax else d for i, d in enumerate(dims)])
    return out


def _lower_along_axis(g: Graph, op: Cumsum | Softmax | LogSoftmax, x: Value) -> Value:
    rank = g.shape_of(x).rank
    perm = _axis_last(rank, (op.axis % rank,))
    moved = transpose_if_needed(g, x, perm)
    if isinstance(op, Cumsum):
        out = g.cumsum(moved, -1, op.exclusive, op.reverse)
    elif isinstance(op, Softmax):
        out = g.softmax(moved, -1)
    else:
        out = g.log_softmax(moved, -1)
    return transpose_if_needed(g, out, inverse_permutation(perm))


def lower_reduce_axes(g: Graph, node: Node, ins: list[Value], old: Graph) -> Value:
    """Build `node` (a reduction over non-trailing or several axes) as a trailing-axis one."""
    op = node.op
    (x,) = ins
    if isinstance(op, Reduce):
        return _lower_reduce(g, op, x)
    if isinstance(op, ArgMax):
        return _lower_argmax(g, op, x)
    return _lower_along_axis(g, op, x)


def _breaks_last_axis_only(node: Node, g: Graph) -> bool:
    return not reduces_last_axis_only(node, g)


LOWER_NON_LAST_AXIS_REDUCE = Lowering(
    "LowerNonLastAxisReduce", REDUCE_KINDS, lower_reduce_axes, when=_breaks_last_axis_only,
    fixes="reduce_last_axis_only",
    doc="reductions over non-trailing or several axes -> transpose (+ reshape) + last-axis "
        "reduction (+ reshape / transpose back)")
LowerNonLastAxisReduce = register_lowering(LOWER_NON_LAST_AXIS_REDUCE)
