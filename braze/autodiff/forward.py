"""Forward mode: `jvp` pushes tangents through a graph node by node with each op's JVP rule.

An op with a VJP rule but no JVP rule gets its JVP by transposing the VJP: the VJP is linear in
the cotangent, so running reverse mode over the nodes the VJP rule built (seeded with the input
tangents) gives J t. Explicit JVP rules exist where they are shorter (elementwise, products,
data movement, reductions)."""
from __future__ import annotations

from collections.abc import Sequence

from ..errors import AutodiffError
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.op import Value
from ..passes.cleanup import dead_code_elimination
from .emit import add_optional, is_float, zeros
from .prepare import prepare_graph_for_ad
from .registry import get_jvp, get_vjp, non_differentiable_reason
from .reverse import backpropagate, clone_into, source_value

__all__ = ["jvp", "push_tangents", "tangent_name"]


def tangent_name(name: str) -> str:
    """The name of the input that carries the tangent (or direction) of `name`."""
    return f"tangent_{name}"


def _transposed_vjp(b: Graph, node: Node, ins: Sequence[Value], outs: Sequence[Value],
                    tangents: Sequence[Value | None]) -> list[Value | None]:
    """J t for a node with only a VJP rule: reverse mode through its (linear) VJP."""
    rule = get_vjp(node.op)
    start = len(b.nodes)
    probes = [zeros(b, s) if is_float(s) else None for s in node.outputs]
    in_cts = rule(b, node, ins, outs, probes)
    built = b.nodes[start:]
    seeds: dict[Value, Value] = {}
    for ct, t in zip(in_cts, tangents):
        if ct is not None and t is not None:
            seeds[ct] = add_optional(b, seeds.get(ct), t)
    probe_ids = {p.node for p in probes if p is not None}
    cts = backpropagate(built, b, lambda v: v, seeds, probe_ids)
    return [None if p is None else cts.get(p) for p in probes]


def push_tangents(src: Graph, b: Graph, vmap: dict[Value, Value],
                  tangents: dict[Value, Value]) -> dict[Value, Value]:
    """Tangents of every value of `src` (whose nodes are already copied into `b` by `vmap`),
    given the tangents of some source values. Returns src value -> tangent in `b` (absent =
    zero)."""
    out = dict(tangents)
    for node in src.nodes:
        if node.op.source or non_differentiable_reason(node.op) is not None:
            continue
        ts = [out.get(v) for v in node.inputs]
        if all(t is None for t in ts):
            continue
        ins = [vmap[v] for v in node.inputs]
        outs = [vmap[v] for v in node.values]
        rule = get_jvp(node.op)
        if rule is not None:
            res = rule(b, node, ins, outs, ts)
        elif get_vjp(node.op) is not None:
            res = _transposed_vjp(b, node, ins, outs, ts)
        else:
            raise AutodiffError(f"{node.describe()}: no JVP or VJP rule for op "
                                f"{node.op.kind!r}; run bz.prepare_graph_for_ad first")
        for v, t, shape in zip(node.values, res, node.outputs):
            if t is None or not is_float(shape):
                continue
            if b.shape_of(t).dims != shape.dims:
                raise AutodiffError(f"{node.describe()}: the JVP of {node.op.kind!r} gave a "
                                    f"tangent of dims {b.shape_of(t).dims} for an output of "
                                    f"dims {shape.dims}")
            out[v] = t
    return out


def jvp(g: Graph, tangent_for: Sequence[str] | str) -> Graph:
    """A new graph computing g's outputs and their tangents: outputs `[primals..., tangents...]`
    (one tangent per output, zeros where an output does not depend on the tangents), with one
    new input `tangent_<name>` (same type as `<name>`) per input or param in `tangent_for`."""
    names = [tangent_for] if isinstance(tangent_for, str) else list(tangent_for)
    prep = prepare_graph_for_ad(g)
    b = Graph(f"{g.name}_jvp", record_provenance=False)
    vmap = clone_into(b, prep)
    seeds: dict[Value, Value] = {}
    for name in names:
        v = source_value(prep, name)
        shape = prep.shape_of(v)
        if not is_float(shape):
            raise AutodiffError(f"cannot take a tangent for {name!r}: it is {shape}, "
                                "not a float tensor")
        if any(getattr(n.op, "name", None) == tangent_name(name) for n in prep.nodes):
            raise AutodiffError(f"graph {g.name!r} already has a value named "
                                f"{tangent_name(name)!r}; rename it before calling jvp")
        seeds[v] = b.input(tangent_name(name), shape)
    tans = push_tangents(prep, b, vmap, seeds)
    primals = [vmap[v] for v in prep.outputs]
    tangents = [tans[v] if v in tans else zeros(b, prep.shape_of(v)) for v in prep.outputs]
    b.set_outputs(primals + tangents)
    return dead_code_elimination(b)[0]
