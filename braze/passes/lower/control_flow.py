"""LowerControlFlow: `if` and `while` to straight-line ops, for backends (and the ONNX exporter)
that run no control flow.

- `if(pred, *operands)` -> both branches inlined + `where(pred, then_out, else_out)` per
  output. Both branches always run; only the selected values reach the result.
- `while(*carried)` -> a bounded unroll of `max_iterations` steps. Each step inlines cond and
  body on the current carried values, computes `active = active_prev & cond(carried)` and
  applies `carried = where(active, body_out, carried)` per value, so a loop that finished early
  keeps its values. A loop the interpreter would run past the bound (an error there) is cut
  off at the bound here. A `while` without `max_iterations` is a PassError naming the node.

Nested control flow lowers in the same pass: bodies are lowered before they are inlined.
Inlining (`inline_subgraph_into`) binds the sub-graph's inputs by position; its params become
params of the target with the same name and stored value, shared when the target already has
that param with the same type and value, and renamed (`w_1`) when the name would capture a
different tensor. Copied nodes keep their provenance; the replaced node's provenance fills in
where a body node has none."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from ...errors import PassError
from ...ir.graph import Graph
from ...ir.inline import inline_graph
from ...ir.node import Node
from ...ir.op import Value
from ...ir.ops.control import UNBOUNDED_LOOP_FIX, If, While
from ..expand import replace_nodes
from .registry import Lowering, register_lowering

__all__ = ["LowerControlFlow", "inline_if", "unroll_while", "inline_subgraph_into",
           "inline_subgraph_into_outputs", "lower_control_flow"]

CONTROL_KINDS = frozenset({If.kind, While.kind})


def inline_subgraph_into_outputs(target: Graph, sub: Graph, inputs: Sequence[Value]
                                 ) -> list[Value]:
    """Copy `sub`'s nodes into `target`, binding `sub`'s i-th input to `inputs[i]`; returns the
    target values of all of `sub`'s outputs. `target` is changed in place (it is the graph
    being built); `sub` is not. Params of `sub` become params of `target` (see the module
    docstring). GraphError when the inputs' count or types do not match `sub`'s inputs."""
    return inline_graph(target, sub, inputs)


def inline_subgraph_into(target: Graph, sub: Graph, inputs: Sequence[Value]) -> Value:
    """`inline_subgraph_into_outputs`, returning only the first output of `sub`."""
    return inline_subgraph_into_outputs(target, sub, inputs)[0]


def _check_bounded(node: Node, g: Graph) -> None:
    if isinstance(node.op, While) and node.op.max_iterations is None:
        raise PassError(f"cannot lower {node.describe()} in graph {g.name!r}: the while loop has "
                        f"no max_iterations, so it cannot be unrolled; {UNBOUNDED_LOOP_FIX}")


def _fields(op: If | While) -> tuple[str, str]:
    return ("then_graph", "else_graph") if isinstance(op, If) else ("cond_graph", "body_graph")


def _holds(op: If | While, kinds: frozenset[str]) -> bool:
    """Whether a body of `op`, at any depth, holds a node of `kinds`."""
    return any(n.op.kind in kinds or (n.op.kind in CONTROL_KINDS and _holds(n.op, kinds))
               for f in _fields(op) for n in getattr(op, f).nodes)


def _lower_bodies(op: If | While, kinds: frozenset[str]) -> If | While:
    """`op` with the control flow of `kinds` inside its bodies lowered first."""
    fields = _fields(op)
    bodies = {f: lower_control_flow(getattr(op, f), kinds) for f in fields}
    if all(bodies[f] is getattr(op, f) for f in fields):
        return op
    return dataclasses.replace(op, **bodies)


def _builder(kinds: frozenset[str]) -> Callable:
    def build(new: Graph, node: Node, ins: list[Value], old: Graph):
        _check_bounded(node, old)
        op = _lower_bodies(node.op, kinds)
        return op.lower_into(new, ins, reserved_names=old._names, outer_weights=old.weights,
                             provenance=node.provenance)

    return build


def lower_control_flow(g: Graph, kinds: frozenset[str] = CONTROL_KINDS) -> Graph:
    """`g` with every node whose kind is in `kinds` ("if", "while") lowered, bodies included:
    one of the other kind stays, with those inside its bodies lowered. Returns `g` itself when
    there is none; the input graph is never changed."""
    pick_build = _builder(kinds)

    def keep(new: Graph, node: Node, ins: list[Value], old: Graph):
        name = node.name if node.name is not None and node.name not in new._names else None
        return new.add_node(_lower_bodies(node.op, kinds), ins, name=name,
                            provenance=node.provenance)

    def pick(node: Node, graph: Graph):
        if node.op.kind in kinds:
            return pick_build
        return keep if node.op.kind in CONTROL_KINDS and _holds(node.op, kinds) else None

    if not any(pick(n, g) for n in g.nodes):
        return g
    return replace_nodes(g, pick)


def inline_if(g: Graph) -> Graph:
    """`g` with every `if` replaced by its two branches and a `where` per output (ifs inside
    the branches and inside loop bodies too). Loops are left alone. The input graph is never
    changed."""
    return lower_control_flow(g, frozenset({If.kind}))


def unroll_while(g: Graph) -> Graph:
    """`g` with every `while` unrolled to `max_iterations` guarded steps (loops inside the
    bodies and inside `if` branches too); `if` nodes are left alone. PassError naming the
    node for a loop without max_iterations. The input graph is never changed."""
    return lower_control_flow(g, frozenset({While.kind}))


LOWER_CONTROL_FLOW = Lowering(
    "LowerControlFlow", CONTROL_KINDS, _builder(CONTROL_KINDS),
    doc="if -> both branches inlined + where; while -> max_iterations guarded steps "
        "(where(active, body_out, carried))")
LowerControlFlow = register_lowering(LOWER_CONTROL_FLOW)
