"""Reverse mode: `grad_with_loss` and the cotangent walker (`backpropagate`) that forward mode
and the higher-order forms reuse.

The walker visits the nodes on a path from the wanted sources to the seeded values in reverse
topological order, calls each op's VJP rule, and sums the cotangents a value receives. Rules add
ordinary nodes, so the result is a graph like any other: it prints, verifies, fuses, compiles
and can be differentiated again."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from ..errors import AutodiffError
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.op import Value
from ..ir.ops.io import Input, Param
from ..passes.cleanup import dead_code_elimination
from .emit import add_optional, is_float, ones, zeros
from .prepare import prepare_graph_for_ad
from .registry import get_vjp, non_differentiable_reason

__all__ = ["grad_with_loss", "backpropagate", "source_value", "clone_into"]


def source_value(g: Graph, name: str) -> Value:
    """The input or param of `g` called `name`; AutodiffError listing the names otherwise."""
    for node in g.nodes:
        if isinstance(node.op, (Input, Param)) and node.op.name == name:
            return node.value
    names = [n.op.name for n in g.nodes if isinstance(n.op, (Input, Param))]
    raise AutodiffError(f"graph {g.name!r} has no input or param named {name!r}; it has "
                        f"{', '.join(map(repr, names)) or 'none'}")


def clone_into(b: Graph, g: Graph) -> dict[Value, Value]:
    """Copy every node of `g` into the empty graph `b` (inputs, params and weights included);
    returns the value map old -> new."""
    vmap: dict[Value, Value] = {}
    for node in g.nodes:
        vmap.update(zip(node.values, b.clone_node(node, [vmap[v] for v in node.inputs], g)))
    b.weights = dict(g.weights)
    return vmap


def _reaching(nodes: Sequence[Node], sources: set[int]) -> set[int]:
    """Ids of the nodes among `nodes` (topological) that depend on a node in `sources`."""
    hit = set(sources)
    for node in nodes:
        if any(v.node in hit for v in node.inputs):
            hit.add(node.id)
    return hit


def backpropagate(src_nodes: Sequence[Node], b: Graph, to_b: Callable[[Value], Value],
                  seeds: Mapping[Value, Value], sources: set[int]) -> dict[Value, Value]:
    """Cotangents of the values of `src_nodes` (a topologically ordered node list of some
    graph), built in `b`. `to_b` maps a source-graph value to its primal value in `b`; `seeds`
    maps source-graph values to their cotangents in `b`; only nodes that depend on a node id in
    `sources` are visited. Returns source value -> summed cotangent (values absent are zero)."""
    live = _reaching(src_nodes, sources)
    cts: dict[Value, Value] = dict(seeds)
    for node in reversed(src_nodes):
        if node.id not in live or node.op.source:
            continue
        out_cts = [cts.get(v) for v in node.values]
        if all(c is None for c in out_cts):
            continue
        if non_differentiable_reason(node.op) is not None:
            continue
        rule = get_vjp(node.op)
        if rule is None:
            raise AutodiffError(f"{node.describe()}: no VJP rule for op {node.op.kind!r}; run "
                                "bz.prepare_graph_for_ad first or register a rule")
        ins = [to_b(v) for v in node.inputs]
        outs = [to_b(v) for v in node.values]
        in_cts = rule(b, node, ins, outs, out_cts)
        if len(in_cts) != len(node.inputs):
            raise AutodiffError(f"{node.describe()}: the VJP rule of {node.op.kind!r} returned "
                                f"{len(in_cts)} cotangents for {len(node.inputs)} inputs")
        for v, primal, ct in zip(node.inputs, ins, in_cts):
            if ct is None or v.node not in live or not is_float(b.shape_of(primal)):
                continue
            want, got = b.shape_of(primal).dims, b.shape_of(ct).dims
            if want != got:
                raise AutodiffError(f"{node.describe()}: the VJP rule of {node.op.kind!r} gave a "
                                    f"cotangent of dims {got} for an input of dims {want}")
            cts[v] = add_optional(b, cts.get(v), ct)
    return cts


def _check_loss(g: Graph) -> Value:
    if not g.outputs:
        raise AutodiffError(f"graph {g.name!r} has no outputs; its first output is the loss")
    loss = g.outputs[0]
    shape = g.shape_of(loss)
    if any(d != 1 for d in shape.dims) or not shape.dtype.is_float:
        raise AutodiffError(f"the loss (first output of graph {g.name!r}, "
                            f"{g.node(loss).describe()}) must be a float scalar, got {shape}; "
                            "reduce it (g.sum / g.mean) first")
    return loss


def grad_with_loss(g: Graph, wrt: Sequence[str] | str, *,
                   unused: Literal["zeros", "error"] = "zeros") -> Graph:
    """A new graph whose outputs are `[loss, *grads]`: g's first output is the scalar loss and
    each grad is d loss / d `name` for the inputs or params named in `wrt` (same shapes).

    `unused="error"` raises AutodiffError naming the wrt entries the loss does not depend on;
    `"zeros"` returns zeros for them. Fused ops are unfused and composite ops without a rule
    decomposed first (`prepare_graph_for_ad`). `g` is not changed."""
    names = [wrt] if isinstance(wrt, str) else list(wrt)
    if unused not in ("zeros", "error"):
        raise AutodiffError(f"unused must be 'zeros' or 'error', got {unused!r}")
    prep = prepare_graph_for_ad(g)
    loss = _check_loss(prep)
    targets = [source_value(prep, n) for n in names]
    for n, v in zip(names, targets):
        if not is_float(prep.shape_of(v)):
            raise AutodiffError(f"cannot differentiate with respect to {n!r}: it is "
                                f"{prep.shape_of(v)}, not a float tensor")
    b = Graph(f"{g.name}_grad", record_provenance=False)
    vmap = clone_into(b, prep)
    seed = ones(b, prep.shape_of(loss))
    cts = backpropagate(prep.nodes, b, vmap.__getitem__, {loss: seed},
                        {v.node for v in targets})
    missing = [n for n, v in zip(names, targets) if v not in cts]
    if missing and unused == "error":
        raise AutodiffError(f"the loss of graph {g.name!r} does not depend on "
                            f"{', '.join(map(repr, missing))}; drop them from wrt or pass "
                            "unused='zeros'")
    grads = [cts[v] if v in cts else zeros(b, prep.shape_of(v)) for v in targets]
    b.set_outputs([vmap[loss], *grads])
    return dead_code_elimination(b)[0]

