"""Reverse mode for `if` and `while`. The shared decomposition (both branches and a `where`; a
loop unrolled into `where`-guarded steps) multiplies the derivative of the branch or step that
did not run by zero, and 0 * inf is NaN: `cond(x > 0, log(x), 2 x)` at x = 0, a step past the
loop's end whose body divides by zero. So autodiff keeps an `if` (its VJP rule is an `if` over
the branches' VJPs, braze/autodiff/rules/control.py) and unrolls a bounded `while` into steps
`carried = if(active, body, identity)(carried)`: only what ran is differentiated.

Bodies that hold params (at any depth) first get them lifted out (`lift_body_params`): each
body param becomes a param of the graph (named and shared as inlining names them, so `wrt` can
name it), passed in as one more operand (an `if`) or carried value (a `while`, unchanged by
the body). The op keeps its own VJP rule, so the branch or step that did not run is not
differentiated there either."""
from __future__ import annotations

from ..ir.graph import Graph
from ..ir.inline import inline_graph
from ..ir.node import Node
from ..ir.op import Op, Value
from ..ir.ops._body import single
from ..ir.ops.control import If, While
from ..passes.expand import replace_nodes

__all__ = ["holds_params", "guard_loops_for_ad", "lift_body_params"]


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


def _params_of(body: Graph) -> Graph:
    """A graph whose outputs are `body`'s params (in `param_ids` order), with their values."""
    only = Graph(f"{body.name}_params", record_provenance=False)
    outs = []
    for i in body.param_ids:
        op = body.nodes[i].op
        outs.append(only.param(op.name, op.shape))
        if op.name in body.weights:
            only.weights[op.name] = body.weights[op.name]
    only.set_outputs(outs)
    return only


def _taking_params(body: Graph, slots: list[tuple[Graph, int]], passes_through: bool) -> Graph:
    """`body` with one more trailing input per slot (a body and one of its param ids); its own
    params read their slot's input. `passes_through`: the slots' inputs are also returned, after
    the body's outputs (a loop body carrying them)."""
    new = Graph(body.name, record_provenance=False)
    env: dict[Value, Value] = {}
    for i in body.input_ids:
        env[Value(i)] = new.clone_node(body.nodes[i], [], body)[0]
    taken = {body.nodes[i].op.name for i in body.input_ids}
    extra = []
    for k, (owner, pid) in enumerate(slots):
        op = owner.nodes[pid].op
        name = f"{op.name}_lifted{k}"
        while name in taken:
            name += "_"
        taken.add(name)
        extra.append(new.input(name, op.shape))
        if owner is body:
            env[Value(pid)] = extra[-1]
    for node in body.nodes:
        if node.value in env:  # an input, or a param now read from its slot
            continue
        env.update(zip(node.values, new.clone_node(node, [env[v] for v in node.inputs], body)))
    new.set_outputs([env[v] for v in body.outputs] + (extra if passes_through else []))
    return new


def _lifted(new: Graph, node: Node, ins: list[Value], old: Graph):
    op = node.op
    bodies = list(_bodies(op))
    lifted = [lift_body_params(b) for b in bodies]
    slots = [(b, i) for b in lifted for i in b.param_ids]
    values = [v for b in lifted if b.param_ids
              for v in inline_graph(new, _params_of(b), [], reserved_names=old._names,
                                    outer_weights=old.weights)]
    if isinstance(op, If):
        then_g, else_g = (_taking_params(b, slots, False) for b in lifted)
        return new.cond(ins[0], then_g, else_g, *ins[1:], *values)
    cond_g, body_g = (_taking_params(b, slots, b is lifted[1]) for b in lifted)
    out = new.while_loop(cond_g, body_g, *ins, *values, max_iterations=op.max_iterations)
    return tuple(out[:len(node.outputs)])


def lift_body_params(g: Graph) -> Graph:
    """`g` with the params of every `if` / `while` body (at any depth) lifted out: params of
    `g`, named as inlining names them, passed in as operands or carried values (see the module
    docstring); `g` itself when no body holds a param."""
    def pick(node: Node, graph: Graph):
        return _lifted if isinstance(node.op, (If, While)) and holds_params(node.op) else None

    if not any(pick(n, g) for n in g.nodes):
        return g
    return replace_nodes(g, pick)
