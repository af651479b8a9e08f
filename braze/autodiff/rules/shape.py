"""VJP and JVP rules of the data-movement ops (reshape, transpose, narrow, slice, concat, split,
expand, pad, trilu). Every one is linear in its data input, so its JVP applies the same op to the
tangent, and its VJP moves the cotangent back: reshape back, inverse transpose, zero-pad a
narrow or slice, cut a concat, join a split, sum an expand, fold a pad's border back in."""
from __future__ import annotations

import dataclasses

from ...errors import AutodiffError
from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.op import Value
from ...ir.ops.indexing import DynamicNarrow, Slice, Trilu
from ...ir.ops.shape import Concat, Expand, Narrow, Pad, PadMode, Reshape, Split, Transpose
from ...ir.shapes import Dim
from ...ir.symbolic import SymDim
from ..emit import zeros
from ..registry import jvp_rule, unbroadcast, vjp_rule


@vjp_rule(Reshape)
def reshape_vjp(b, node, ins, outs, cts):
    return [None if cts[0] is None else b.reshape(cts[0], b.shape_of(ins[0]).dims)]


@vjp_rule(Transpose)
def transpose_vjp(b, node, ins, outs, cts):
    if cts[0] is None:
        return [None]
    perm = node.op.perm
    inverse = tuple(perm.index(i) for i in range(len(perm)))
    return [b.transpose(cts[0], inverse)]


@vjp_rule(Expand)
def expand_vjp(b, node, ins, outs, cts):
    return [None if cts[0] is None else unbroadcast(b, cts[0], b.shape_of(ins[0]))]


@vjp_rule(Trilu)
def trilu_vjp(b, node, ins, outs, cts):
    return [None if cts[0] is None else b.add_node(node.op, (cts[0],))[0]]


def _zero_pad_axis(b: Graph, v: Value, axis: int, before: Dim, after: Dim) -> Value:
    """`v` with `before` / `after` zeros added on `axis` (symbolic amounts: concat zeros)."""
    if before == 0 and after == 0:
        return v
    shape = b.shape_of(v)
    if isinstance(before, int) and isinstance(after, int):
        pads = tuple((before, after) if i == axis else (0, 0) for i in range(shape.rank))
        return b.pad(v, pads, 0.0)
    pieces = []
    for amount in (before, None, after):
        if amount is None:
            pieces.append(v)
        elif amount != 0:
            dims = shape.dims[:axis] + (amount,) + shape.dims[axis + 1:]
            pieces.append(zeros(b, shape.with_dims(dims)))
    return b.concat(pieces, axis)


@vjp_rule(Narrow, DynamicNarrow)
def narrow_vjp(b, node, ins, outs, cts):
    if cts[0] is None:
        return [None]
    op = node.op
    size = b.shape_of(ins[0]).dims[op.axis]
    after = (SymDim.of(size) - SymDim.of(op.start) - SymDim.of(op.length)).to_dim()
    return [_zero_pad_axis(b, cts[0], op.axis, op.start, after)]


def _reverse(b: Graph, v: Value, axis: int) -> Value:
    return b.slice(v, axis, -1, -(b.shape_of(v).dims[axis] + 1), -1)


@vjp_rule(Slice)
def slice_vjp(b, node, ins, outs, cts):
    ct = cts[0]
    if ct is None:
        return [None]
    op = node.op
    shape = b.shape_of(ins[0])
    size = shape.dims[op.axis]
    picked = range(*slice(op.start, op.stop, op.step).indices(size))
    n = len(picked)
    if n == 0:
        return [zeros(b, shape)]
    step = abs(op.step)
    if op.step < 0 and n > 1:
        ct = _reverse(b, ct, op.axis)
    first = min(picked)
    if step > 1:  # interleave step - 1 zeros after each element, then drop the tail
        dims = b.shape_of(ct).dims
        spread = dims[:op.axis + 1] + (1,) + dims[op.axis + 1:]
        ct = _zero_pad_axis(b, b.reshape(ct, spread), op.axis + 1, 0, step - 1)
        ct = b.reshape(ct, dims[:op.axis] + (n * step,) + dims[op.axis + 1:])
        ct = b.narrow(ct, op.axis, 0, (n - 1) * step + 1)
    return [_zero_pad_axis(b, ct, op.axis, first, size - first - (n - 1) * step - 1)]


@vjp_rule(Concat)
def concat_vjp(b, node, ins, outs, cts):
    ct = cts[0]
    if ct is None:
        return [None] * len(ins)
    axis = node.op.axis
    out, offset = [], 0
    for v in ins:
        length = b.shape_of(v).dims[axis]
        if not isinstance(offset, int):
            raise AutodiffError(f"{node.describe()}: concat inputs after a symbolic-length "
                                f"input ({offset}) cannot be cut back out; make the axis static")
        out.append(b.narrow(ct, axis, offset, length))
        offset = (SymDim.of(offset) + SymDim.of(length)).to_dim()
    return out


@vjp_rule(Split)
def split_vjp(b, node, ins, outs, cts):
    if all(c is None for c in cts):
        return [None]
    pieces = [zeros(b, node.outputs[i]) if c is None else c for i, c in enumerate(cts)]
    return [b.concat(pieces, node.op.axis)]


def _fold_border(b: Graph, ct: Value, axis: int, before: int, after: int, size: int,
                 mode: PadMode) -> Value:
    """The cotangent of one axis of an edge / reflect pad: the centre plus the border elements
    added back onto the elements they copied."""
    centre = b.narrow(ct, axis, before, size)
    if before:
        left = b.narrow(ct, axis, 0, before)
        if mode is PadMode.EDGE:
            centre = b.add(centre, _zero_pad_axis(b, b.sum(left, axis, keepdims=True), axis,
                                                  0, size - 1))
        else:  # left[j] copied x[before - j]
            centre = b.add(centre, _zero_pad_axis(b, _reverse(b, left, axis), axis, 1,
                                                  size - 1 - before))
    if after:
        right = b.narrow(ct, axis, before + size, after)
        if mode is PadMode.EDGE:
            centre = b.add(centre, _zero_pad_axis(b, b.sum(right, axis, keepdims=True), axis,
                                                  size - 1, 0))
        else:  # right[j] copied x[size - 2 - j]
            centre = b.add(centre, _zero_pad_axis(b, _reverse(b, right, axis), axis,
                                                  size - 1 - after, 1))
    return centre


@vjp_rule(Pad)
def pad_vjp(b, node, ins, outs, cts):
    ct = cts[0]
    if ct is None:
        return [None]
    op = node.op
    dims = b.shape_of(ins[0]).dims
    for axis, (before, after) in enumerate(op.pads):
        if not (before or after):
            continue
        if op.mode is PadMode.CONSTANT:
            ct = b.narrow(ct, axis, before, dims[axis])
        else:
            ct = _fold_border(b, ct, axis, before, after, dims[axis], op.mode)
    return [ct]


def _same_op_on_tangent(b: Graph, node: Node, tangents) -> list[Value | None]:
    """JVP of an op linear in its (only) input: the op applied to the tangent."""
    (t,) = tangents
    return [None] * len(node.outputs) if t is None else list(b.add_node(node.op, (t,)))


for _cls in (Reshape, Transpose, Narrow, DynamicNarrow, Slice, Expand, Trilu, Split):
    jvp_rule(_cls)(lambda b, node, ins, outs, tangents: _same_op_on_tangent(b, node, tangents))


@jvp_rule(Pad)
def pad_jvp(b, node, ins, outs, tangents):
    op = node.op
    if op.mode is PadMode.CONSTANT and op.value != 0.0:
        op = dataclasses.replace(op, value=0.0)
    return [None if tangents[0] is None else b.add_node(op, (tangents[0],))[0]]


@jvp_rule(Concat)
def concat_jvp(b, node, ins, outs, tangents):
    if all(t is None for t in tangents):
        return [None]
    parts = [zeros(b, b.shape_of(v)) if t is None else t for v, t in zip(ins, tangents)]
    return [b.add_node(node.op, parts)[0]]
