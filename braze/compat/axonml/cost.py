"""Bytes-moved cost model behind `estimated_speedup`: an unfused op reads every input from memory
and writes its output; a fused group reads only its external inputs and writes only the values
that leave it. Speedup = unfused bytes / fused bytes. Works on op-type sequences and on graphs.

Without shapes every tensor has DEFAULT_SHAPE (f32); ops read `OpType.arity` tensors, the first
being the previous op's output."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...errors import GraphError
from ...ir.graph import Graph
from ...ir.shapes import Shape
from .patterns import Detected, OpType

__all__ = ["DEFAULT_SHAPE", "OpShapes", "op_shapes", "sequence_bytes", "graph_bytes"]

DEFAULT_SHAPE: tuple[int, ...] = (256, 1024)
"""Shape of every tensor when the caller gives no shapes: 256 x 1024 f32 (1 MiB)."""

InputRef = tuple[int, ...] | int


@dataclass(frozen=True)
class OpShapes:
    """What one op of a sequence reads and writes.

    Each input is a shape (an external tensor: weight, bias, graph input) or a negative int
    -k: the output of the op k positions earlier (-1 is the previous op). A reference to an op
    inside the same fused group costs nothing; every other input is read from memory."""

    inputs: tuple[InputRef, ...]
    output: tuple[int, ...]


def op_shapes(op_types: Sequence[OpType], shapes: Sequence | None = None) -> list[OpShapes]:
    """Normalize `shapes` (None, or one entry per op: an OpShapes or a plain shape) to OpShapes.

    A plain shape s means every tensor the op touches has shape s: it reads `arity` tensors of
    shape s, the first being the previous op's output (-1) unless the op is first."""
    if shapes is None:
        shapes = [DEFAULT_SHAPE] * len(op_types)
    if len(shapes) != len(op_types):
        raise ValueError(f"got {len(shapes)} shapes for {len(op_types)} ops; give one per op")
    out = []
    for i, (t, s) in enumerate(zip(op_types, shapes)):
        if isinstance(s, OpShapes):
            for ref in s.inputs:
                if isinstance(ref, int) and not (-i <= ref < 0):
                    raise ValueError(f"op {i} ({t.name}) refers to op {i + ref}, which is not "
                                     "an earlier op")
            out.append(s)
            continue
        dims = tuple(int(d) for d in s)
        first: InputRef = -1 if i > 0 else dims
        out.append(OpShapes((first,) + (dims,) * (t.arity - 1), dims))
    return out


def _nbytes(dims: Sequence[int], itemsize: int) -> int:
    n = itemsize
    for d in dims:
        n *= int(d)
    return n


def sequence_bytes(
    op_types: Sequence[OpType],
    groups: Sequence[Detected] = (),
    shapes: Sequence | None = None,
    itemsize: int = 4,
) -> int:
    """Bytes moved running `op_types` with `groups` fused (ops outside groups run alone).

    A group reads each external input once (shapes, and outputs of ops outside it) and writes
    its last op's output plus any member output that an op outside the group reads."""
    spec = op_shapes(op_types, shapes)
    group_of = list(range(len(spec)))  # op index -> id of its group (its own index when alone)
    members: dict[int, list[int]] = {i: [i] for i in range(len(spec))}
    for d in groups:
        if not 0 <= d.start < d.end <= len(spec):
            raise ValueError(f"{d} does not fit the {len(spec)}-op sequence (indices "
                             f"[start, end) with 0 <= start < end <= {len(spec)})")
        gid = d.start
        for i in d.span:
            if i not in members:
                raise ValueError(f"{d} overlaps another fused group at op {i}")
            del members[i]
            group_of[i] = gid
        members[gid] = list(d.span)
    read_outside: set[int] = set()
    for i, s in enumerate(spec):
        for ref in s.inputs:
            if isinstance(ref, int) and group_of[i + ref] != group_of[i]:
                read_outside.add(i + ref)
    total = 0
    for ops in members.values():
        seen: set[int] = set()
        for i in ops:
            for ref in spec[i].inputs:
                if not isinstance(ref, int):
                    total += _nbytes(ref, itemsize)
                elif group_of[i + ref] != group_of[i] and i + ref not in seen:
                    seen.add(i + ref)
                    total += _nbytes(spec[i + ref].output, itemsize)
        for i in ops:
            if i == ops[-1] or i in read_outside:
                total += _nbytes(spec[i].output, itemsize)
    return total


def graph_bytes(g: Graph, symbols: Mapping[str, int] | None = None) -> int:
    """Bytes moved running `g` node by node: every non-source node reads each distinct input
    value and writes each output. Symbolic dims take their value from `symbols`."""
    total = 0
    for node in g.nodes:
        if node.op.source:
            continue
        ins = {(v.node, v.index): g.shape_of(v) for v in node.inputs}
        for s in list(ins.values()) + list(node.outputs):
            total += _shape_bytes(s, symbols or {}, node.label)
    return total


def _shape_bytes(s: Shape, symbols: Mapping[str, int], where: str) -> int:
    dims = []
    for d in s.dims:
        if isinstance(d, str):
            if d not in symbols:
                raise GraphError(f"cost model needs a size for symbolic dim {d!r} of {where}; "
                                 f"pass symbols={{{d!r}: ...}}")
            d = symbols[d]
        dims.append(d)
    return _nbytes(dims, s.dtype.itemsize)
