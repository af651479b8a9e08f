"""`ElementwiseRegion`: a fused kind that carries its member elementwise ops as a small body
graph. The interpreter, code generators and unfuse all read that one body; equality and hashing
are by the body's structure, never by its length."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import GraphError, ShapeError
from ..op import Op, Value, require
from ..shapes import Shape
from .io import Constant, Input

if TYPE_CHECKING:
    from ..graph import Graph

__all__ = ["ElementwiseRegion", "region_input_name"]


def region_input_name(i: int) -> str:
    """Name of the body's `i`-th graph input ("in0", "in1", ...)."""
    return f"in{i}"


@dataclass(frozen=True, eq=False)
class ElementwiseRegion(Op):
    """Elementwise ops fused into one kernel, kept as a body graph.

    The body's graph inputs are named "in0", "in1", ... and are the region's inputs, in order;
    its other sources may only be constants; its non-source nodes must be elementwise ops. The
    region's outputs are the body's outputs (one or several). Shapes are re-inferred from the
    actual input shapes, so a body built with one set of (possibly symbolic) dims applies to any
    inputs its ops accept. Treat the body as frozen once wrapped: its structure is captured at
    construction for equality and hashing."""

    kind = "elementwise_region"
    arity = None
    min_arity = 0
    composite = True
    fused = True
    body: Graph

    def __post_init__(self):
        g = self.body
        if not g.outputs:
            raise GraphError(f"elementwise region body {g.name!r} has no outputs")
        for i, nid in enumerate(g.input_ids):
            want = region_input_name(i)
            if g.nodes[nid].op.name != want:
                raise GraphError(f"elementwise region body input {i} is named "
                                 f"{g.nodes[nid].op.name!r}; region inputs must be named {want!r}")
        for node in g.nodes:
            if node.op.source and not isinstance(node.op, (Input, Constant)):
                raise GraphError(f"elementwise region body may hold only inputs and constants as "
                                 f"sources; {node.describe()} is a {node.op.kind}")
            if not node.op.source and not node.op.elementwise:
                raise GraphError(f"elementwise region body holds {node.describe()}, which is not "
                                 "elementwise")
        object.__setattr__(self, "_key", _structural_key(g))

    # -- identity by contents -------------------------------------------------------------------
    @property
    def structural_key(self) -> tuple:
        """(input shapes, per-step (op, input wiring, output shapes), output wiring): what makes
        two regions the same region."""
        return self._key

    def __eq__(self, other) -> bool:
        return isinstance(other, ElementwiseRegion) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return (f"ElementwiseRegion({self.n_inputs} inputs, {len(self.steps)} steps, "
                f"{len(self.body.outputs)} outputs)")

    # -- views ----------------------------------------------------------------------------------
    @property
    def steps(self) -> list:
        """The body's non-source nodes, in order: the fused member ops."""
        return [n for n in self.body.nodes if not n.op.source]

    @property
    def n_inputs(self) -> int:
        return len(self.body.input_ids)

    @property
    def n_outputs(self) -> int:
        return len(self.body.outputs)

    @property
    def label(self) -> str:
        return self.kind

    def input_roles(self) -> tuple[str, ...]:
        return tuple(region_input_name(i) for i in range(self.n_inputs))

    # -- the op contract ------------------------------------------------------------------------
    def check_arity(self, n: int) -> None:
        require(n == self.n_inputs, f"{self.kind} takes {self.n_inputs} inputs (its body's), "
                                    f"got {n}")

    def infer(self, ins: tuple[Shape, ...]) -> Shape | tuple[Shape, ...]:
        self.check_arity(len(ins))
        g = self.body
        for i, (nid, s) in enumerate(zip(g.input_ids, ins)):
            want = g.nodes[nid].op.shape.dtype
            require(s.dtype == want, f"region input {i} must be {want}, got {s}")
        env = {(nid, 0): s for nid, s in zip(g.input_ids, ins)}
        for node in g.nodes:
            if isinstance(node.op, Constant):
                env[(node.id, 0)] = node.outputs[0]
            elif not node.op.source:
                try:
                    out = node.op.infer(tuple(env[(v.node, v.index)] for v in node.inputs))
                except ShapeError as e:
                    raise ShapeError(f"region step {node.label}: {e}") from None
                outs = (out,) if isinstance(out, Shape) else tuple(out)
                for k, s in enumerate(outs):
                    env[(node.id, k)] = s
        res = tuple(env[(v.node, v.index)] for v in g.outputs)
        return res[0] if len(res) == 1 else res

    def reference(self, *xs: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
        g = self.body
        env: dict[tuple[int, int], np.ndarray] = {
            (nid, 0): np.asarray(x) for nid, x in zip(g.input_ids, xs)
        }
        for node in g.nodes:
            if isinstance(node.op, Constant):
                env[(node.id, 0)] = node.op.value
            elif not node.op.source:
                res = node.op.reference(*(env[(v.node, v.index)] for v in node.inputs))
                outs = res if isinstance(res, tuple) else (res,)
                for k, o in enumerate(outs):
                    env[(node.id, k)] = np.asarray(o)
        res = tuple(env[(v.node, v.index)] for v in g.outputs)
        return res[0] if len(res) == 1 else res

    def decompose(self, g: Graph, ins: Sequence[Value]) -> Value | tuple[Value, ...]:
        """Inline the body into `g`: each step is copied with its inputs remapped; constants
        are copied too."""
        body = self.body
        env: dict[Value, Value] = {Value(nid): v for nid, v in zip(body.input_ids, ins)}
        for node in body.nodes:
            if isinstance(node.op, Constant):
                env[node.value] = g.add_node(node.op, ())[0]
            elif not node.op.source:
                new = g.add_node(node.op, tuple(env[v] for v in node.inputs),
                                 provenance=node.provenance)
                env.update(zip(node.values, new))
        res = tuple(env[v] for v in body.outputs)
        return res[0] if len(res) == 1 else res


def _structural_key(g: Graph) -> tuple:
    """A hashable description of the body's structure, independent of node ids and names."""
    ref: dict[tuple[int, int], Any] = {}
    in_shapes = []
    for i, nid in enumerate(g.input_ids):
        ref[(nid, 0)] = ("in", i)
        in_shapes.append(g.nodes[nid].op.shape)
    steps = []
    for node in g.nodes:
        if isinstance(node.op, Constant):
            ref[(node.id, 0)] = ("const", node.op)
        elif not node.op.source:
            wiring = tuple(ref[(v.node, v.index)] for v in node.inputs)
            for k in range(len(node.outputs)):
                ref[(node.id, k)] = ("step", len(steps), k)
            steps.append((node.op, wiring, node.outputs))
    outs = tuple(ref[(v.node, v.index)] for v in g.outputs)
    return tuple(in_shapes), tuple(steps), outs
