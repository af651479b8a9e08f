"""ONNX control flow: If, Loop and Scan, onto braze's `if`, `while` and `scan` ops.

Subgraphs become closed body graphs (subgraphs.py): the outer values they capture by name are
extra operands, captured compile-time values stay known inside.

- `If` whose condition is known at import (a constant, or folded from static shapes: torch
  exports branch on shapes) imports only the taken branch, into the graph in place of the
  node; its nodes' provenance names the If, the branch and why. A condition from data, or from
  symbolic dims the importer cannot decide for every size, becomes `g.cond`.
- `Loop` whose condition input is absent / true and whose body returns a condition known true
  is counted: M static gives a `scan` of M steps (no node for M = 0), M symbolic a `while`
  that writes row t of each scan output. Any other loop is a `while` over (iteration, cond,
  carried values, captures), bounded by M when M is static; its scan outputs would have a
  data-dependent length, which braze cannot represent (refused, naming the node).
- `Scan` (opset 9+): a `scan` over a static length, a `while` over a symbolic one; input /
  output axes are moved to the front and back, reverse directions flip the sequence."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ....ir.dtypes import bool_, i64
from ....ir.graph import Graph
from ....ir.inline import inline_graph
from ....ir.op import Value
from ....ir.shapes import Shape
from ....ir.symbolic import SymDim
from ..context import Body, ImportContext, NodeView, Tensor, converter
from ..known import Known

_TRUE = Known(np.array(True), bool_)


def _scalar(g: Graph, v: Value) -> Value:
    """A one-element tensor (ONNX allows `[1]` conditions) as a scalar."""
    return v if g.shape_of(v).rank == 0 else g.reshape(v, ())


def _known_true(k: Known | None) -> bool:
    return k is not None and not k.symbolic and k.array.size == 1 and bool(k.array.reshape(-1)[0])


def _outputs(ctx: ImportContext, tensors: Sequence[Tensor]) -> list:
    return [t.known if t.known is not None else t.value for t in tensors]


# -- If -------------------------------------------------------------------------------------------
@converter("If")
def if_(ctx: ImportContext, node: NodeView):
    cond = ctx.tensor(node, 0)
    k = cond.known
    if k is not None and not k.symbolic:
        if k.array.size != 1:
            raise ctx.fail(node, f"the condition must hold one element, got shape {k.array.shape}")
        taken = bool(k.array.reshape(-1)[0])
        branch = "then_branch" if taken else "else_branch"
        return _outputs(ctx, ctx.inline(node, branch, f"condition {taken} at import"))
    g = ctx.g
    pred = _scalar(g, ctx.value(node, 0))
    if ctx.dtype(pred) != bool_:
        raise ctx.fail(node, f"the condition must be bool, got {ctx.dtype(pred)}")
    name = node.name or node.outputs[0]
    then = ctx.body(node, "then_branch", [], f"{name}_then")
    other = ctx.body(node, "else_branch", [], f"{name}_else")
    _check_branches(ctx, node, then, other)
    out = g.cond(pred, then.graph, other.graph, *then.captures)
    return [out] if isinstance(out, Value) else list(out)


def _check_branches(ctx: ImportContext, node: NodeView, then: Body, other: Body) -> None:
    """A clear error when the branches' outputs differ in count or type (braze's `if` returns
    one type per output)."""
    a = [then.graph.shape_of(v) for v in then.graph.outputs]
    b = [other.graph.shape_of(v) for v in other.graph.outputs]
    if len(a) != len(b):
        raise ctx.fail(node, f"then_branch returns {len(a)} values, else_branch {len(b)}")
    for i, (x, y) in enumerate(zip(a, b)):
        if x.dtype != y.dtype or x.dims != y.dims:
            raise ctx.fail(node, f"output {i} ({node.outputs[i]!r}) is {x} in then_branch but "
                                 f"{y} in else_branch; braze's `if` returns one type per output "
                                 "(a condition on the input sizes folds when the sizes are "
                                 "static: pass input_shapes= to import_onnx)")


# -- Loop -----------------------------------------------------------------------------------------
@converter("Loop")
def loop(ctx: ImportContext, node: NodeView):
    g = ctx.g
    m = ctx.tensor(node, 0) if ctx.has(node, 0) else None
    c0 = ctx.tensor(node, 1) if ctx.has(node, 1) else None
    init = [ctx.value(node, 2 + i) for i in range(len(node.inputs) - 2)]
    types = [g.shape_of(v) for v in init]
    name = node.name or node.outputs[0]
    trip = None
    if m is not None and m.known is not None:
        (trip,) = ctx.ints(node, 0, "trip count M")
    if c0 is not None and c0.known is not None and not _known_true(c0.known):
        body = ctx.body(node, "body", [Shape((), i64), c0.known, *types], f"{name}_body")
        steps = _counted_body(body.graph, len(init))  # false at the first check: no iteration
        return _counted(ctx, node, steps, 0, init, body.captures, uses_counter=True)
    if c0 is None or _known_true(c0.known):
        body = ctx.body(node, "body", [Shape((), i64), _TRUE, *types], f"{name}_body")
        if _known_true(body.known_outputs[0]):  # a counted loop: M iterations
            if m is None:
                raise ctx.fail(node, "the loop has no trip count and its condition is always "
                                     "true: it never ends")
            steps = _counted_body(body.graph, len(init))
            if trip is not None:
                return _counted(ctx, node, steps, trip, init, body.captures, uses_counter=True)
    body = ctx.body(node, "body", [Shape((), i64), Shape((), bool_), *types], f"{name}_body")
    n_scan = len(body.graph.outputs) - 1 - len(init)
    if n_scan:
        raise ctx.fail(node, f"its {n_scan} scan output(s) have a length computed from data at "
                             "run time (the loop's condition or trip count), which braze cannot "
                             "represent: braze needs the length at import time. Export the loop "
                             "with a static (or shape-derived) trip count and a constant-true "
                             "condition, or fix the sizes it reads with input_shapes= to "
                             "import_onnx")
    bound = trip if isinstance(trip, int) else None
    m_value = None if m is None or trip is not None else _scalar(g, ctx.value(node, 0))
    c_value = g.constant(True, bool_) if c0 is None else _scalar(g, ctx.value(node, 1))
    return _while(g, name, body, init, trip, m_value, c_value, bound)


def _counted_body(body: Graph, n_carried: int) -> Graph:
    """A Loop body (iteration, carried..., captures...) -> (cond, carried..., scans...) with
    its (always true) cond output dropped."""
    out = Graph(body.name, record_provenance=False)
    ins = [out.input(body.nodes[i].op.name, body.nodes[i].outputs[0]) for i in body.input_ids]
    res = inline_graph(out, body, ins)
    out.set_outputs(res[1:])
    return out


def _while(g: Graph, name: str, body: Body, init: list[Value], trip, m_value: Value | None,
           c_value: Value, bound: int | None) -> list[Value]:
    """A Loop as `while` over (iteration, cond, carried..., captures..., [M])."""
    n = len(init)
    carried = [g.constant(0, i64), c_value, *init, *body.captures]
    if m_value is not None:
        carried.append(g.cast(m_value, i64))
    types = [g.shape_of(v) for v in carried]

    cond = Graph(f"{name}_more", record_provenance=False)
    c_in = [cond.input(f"in{i}", s) for i, s in enumerate(types)]
    more = c_in[1]
    if trip is not None or m_value is not None:
        limit = c_in[-1] if m_value is not None else \
            cond.sym_const((SymDim.of(trip).to_dim(),), (), i64)
        more = cond.logical_and(more, cond.lt(c_in[0], limit))
    cond.set_outputs([more])

    step = Graph(f"{name}_step", record_provenance=False)
    ins = [step.input(f"in{i}", s) for i, s in enumerate(types)]
    res = inline_graph(step, body.graph, ins[:2 + n + len(body.captures)])
    step.set_outputs([step.add(ins[0], 1), _scalar(step, res[0]), *res[1:1 + n],
                      *ins[2 + n:]])
    out = g.while_loop(cond, step, *carried, max_iterations=bound)
    return list(out[2:2 + n])


# -- counted loops (Loop with a trip count only, Scan) --------------------------------------------
def _counted(ctx: ImportContext, node: NodeView, steps: Graph, length, carries: list[Value],
             bcasts: list[Value], xs: Sequence[Value] = (), x_reverse: Sequence[bool] = (),
             y_reverse: Sequence[bool] | None = None, uses_counter: bool = False
             ) -> list[Value]:
    """(final carries..., ys stacked `[length, ...]`) of `steps`: (counter if `uses_counter`,
    carries..., x slices..., bcasts...) -> (carries..., y_t...). `xs` are `[length, ...]`;
    a reversed x is read from its end, a reversed y is written from its end."""
    g = ctx.g
    n = len(carries)
    y_types = [steps.shape_of(v) for v in steps.outputs[n:]]
    length = SymDim.of(length).to_dim()
    y_reverse = list(y_reverse) if y_reverse is not None else [False] * len(y_types)
    if isinstance(length, int) and length == 0:
        for s in y_types:
            if any(not isinstance(d, int) for d in s.dims):
                raise ctx.fail(node, f"a zero-trip loop's scan output is {s}, symbolic; pass "
                                     "input_shapes= to import_onnx")
        return [*carries, *(g.constant(np.zeros((0, *s.dims), s.dtype.np), s.dtype)
                            for s in y_types)]
    if isinstance(length, int):
        return _scan(g, steps, length, carries, bcasts, xs, x_reverse, y_reverse, uses_counter)
    return _symbolic_scan(g, steps, length, carries, bcasts, xs, x_reverse, y_reverse,
                          uses_counter)


def _flip(g: Graph, x: Value, length: int) -> Value:
    return g.gather(x, g.constant(np.arange(length - 1, -1, -1, dtype=np.int64), i64), 0)


def _scan(g: Graph, steps: Graph, length: int, carries, bcasts, xs, x_reverse, y_reverse,
          uses_counter: bool) -> list[Value]:
    """A braze `scan`: carries (counter, carries...), bcasts whole, xs row by row."""
    n = len(carries)
    xs = [_flip(g, x, length) if r else x for x, r in zip(xs, x_reverse)]
    body = Graph(steps.name, record_provenance=False)
    t = body.input("iteration", Shape((), i64))
    c_in = [body.input(f"carry{i}", g.shape_of(v)) for i, v in enumerate(carries)]
    b_in = [body.input(f"read{i}", g.shape_of(v)) for i, v in enumerate(bcasts)]
    x_in = [body.input(f"x{i}", Shape(g.shape_of(v).dims[1:], g.shape_of(v).dtype))
            for i, v in enumerate(xs)]
    res = inline_graph(body, steps, [*([t] if uses_counter else []), *c_in, *x_in, *b_in])
    body.set_outputs([body.add(t, 1), *res])
    out = g.scan_general(body, [g.constant(0, i64), *carries], length, bcasts=bcasts, xs=xs)
    out = list(out)[1:]
    ys = [_flip(g, y, length) if r else y for y, r in zip(out[n:], y_reverse)]
    return [*out[:n], *ys]


def _symbolic_scan(g: Graph, steps: Graph, length, carries, bcasts, xs, x_reverse, y_reverse,
                   uses_counter: bool) -> list[Value]:
    """A `while` over a symbolic length: carried (t, carries..., ys so far..., xs..., bcasts...);
    step t reads row t of each x (row length-1-t reversed) and writes row t of each y."""
    n, nx = len(carries), len(xs)
    y_types = [steps.shape_of(v) for v in steps.outputs[n:]]
    ys0 = [g.expand(g.constant(np.zeros((), s.dtype.np), s.dtype), (length, *s.dims))
           for s in y_types]
    carried = [g.constant(0, i64), *carries, *ys0, *xs, *bcasts]
    types = [g.shape_of(v) for v in carried]
    last = (SymDim.of(length) - 1).to_dim()

    cond = Graph(f"{steps.name}_more", record_provenance=False)
    c_in = [cond.input(f"in{i}", s) for i, s in enumerate(types)]
    cond.set_outputs([cond.lt(c_in[0], cond.sym_const((length,), (), i64))])

    b = Graph(f"{steps.name}_step", record_provenance=False)
    ins = [b.input(f"in{i}", s) for i, s in enumerate(types)]
    t = ins[0]
    back = b.sub(b.sym_const((last,), (), i64), t)
    ny = len(y_types)
    x_ins = ins[1 + n + ny:1 + n + ny + nx]
    x_t = [b.gather(x, back if r else t, 0) for x, r in zip(x_ins, x_reverse)]
    res = inline_graph(b, steps, [*([t] if uses_counter else []), *ins[1:1 + n], *x_t,
                                  *ins[1 + n + ny + nx:]])
    new_ys = []
    for y_t, buf, r in zip(res[n:], ins[1 + n:1 + n + ny], y_reverse):
        rank = len(b.shape_of(buf).dims)
        rows = b.reshape(b.arange(length, 0, 1, i64), (length, *([1] * (rank - 1))))
        new_ys.append(b.where(b.eq(rows, back if r else t), b.unsqueeze(y_t, 0), buf))
    b.set_outputs([b.add(t, 1), *res[:n], *new_ys, *ins[1 + n + ny:]])
    out = g.while_loop(cond, b, *carried)
    return list(out[1:1 + n + ny])


# -- Scan -----------------------------------------------------------------------------------------
def _axis(ctx: ImportContext, node: NodeView, a: int, rank: int, what: str) -> int:
    if not -rank <= a < rank:
        raise ctx.fail(node, f"{what} {a} is out of range for rank {rank}")
    return a % rank


def _to_front(g: Graph, x: Value, axis: int) -> Value:
    if axis == 0:
        return x
    rank = len(g.shape_of(x).dims)
    return g.transpose(x, (axis, *[i for i in range(rank) if i != axis]))


def _from_front(g: Graph, y: Value, axis: int) -> Value:
    if axis == 0:
        return y
    rank = len(g.shape_of(y).dims)
    perm = list(range(1, rank))
    perm.insert(axis, 0)
    return g.transpose(y, tuple(perm))


@converter("Scan")
def scan(ctx: ImportContext, node: NodeView):
    g = ctx.g
    n_in = int(node.attr("num_scan_inputs"))
    n_state = len(node.inputs) - n_in
    if n_in < 1 or n_state < 0:
        raise ctx.fail(node, f"num_scan_inputs={n_in} does not fit its {len(node.inputs)} inputs")
    states = [ctx.value(node, i) for i in range(n_state)]
    raw = [ctx.value(node, n_state + i) for i in range(n_in)]
    in_axes = list(node.attr("scan_input_axes", [0] * n_in))
    in_dirs = list(node.attr("scan_input_directions", [0] * n_in))
    xs = [_to_front(g, x, _axis(ctx, node, a, len(ctx.dims(x)), "scan_input_axes entry"))
          for x, a in zip(raw, in_axes)]
    length = ctx.dims(xs[0])[0]
    for i, x in enumerate(xs[1:], 1):
        if ctx.dims(x)[0] != length:
            raise ctx.fail(node, f"scan input {i} has {ctx.dims(x)[0]} steps, input 0 has "
                                 f"{length}")
    slices = [Shape(ctx.dims(x)[1:], ctx.dtype(x)) for x in xs]
    name = node.name or node.outputs[0]
    body = ctx.body(node, "body", [g.shape_of(s) for s in states] + slices, f"{name}_body")
    n_out = len(body.graph.outputs) - n_state
    out_axes = list(node.attr("scan_output_axes", [0] * n_out))
    out_dirs = list(node.attr("scan_output_directions", [0] * n_out))
    if len(in_axes) != n_in or len(in_dirs) != n_in or len(out_axes) != n_out \
            or len(out_dirs) != n_out:
        raise ctx.fail(node, "scan_input_axes / directions need one entry per scan input, "
                             "scan_output_axes / directions one per scan output")
    res = _counted(ctx, node, body.graph, length, states, body.captures, xs,
                   [bool(d) for d in in_dirs], [bool(d) for d in out_dirs])
    ys = []
    for y, a in zip(res[n_state:], out_axes):
        ys.append(_from_front(g, y, _axis(ctx, node, a, len(ctx.dims(y)), "scan_output_axes "
                                                                         "entry")))
    return [*res[:n_state], *ys]
