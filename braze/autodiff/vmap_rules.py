"""Batching rules for `vmap` (see braze/autodiff/vmap.py for the rule contract).

Every batched value carries the batch axis in front. Elementwise ops broadcast (a batched operand
of lower rank gets 1s after its batch axis); ops whose attributes name axes get them shifted by
one; matmul and dot_general treat the batch axis as one more batch dim; convolutions, pools,
resizes and attention fold it into their own batch dim by reshape. Composite ops without a rule
here (or whose rule returns None for the given flags) are batched through their decomposition."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..errors import AutodiffError
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.op import Value
from ..ir.ops.attention import Attention
from ..ir.ops.conv import Conv2d, ConvTranspose2d, GlobalAvgPool, Pool2d, ResizeNearest2x
from ..ir.ops.elementwise import (
    Binary,
    Cast,
    Clamp,
    Compare,
    IsInf,
    IsNan,
    LeakyRelu,
    StopGradient,
    Unary,
    Where,
)
from ..ir.ops.indexing import DynamicNarrow, GatherElements, Slice, TopK, Trilu
from ..ir.ops.linalg import DotGeneral, MatMul
from ..ir.ops.norm import LayerNorm, RmsNorm
from ..ir.ops.quant import Dequantize, FakeQuantize, Quantize
from ..ir.ops.reduce import ArgMax, Cumsum, LogSoftmax, Reduce, Softmax
from ..ir.ops.resize import Resize
from ..ir.ops.scan import Scan
from ..ir.ops.shape import Concat, Expand, Gather, Narrow, Pad, Reshape, Split, Transpose
from ..ir.shapes import Dim
from .vmap import batch_rule

Outs = tuple[list[Value], list[bool]]


def batch_size(b: Graph, ins: Sequence[Value], flags: Sequence[bool]) -> Dim:
    """The batch dim: the leading dim of the first batched input."""
    return next(b.shape_of(v).dims[0] for v, f in zip(ins, flags) if f)


def materialize(b: Graph, v: Value, batched: bool, bdim: Dim) -> Value:
    """`v` with the batch axis in front: broadcast along it when `v` is not batched."""
    return v if batched else b.expand(v, (bdim, *b.shape_of(v).dims))


def lift_rank(b: Graph, v: Value, rank: int) -> Value:
    """Batched `v` (batch axis in front) with 1s inserted after the batch axis until its
    per-example rank is `rank` (NumPy broadcasting aligns trailing axes)."""
    dims = b.shape_of(v).dims
    missing = rank - (len(dims) - 1)
    return v if missing <= 0 else b.reshape(v, (dims[0], *([1] * missing), *dims[1:]))


def _emit(b: Graph, node: Node, op, ins: Sequence[Value]) -> Outs:
    outs = list(b.add_node(op, tuple(ins), provenance=node.provenance))
    return outs, [True] * len(outs)


@batch_rule(Unary, Binary, Compare, Where, Cast, Clamp, LeakyRelu, IsNan, IsInf, StopGradient)
def _elementwise(b: Graph, node: Node, ins, flags) -> Outs:
    rank = len(node.outputs[0].dims)
    return _emit(b, node, node.op, [lift_rank(b, v, rank) if f else v
                                    for v, f in zip(ins, flags)])


def _shift(axis: int) -> int:
    return axis + 1


def _all_batched(b: Graph, ins, flags) -> list[Value]:
    bdim = batch_size(b, ins, flags)
    return [materialize(b, v, f, bdim) for v, f in zip(ins, flags)]


@batch_rule(Softmax, LogSoftmax, Cumsum, ArgMax, Narrow, DynamicNarrow, Slice, Split, Concat,
            TopK, GatherElements)
def _axis_op(b: Graph, node: Node, ins, flags) -> Outs:
    op = dataclasses.replace(node.op, axis=_shift(node.op.axis))
    return _emit(b, node, op, _all_batched(b, ins, flags))


@batch_rule(Quantize, Dequantize, FakeQuantize)
def _quant(b: Graph, node: Node, ins, flags) -> Outs:
    """Per-axis ops move their axis with x; batched per-tensor parameters become per-axis ones
    along the batch axis; batched per-axis parameters `[B, C]` apply to x with its batch and
    channel axes moved together and merged into one `B*C` axis."""
    axis = node.op.axis
    if not (flags[1] or flags[2]):
        shifted = None if axis is None else _shift(axis)
        return _emit(b, node, dataclasses.replace(node.op, axis=shifted), ins)
    x, scale, zp = _all_batched(b, ins, flags)
    if axis is None:
        return _emit(b, node, dataclasses.replace(node.op, axis=0), [x, scale, zp])
    dims = b.shape_of(x).dims
    perm = (0, axis + 1, *[a for a in range(1, len(dims)) if a != axis + 1])
    moved = b.transpose(x, perm)
    rest = b.shape_of(moved).dims[2:]
    flat = [_fold(b, moved), b.reshape(scale, (-1,)), b.reshape(zp, (-1,))]
    y = b.add_node(dataclasses.replace(node.op, axis=0), tuple(flat),
                   provenance=node.provenance)[0]
    y = b.reshape(y, (dims[0], dims[axis + 1], *rest))
    inverse = tuple(sorted(range(len(perm)), key=lambda i: perm[i]))
    return [b.transpose(y, inverse)], [True]


@batch_rule(Reduce)
def _reduce(b: Graph, node: Node, ins, flags) -> Outs:
    op = dataclasses.replace(node.op, axes=tuple(_shift(a) for a in node.op.axes))
    return _emit(b, node, op, ins)


@batch_rule(Trilu)
def _trilu(b: Graph, node: Node, ins, flags) -> Outs:
    return _emit(b, node, node.op, ins)


@batch_rule(Transpose)
def _transpose(b: Graph, node: Node, ins, flags) -> Outs:
    op = Transpose((0, *(_shift(p) for p in node.op.perm)))
    return _emit(b, node, op, ins)


@batch_rule(Reshape)
def _reshape(b: Graph, node: Node, ins, flags) -> Outs:
    bdim = batch_size(b, ins, flags)
    return _emit(b, node, Reshape((bdim, *node.op.dims)), ins)


@batch_rule(Expand)
def _expand(b: Graph, node: Node, ins, flags) -> Outs:
    bdim = batch_size(b, ins, flags)
    x = lift_rank(b, ins[0], len(node.op.dims))
    return _emit(b, node, Expand((bdim, *node.op.dims)), [x])


@batch_rule(Pad)
def _pad(b: Graph, node: Node, ins, flags) -> Outs:
    return _emit(b, node, dataclasses.replace(node.op, pads=((0, 0), *node.op.pads)), ins)


@batch_rule(Gather)
def _gather(b: Graph, node: Node, ins, flags) -> Outs:
    x, idx = ins
    if flags[0] and flags[1]:
        raise AutodiffError(f"{node.describe()}: vmap cannot batch a gather whose data and "
                            "indices are both batched; keep the table shared (a param) or "
                            "use gather_elements")
    if flags[0]:
        return _emit(b, node, Gather(_shift(node.op.axis)), [x, idx])
    out = b.add_node(node.op, (x, idx), provenance=node.provenance)[0]
    # the batch axis of the indices lands at position `axis` of the result: move it in front
    ax, rank = node.op.axis, b.shape_of(out).rank
    perm = (ax, *(i for i in range(rank) if i != ax))
    return [b.transpose(out, perm)], [True]


def _pad_matrix(b: Graph, v: Value, batched: bool, lhs: bool) -> tuple[Value, bool]:
    """Matmul operand `v` as a matrix: a vector becomes [1, k] (lhs) or [k, 1] (rhs); returns
    whether it was a vector."""
    own = b.shape_of(v).rank - (1 if batched else 0)
    if own != 1:
        return v, False
    dims = b.shape_of(v).dims
    head, (k,) = (dims[:1], dims[1:]) if batched else ((), dims)
    return b.reshape(v, (*head, 1, k) if lhs else (*head, k, 1)), True


@batch_rule(MatMul)
def _matmul(b: Graph, node: Node, ins, flags) -> Outs:
    (a, fa), (c, fc) = zip(ins, flags)
    a, a_vec = _pad_matrix(b, a, fa, lhs=True)
    c, c_vec = _pad_matrix(b, c, fc, lhs=False)
    ra = b.shape_of(a).rank - (1 if fa else 0)
    rc = b.shape_of(c).rank - (1 if fc else 0)
    rank = max(ra, rc)
    # a batched operand's batch axis must sit in front of every broadcast dim of the other
    a = lift_rank(b, a, rank) if fa else a
    c = lift_rank(b, c, rank) if fc else c
    out = b.add_node(node.op, (a, c), provenance=node.provenance)[0]
    if a_vec or c_vec:
        dims = b.shape_of(out).dims
        keep = dims[:-2] + ((dims[-1],) if a_vec and not c_vec else (dims[-2],)
                            if c_vec and not a_vec else ())
        out = b.reshape(out, keep)
    return [out], [True]


@batch_rule(DotGeneral)
def _dot_general(b: Graph, node: Node, ins, flags) -> Outs:
    op: DotGeneral = node.op
    sh = lambda dims: tuple(_shift(d) for d in dims)  # noqa: E731
    (a, fa), (c, fc) = zip(ins, flags)
    if fa and fc:
        new = DotGeneral(sh(op.lhs_contract), sh(op.rhs_contract), (0, *sh(op.lhs_batch)),
                         (0, *sh(op.rhs_batch)))
        return _emit(b, node, new, [a, c])
    if fa:
        new = DotGeneral(sh(op.lhs_contract), op.rhs_contract, sh(op.lhs_batch), op.rhs_batch)
        where = len(op.lhs_batch)  # the batch axis is the first lhs free dim
    else:
        new = DotGeneral(op.lhs_contract, sh(op.rhs_contract), op.lhs_batch, sh(op.rhs_batch))
        where = len(op.lhs_batch) + len(node.op.free_dims(b.shape_of(a).rank, "lhs"))
    out = b.add_node(new, (a, c), provenance=node.provenance)[0]
    if where:
        rank = b.shape_of(out).rank
        out = b.transpose(out, (where, *(i for i in range(rank) if i != where)))
    return [out], [True]


@batch_rule(LayerNorm, RmsNorm)
def _norm(b: Graph, node: Node, ins, flags):
    if any(flags[1:]):
        return None  # per-example gamma / beta: batch the decomposition
    return _emit(b, node, dataclasses.replace(node.op, axis=_shift(node.op.axis)), ins)


def _fold(b: Graph, v: Value) -> Value:
    """[B, N, ...] -> [B*N, ...]."""
    dims = b.shape_of(v).dims
    return b.reshape(v, (-1, *dims[2:]))


def _unfold(b: Graph, v: Value, bdim: Dim) -> Value:
    """[B*N, ...] -> [B, N, ...]."""
    dims = b.shape_of(v).dims
    return b.reshape(v, (bdim, -1, *dims[1:]))


def _folded(b: Graph, node: Node, ins, flags, n_folded: int) -> Outs | None:
    """Batch an op whose first `n_folded` inputs share a leading batch dim: fold the vmap axis
    into it, run the op once, unfold the outputs. None when a later input is batched."""
    if any(flags[n_folded:]):
        return None
    bdim = batch_size(b, ins, flags)
    head = [_fold(b, materialize(b, v, f, bdim)) for v, f in zip(ins[:n_folded], flags)]
    outs = b.add_node(node.op, (*head, *ins[n_folded:]), provenance=node.provenance)
    return [_unfold(b, o, bdim) for o in outs], [True] * len(outs)


@batch_rule(Conv2d, ConvTranspose2d, Pool2d, GlobalAvgPool, ResizeNearest2x, Resize)
def _spatial(b: Graph, node: Node, ins, flags) -> Outs:
    res = _folded(b, node, ins, flags, 1)
    if res is None:
        raise AutodiffError(f"{node.describe()}: vmap cannot batch the weights of a "
                            f"{node.op.kind}; keep them shared (params) or batch only its input")
    return res


@batch_rule(Attention)
def _attention(b: Graph, node: Node, ins, flags) -> Outs | None:
    for m in ins[3:]:
        dims = b.shape_of(m).dims
        if len(dims) == 4 and dims[0] != 1:
            return None  # a per-batch mask does not broadcast over the folded batch
    return _folded(b, node, ins, flags, 3)


@batch_rule(Scan)
def _scan(b: Graph, node: Node, ins, flags) -> Outs:
    """The body vmapped: every carry batched (a batched input reaches them after one step),
    batched broadcasts as they are, batched per-step inputs with the loop axis in front."""
    from .vmap import vmap

    op: Scan = node.op
    nc, head = op.n_carry, op.n_carry + op.n_bcast
    bdim = batch_size(b, ins, flags)
    body_names = [op.body.nodes[i].op.name for i in op.body.input_ids]
    batched_names = [n for i, n in enumerate(body_names) if i < nc or flags[i]]
    body = vmap(op.body, batched_names, axis_name=bdim)
    carries = [materialize(b, v, f, bdim) for v, f in zip(ins[:nc], flags)]
    xs = [_swap01(b, v) if f else v for v, f in zip(ins[head:], flags[head:])]
    outs = b.scan_general(body, carries, op.length, bcasts=ins[nc:head], xs=xs,
                          reverse=op.reverse, num_checkpoints=op.num_checkpoints)
    return [*outs[:nc], *(_swap01(b, y) for y in outs[nc:])], [True] * len(outs)


def _swap01(b: Graph, v: Value) -> Value:
    rank = b.shape_of(v).rank
    return b.transpose(v, (1, 0, *range(2, rank)))
