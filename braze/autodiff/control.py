"""Reverse mode for `if` and `while`. The shared decomposition (both branches and a `where`; a
loop unrolled into `where`-guarded steps) multiplies the derivative of the branch or step that
did not run by zero, and 0 * inf is NaN: `cond(x > 0, log(x), 2 x)` at x = 0, a step past the
loop's end whose body divides by zero. So autodiff keeps an `if` (its VJP rule is an `if` over
the branches' VJPs, braze/autodiff/rules/control.py) and unrolls a bounded `while` into steps
`carried = if(active, body, identity)(carried)`: only what ran is differentiated.

Control flow whose bodies hold params (at any depth) is differentiated through the shared
decomposition instead: inlined, those params become params of the graph, which `wrt` can name."""
from __future__ import annotations

from ..ir.graph import Graph
from ..ir.inline import inline_graph
from ..ir.node import Node
from ..ir.op import Op, Value
from ..ir.ops._body import single
from ..ir.ops.control import If, While
from ..passes.expand import replace_nodes

__all__ = ["holds_params", "guard_loops_for_ad"]


def _bodies(op: Op) -> tuple[Graph, ...]:
    if isinstance(op, If):
        return op.then_graph, op.else_graph
    if isinstance(op, While):
        return op.cond_graph, op.body_graph
    return ()


def holds_params(op: Op) -> bool:
    """Whether a body of control-flow `op`, at any depth, holds a param."""
    return any(g.param_ids or any(holds_params(n.op) for n in g.nodes) for g in _bodies(op))


def _identity(like: Graph) -> Graph:
    keep = Graph(f"{like.name}_done", record_provenance=False)
    keep.set_outputs([keep.input(like.nodes[i].op.name, like.nodes[i].outputs[0])
                      for i in like.input_ids])
    return keep


def _guarded_steps(new: Graph, node: Node, ins: list[Value], old: Graph):
    op: While = node.op
    if op.max_iterations is None:
        return op.lower_into(new, ins)  # the error naming the loop
    keep = _identity(op.body_graph)
    carried, active = list(ins), None
    for _ in range(op.max_iterations):
        c = inline_graph(new, op.cond_graph, carried, reserved_names=old._names,
                         outer_weights=old.weights)[0]
        active = c if active is None else new.logical_and(active, c)
        out = new.cond(active, op.body_graph, keep, *carried)
        carried = list(out) if isinstance(out, tuple) else [out]
    return single(carried)


def guard_loops_for_ad(g: Graph) -> Graph:
    """`g` with every `while` whose bodies hold no params unrolled into `if`-guarded steps (see
    the module docstring); `g` itself when there is none."""
    def pick(node: Node, graph: Graph):
        return _guarded_steps if isinstance(node.op, While) and not holds_params(node.op) \
            else None

    if not any(pick(n, g) for n in g.nodes):
        return g
    return replace_nodes(g, pick)
