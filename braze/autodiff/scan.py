"""Reverse mode for scans: the VJP of a body as a graph (`body_vjp_graph`), the carries a scan
enters each step with (`carries_before_steps`), the backward scan that runs the body's VJP in
reverse order (`scan_backward`), and `convert_scans_for_ad`, the pre-autodiff pass that turns a
checkpointed scan into a scan over segments.

Checkpointing: a scan of `length` steps with `num_checkpoints` K becomes an outer scan of K steps
whose body runs an inner scan of `length / K` steps. Reverse mode keeps the K carries the outer
scan enters its steps with; the VJP of the outer body contains the inner scan's VJP, which
recomputes that segment's carries from its checkpoint. Memory: K + length / K carries instead of
length."""
from __future__ import annotations

from collections.abc import Sequence

from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.op import Value
from ..ir.ops._body import inline_body
from ..ir.ops.scan import Scan
from ..ir.shapes import Shape
from ..passes.cleanup import dead_code_elimination
from ..passes.expand import replace_nodes
from .emit import add_optional, is_float, zeros

__all__ = ["body_vjp_graph", "carries_before_steps", "scan_backward", "convert_scans_for_ad"]


def _inputs_like(out: Graph, body: Graph) -> list[Value]:
    return [out.input(body.nodes[i].op.name, body.nodes[i].op.shape) for i in body.input_ids]


def body_vjp_graph(body: Graph) -> Graph:
    """A graph taking (body inputs..., one cotangent per body output) and returning one
    cotangent per body input (zeros where the outputs do not depend on it, or it is not
    float)."""
    from .prepare import prepare_graph_for_ad
    from .reverse import backpropagate, clone_into

    prep = prepare_graph_for_ad(body)
    b = Graph(f"{body.name}_vjp", record_provenance=False)
    vmap = clone_into(b, prep)
    ins = [vmap[Value(i)] for i in prep.input_ids]
    cts = [b.input(f"d_out{k}", prep.shape_of(v)) for k, v in enumerate(prep.outputs)]
    seeds: dict[Value, Value] = {}
    for v, ct in zip(prep.outputs, cts):
        if is_float(prep.shape_of(v)):
            seeds[v] = add_optional(b, seeds.get(v), ct)
    found = backpropagate(prep.nodes, b, vmap.__getitem__, seeds, set(prep.input_ids))
    b.set_outputs([found[Value(i)] if Value(i) in found else zeros(b, b.shape_of(x))
                   for i, x in zip(prep.input_ids, ins)])
    return dead_code_elimination(b)[0]


def carries_before_steps(b: Graph, op: Scan, ins: Sequence[Value]) -> list[Value]:
    """Per carry, the values it enters each step with, stacked `[length, *carry]` (a scan
    whose per-step outputs are its input carries)."""
    nc = op.n_carry
    body = Graph(f"{op.body.name}_carries", record_provenance=False)
    xs = _inputs_like(body, op.body)
    res = inline_body(body, op.body, xs)
    body.set_outputs([*res[:nc], *xs[:nc]])
    out = b.scan_general(body, ins[:nc], op.length, bcasts=ins[nc:nc + op.n_bcast],
                         xs=ins[nc + op.n_bcast:], reverse=op.reverse)
    return list(out[nc:])


def _backward_body(op: Scan, types: Sequence[Shape]) -> Graph:
    """Body of the backward scan. Inputs: (d carries..., d bcast sums..., bcasts..., carries
    before the step..., x_t..., d y_t...); outputs: (d carries before the step..., d bcast sums
    + this step's..., d x_t...)."""
    nc, nb = op.n_carry, op.n_bcast
    vjp = body_vjp_graph(op.body)
    g = Graph(f"{op.body.name}_backward", record_provenance=False)
    vals = [g.input(f"in{i}", t) for i, t in enumerate(types)]
    d_c, d_acc = vals[:nc], vals[nc:nc + nb]
    rest = vals[nc + nb:]
    bcasts, carries = rest[:nb], rest[nb:nb + nc]
    x_t, d_y = rest[nb + nc:len(rest) - op.n_ys], rest[len(rest) - op.n_ys:]
    got = inline_body(g, vjp, [*carries, *bcasts, *x_t, *d_c, *d_y])
    d_bc = [g.add(a, d) for a, d in zip(d_acc, got[nc:nc + nb])]
    g.set_outputs([*got[:nc], *d_bc, *got[nc + nb:]])
    return g


def scan_backward(b: Graph, node: Node, ins: Sequence[Value], cts: Sequence[Value | None]
                  ) -> list[Value]:
    """Cotangents of every input of scan `node` (reading `ins` in `b`) for output cotangents
    `cts`: a scan in the opposite direction over the body's VJP, carrying the carries'
    cotangents and the running sums of the broadcast inputs' cotangents."""
    op: Scan = node.op
    nc, nb = op.n_carry, op.n_bcast
    filled = [c if c is not None else zeros(b, t) for c, t in zip(cts, node.outputs)]
    bcasts, xs = list(ins[nc:nc + nb]), list(ins[nc + nb:])
    before = carries_before_steps(b, op, ins)
    carries0 = [*filled[:nc], *(zeros(b, b.shape_of(v)) for v in bcasts)]
    step_xs = [*before, *xs, *filled[nc:]]
    types = [b.shape_of(v) for v in carries0 + bcasts]
    types += [Shape(b.shape_of(v).dims[1:], b.shape_of(v).dtype) for v in step_xs]
    body = _backward_body(op, types)
    out = b.scan_general(body, carries0, op.length, bcasts=bcasts, xs=step_xs,
                         reverse=not op.reverse)
    return list(out)


def _segmented(new: Graph, node: Node, ins: list[Value], old: Graph):
    """A checkpointed scan as an outer scan over K segments of an inner scan (see module
    docstring)."""
    op: Scan = node.op
    k, nc, nb = op.num_checkpoints, op.n_carry, op.n_bcast
    seg = op.length // k
    inner = Scan(op.body, seg, nc, nb, op.reverse)
    outer = Graph(f"{op.body.name}_segment", record_provenance=False)
    head = [outer.input(f"in{i}", new.shape_of(v)) for i, v in enumerate(ins[:nc + nb])]
    xs_seg = [new.reshape(x, (k, seg, *new.shape_of(x).dims[1:])) for x in ins[nc + nb:]]
    seg_in = [outer.input(f"in{nc + nb + i}", Shape(new.shape_of(x).dims[1:],
                                                     new.shape_of(x).dtype))
              for i, x in enumerate(xs_seg)]
    outer.set_outputs(list(outer.add_node(inner, (*head, *seg_in))))
    res = new.scan_general(outer, ins[:nc], k, bcasts=ins[nc:nc + nb], xs=xs_seg,
                           reverse=op.reverse)
    ys = [new.reshape(y, (op.length, *new.shape_of(y).dims[2:])) for y in res[nc:]]
    vals = [*res[:nc], *ys]
    return vals[0] if len(vals) == 1 else tuple(vals)


def convert_scans_for_ad(g: Graph) -> Graph:
    """A new graph in which every checkpointed scan (num_checkpoints > 0) is a scan over
    segments; `g` itself when it has none."""
    if not any(isinstance(n.op, Scan) and n.op.num_checkpoints for n in g.nodes):
        return g
    return replace_nodes(g, lambda node, graph: _segmented if isinstance(node.op, Scan)
                         and node.op.num_checkpoints else None)
