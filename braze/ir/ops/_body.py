"""Helpers for ops that hold body graphs (If, While, CustomFn, Scan): the body's input and
output types, a check that a body takes given types, running a body with the reference
interpreter, and copying a body into another graph (the decompositions use it).

Bodies are closed: whatever a body reads from outside comes in as one of its inputs (a
control-flow body may also hold its own params; see braze/ir/inline.py)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...errors import GraphError
from ..dtypes import dtype_from_numpy
from ..inline import inline_graph
from ..op import Value, require
from ..shapes import Shape
from .io import Constant, Input

if TYPE_CHECKING:
    from ..graph import Graph


def body_in_types(g: Graph) -> tuple[Shape, ...]:
    return tuple(g.nodes[i].outputs[0] for i in g.input_ids)


def body_out_types(g: Graph) -> tuple[Shape, ...]:
    return tuple(g.shape_of(v) for v in g.outputs)


def check_closed(g: Graph, what: str) -> None:
    """GraphError unless `g` has outputs and its only sources are inputs and constants."""
    if not g.outputs:
        raise GraphError(f"{what} {g.name!r} has no outputs")
    for node in g.nodes:
        if node.op.source and not isinstance(node.op, (Input, Constant)):
            raise GraphError(f"{what} {g.name!r} holds {node.describe()}; a body reads only its "
                             "inputs and constants (pass weights in as inputs)")


def check_takes(g: Graph, what: str, types: Sequence[Shape], role: str) -> None:
    """ShapeError unless `g`'s inputs are exactly `types`, naming the first that differs."""
    have = body_in_types(g)
    require(len(have) == len(types), f"{what} {g.name!r} takes {len(have)} inputs, but it is "
                                     f"given {len(types)} ({role})")
    for i, (h, t) in enumerate(zip(have, types)):
        name = g.nodes[g.input_ids[i]].op.name
        require(h.dtype == t.dtype and h.dims == t.dims,
                f"{what} {g.name!r} input {i} {name!r} is {h}, but position {i} of {role} is {t}")


def check_returns(g: Graph, what: str, types: Sequence[Shape], role: str) -> None:
    """ShapeError unless `g`'s outputs are exactly `types`."""
    have = body_out_types(g)
    require(len(have) == len(types) and all(h.dtype == t.dtype and h.dims == t.dims
                                            for h, t in zip(have, types)),
            f"{what} {g.name!r} must return {role}: {', '.join(map(str, types))}; it returns "
            f"{', '.join(map(str, have))}")


def run_body(g: Graph, xs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Interpret body `g` on arrays `xs` (bound to its inputs in order). Float arrays wider
    than declared (the interpreter's float64 mode) keep the body in float64."""
    from ...interpret import interpret

    feeds, wide = {}, False
    for nid, x in zip(g.input_ids, xs):
        op = g.nodes[nid].op
        x = np.asarray(x)
        if op.shape.dtype.is_float and (x.dtype.kind == "f" or x.dtype.name == "bfloat16") \
                and x.dtype != op.shape.dtype.np:
            wide = wide or dtype_from_numpy(x.dtype).name == "f64"
            x = x.astype(op.shape.dtype.np)
        feeds[op.name] = x
    return interpret(g, feeds, float64=wide)


def inline_body(target: Graph, body: Graph, ins: Sequence[Value]) -> list[Value]:
    """Copy `body`'s nodes into `target` with its inputs bound, in order, to `ins`; returns the
    target values of the body's outputs (braze.ir.inline.inline_graph)."""
    return inline_graph(target, body, ins)


_NESTING_KINDS = frozenset({"if", "while", "scan", "custom_fn"})  # ops that hold bodies


def body_key(g: Graph) -> tuple:
    """A cheap summary equal for structurally equal bodies (for hashing). An op holding bodies
    of its own enters by its hash, so bodies nested to different depths hash apart (by kinds
    alone every level of a chain of nested ifs collided, and each lookup compared the chains
    in full: a 150-deep file took 14 s to load)."""
    return (tuple(hash(n.op) if n.op.kind in _NESTING_KINDS else n.op.kind for n in g.nodes),
            body_in_types(g), body_out_types(g))


def single(vals: Sequence):
    return vals[0] if len(vals) == 1 else tuple(vals)
