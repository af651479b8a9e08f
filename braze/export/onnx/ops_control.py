"""Control flow to ONNX. A `while` without `max_iterations` (an imported ONNX Loop over a trip
count or condition computed from data, a loop over a symbolic length) has no unrolled form, so
it is written as an ONNX `Loop`: the condition is evaluated once before the loop, and the
Loop body runs `body_graph`, then `cond_graph` on its results. Bounded loops, `if` and `scan`
are written as their decompositions (both branches and a Where; unrolled steps).

A body is its own ONNX subgraph built by a second OnnxBuilder that shares the outer one's
taken names (ONNX wants every name unique across scopes) and reads the outer symbols' tensors
by name (a subgraph sees the outer scope)."""
from __future__ import annotations

from ...ir.dtypes import bool_, i64
from ...ir.graph import Graph
from ...ir.inline import inline_graph
from ...ir.ops.control import While
from ...ir.shapes import Shape
from .builder import OnnxBuilder, fill_tensor
from .exporter import emit_nodes, legal_for, value_info
from .registry import exporter


def _sub_builder(b: OnnxBuilder, g: Graph) -> tuple[OnnxBuilder, list[str]]:
    """A builder for body `g` and the fresh names of its inputs: symbols the outer graph
    binds are read from there, the others from the body's (renamed) inputs."""
    sub = OnnxBuilder(g, b.opset)
    sub._taken = b._taken
    renamed = {g.nodes[i].op.name: b.unique(f"{g.nodes[i].op.name}_in") for i in g.input_ids}
    own = {s: (renamed[ref[0]], *ref[1:]) for s, ref in sub._symbols.items()
           if isinstance(ref, tuple) and ref[0] in renamed}
    sub._symbols = {**own, **b._symbols}
    sub.domains = b.domains
    return sub, list(renamed.values())


def _inline(b: OnnxBuilder, g: Graph, ins: list[str], target: str) -> list[str]:
    """`g`'s nodes written into `b` with its inputs bound to `ins`; its output names."""
    legal = legal_for(g, target)
    names = dict(b.names)
    b.names.clear()
    try:
        emit_nodes(b, legal, legal.weights, target, ins)
        return [b.name(v) for v in legal.outputs]
    finally:
        b.names.clear()
        b.names.update(names)


def _subgraph(b: OnnxBuilder, g: Graph, target: str):
    """`g` as an ONNX GraphProto (fresh input names), for a Loop's body attribute."""
    from onnx import helper

    legal = legal_for(g, target)
    sub, in_names = _sub_builder(b, legal)
    inputs = emit_nodes(sub, legal, legal.weights, target, in_names)
    outputs = []
    for v in legal.outputs:
        out = sub.fresh("body_out")
        sub.op("Identity", [sub.name(v)], outputs=[out])
        outputs.append(value_info(out, legal.shape_of(v)))
    gp = helper.make_graph(sub.nodes, sub.fresh(g.name), inputs, outputs)
    for name, arr in sub.initializers:
        fill_tensor(gp.initializer.add(), name, arr)
    return gp


def _loop_body(op: While, carried: list[Shape]) -> Graph:
    """(iteration, cond, carried...) -> (cond_graph(new), new...), new = body_graph(carried)."""
    g = Graph(f"{op.body_graph.name}_loop", record_provenance=False)
    g.input("iteration", Shape((), i64))
    g.input("cond", Shape((), bool_))
    xs = [g.input(f"carried{i}", s) for i, s in enumerate(carried)]
    new = inline_graph(g, op.body_graph, xs)
    more = inline_graph(g, op.cond_graph, new)[0]
    g.set_outputs([more, *new])
    return g


@exporter(While, accept=lambda node, graph, target: node.op.max_iterations is None)
def _while(b: OnnxBuilder, node, ins: list[str], target: str) -> list[str]:
    op = node.op
    (first,) = _inline(b, op.cond_graph, ins, target)
    body = _subgraph(b, _loop_body(op, [s for s in node.outputs]), target)
    return b.op("Loop", ["", first, *ins], n_out=len(ins), body=body, name_hint="loop")
