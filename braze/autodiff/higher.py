"""Higher-order forms built on the two modes: `hvp` (forward over reverse), `nth_order_grad`
(repeated reverse mode, scalar in and out) and `directional_nth_grad` (d^n/dt^n f(x + t v) at
t = 0, for vector inputs). They work because every rule emits differentiable ops."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from ..errors import AutodiffError
from ..ir.graph import Graph
from ..ir.op import Value
from ..ir.ops.io import Input, Param
from ..passes.cleanup import dead_code_elimination
from .forward import jvp, tangent_name
from .reverse import clone_into, grad_with_loss, source_value

__all__ = ["hvp", "nth_order_grad", "directional_nth_grad"]


def _with_outputs(g: Graph, outs: Sequence[Value]) -> Graph:
    g.set_outputs(list(outs))
    return dead_code_elimination(g)[0]


def hvp(g: Graph, wrt: Sequence[str] | str,
        unused: Literal["zeros", "error"] = "zeros") -> Graph:
    """Hessian-vector products of g's scalar loss (first output): the new graph has inputs
    `tangent_<name>` (the vector, one per name in `wrt`) and outputs H v, one per name in
    `wrt` order (forward mode over the reverse-mode gradient graph). A `wrt` entry the loss
    does not depend on gets zeros (`unused="error"` raises instead, as in grad_with_loss)."""
    names = [wrt] if isinstance(wrt, str) else list(wrt)
    grads = grad_with_loss(g, names, unused=unused)
    kept = {node.op.name for node in grads.nodes if isinstance(node.op, (Input, Param))}
    forward = jvp(grads, [n for n in names if n in kept])
    for name in names:  # a param the loss ignores left the gradient graph (its H v is 0)
        if name not in kept:  # but the caller still feeds its tangent
            forward.input(tangent_name(name), g.shape_of(source_value(g, name)))
    outs = forward.outputs[-len(names):]
    return _with_outputs(forward, outs)


def _scalar_check(g: Graph, v: Value, what: str) -> None:
    shape = g.shape_of(v)
    if any(d != 1 for d in shape.dims):
        raise AutodiffError(f"nth_order_grad needs a scalar {what}, got {shape} "
                            f"({g.node(v).describe()}); use directional_nth_grad for tensors")


def nth_order_grad(g: Graph, wrt: str, order: int) -> Graph:
    """The `order`-th derivative of g's first output (a scalar) with respect to the scalar
    input or param `wrt`: a graph with the same inputs and that one output."""
    if order < 0:
        raise AutodiffError(f"nth_order_grad order must be >= 0, got {order}")
    _scalar_check(g, source_value(g, wrt), "input")
    if not g.outputs:
        raise AutodiffError(f"graph {g.name!r} has no outputs")
    _scalar_check(g, g.outputs[0], "output")
    cur = Graph(f"{g.name}_d0", record_provenance=False)
    vmap = clone_into(cur, g)
    cur = _with_outputs(cur, [vmap[g.outputs[0]]])
    for k in range(order):
        step = grad_with_loss(cur, [wrt])
        step.name = f"{g.name}_d{k + 1}"
        cur = _with_outputs(step, step.outputs[1:])
    return cur


def directional_nth_grad(g: Graph, wrt: str, order: int) -> Graph:
    """d^order / dt^order of g's scalar first output at x + t v, t = 0, where x is the input
    or param `wrt` (any shape) and v the new input `tangent_<wrt>`: repeated reverse mode on
    <grad, v>."""
    if order < 0:
        raise AutodiffError(f"directional_nth_grad order must be >= 0, got {order}")
    if not g.outputs:
        raise AutodiffError(f"graph {g.name!r} has no outputs")
    _scalar_check(g, g.outputs[0], "output")
    x = source_value(g, wrt)
    cur = Graph(f"{g.name}_dir0", record_provenance=False)
    vmap = clone_into(cur, g)
    cur.input(tangent_name(wrt), g.shape_of(x))
    cur = _with_outputs(cur, [vmap[g.outputs[0]]])
    for k in range(order):
        step = grad_with_loss(cur, [wrt])
        step.name = f"{g.name}_dir{k + 1}"
        v = source_value(step, tangent_name(wrt))
        cur = _with_outputs(step, [step.sum(step.mul(step.outputs[1], v))])
    return cur
