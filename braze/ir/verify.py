"""`bz.verify(g)`: check a graph's invariants, raising VerifyError at the first broken one.

Checked, in one linear pass: node ids equal positions; every input refers to an output of an
earlier node (topological order, no dangling values); arity; output types equal the re-inferred
ones; node names unique; outputs are values of the graph; `input_ids` / `param_ids` point at
distinct Input / Param nodes with unique names, and every Input / Param node is listed; weights
belong to params and match their shapes and dtypes; region bodies verify too. The error names
the node (label and provenance) and quotes it with its producers and consumers as text IR."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import BrazeError, VerifyError
from .attrs import graph_fields
from .node import Node
from .op import Value
from .ops.io import Input, Param
from .shapes import Shape

if TYPE_CHECKING:
    from .graph_core import GraphCore

__all__ = ["verify"]

_CONTEXT = 3  # producer / consumer lines quoted around the offending node


def verify(g: GraphCore) -> None:
    """Raise VerifyError naming the offending node if `g` breaks an invariant; else None."""
    nodes = g.nodes
    names: dict[str, int] = {}
    for pos, node in enumerate(nodes):
        if not isinstance(node, Node):
            raise VerifyError(f"graph {g.name!r}: nodes[{pos}] is a {type(node).__name__}, "
                              "not a Node")
        if node.id != pos:
            _fail(g, node, f"has id {node.id} but sits at position {pos}; node ids must equal "
                           "positions (rebuild the graph with add_node)")
        _check_inputs(g, node)
        _check_types(g, node)
        if node.name is not None:
            if node.name in names:
                _fail(g, node, f"reuses the name {node.name!r} of node %{names[node.name]}")
            names[node.name] = pos
        for field in graph_fields(type(node.op)):
            body = getattr(node.op, field)
            if body is not None:
                try:
                    verify(body)
                except VerifyError as e:
                    _fail(g, node, f"has a broken {field} graph:\n{e}")
    _check_outputs(g)
    _check_sources(g)
    _check_weights(g)


def _check_inputs(g: GraphCore, node: Node) -> None:
    for i, v in enumerate(node.inputs):
        if not isinstance(v, Value):
            _fail(g, node, f"input {i} is {v!r}, not a Value")
        if v.node < 0 or v.node >= len(g.nodes):
            _fail(g, node, f"input {i} refers to {v!r}, which does not exist "
                           f"(the graph has {len(g.nodes)} nodes)")
        if v.node >= node.id:
            what = "itself" if v.node == node.id else "a later node"
            _fail(g, node, f"input {i} refers to {v!r}, {what}: nodes must be in topological "
                           "order (every input defined before its user)")
        n_out = len(g.nodes[v.node].outputs)
        if not 0 <= v.index < n_out:
            _fail(g, node, f"input {i} refers to {v!r}, but node %{v.node} has {n_out} "
                           "output(s)")


def _check_types(g: GraphCore, node: Node) -> None:
    op = node.op
    if not isinstance(node.outputs, tuple) or not all(isinstance(s, Shape) for s in node.outputs):
        _fail(g, node, f"stores outputs {node.outputs!r}; expected a tuple of Shapes")
    ins = tuple(g.nodes[v.node].outputs[v.index] for v in node.inputs)
    try:
        op.check_arity(len(ins))
        out = op.infer(ins)
    except BrazeError as e:
        _fail(g, node, f"no longer type-checks: {e}")
    outs = (out,) if isinstance(out, Shape) else tuple(out)
    if outs != node.outputs:
        got = ", ".join(map(str, node.outputs))
        want = ", ".join(map(str, outs))
        _fail(g, node, f"stores output type(s) {got} but {op.kind} infers {want} from its inputs")


def _check_outputs(g: GraphCore) -> None:
    for i, v in enumerate(g.outputs):
        ok = (isinstance(v, Value) and 0 <= v.node < len(g.nodes)
              and 0 <= v.index < len(g.nodes[v.node].outputs))
        if not ok:
            raise VerifyError(f"graph {g.name!r}: output {i} is {v!r}, which is not a value of "
                              f"the graph ({len(g.nodes)} nodes)")


def _check_sources(g: GraphCore) -> None:
    seen: dict[str, int] = {}
    for kind, ids, cls in (("input", g.input_ids, Input), ("param", g.param_ids, Param)):
        for nid in ids:
            if not isinstance(nid, int) or not 0 <= nid < len(g.nodes):
                raise VerifyError(f"graph {g.name!r}: its {kind}s list {nid!r}, not a node")
            node = g.nodes[nid]
            if not isinstance(node.op, cls):
                _fail(g, node, f"is listed among the graph's {kind}s but is a {node.op.kind}")
            name = node.op.name
            if name in seen:
                other = "listed twice" if seen[name] == nid else f"also the name of %{seen[name]}"
                _fail(g, node, f"{kind} name {name!r} is {other}; input and param names must "
                               "be unique")
            seen[name] = nid
    listed = set(g.input_ids) | set(g.param_ids)
    for node in g.nodes:
        if isinstance(node.op, (Input, Param)) and node.id not in listed:
            _fail(g, node, f"is a {node.op.kind} the graph does not list in its "
                           f"{node.op.kind}s (use g.{node.op.kind}(...) to create it)")


def _check_weights(g: GraphCore) -> None:
    params = {g.nodes[i].op.name: g.nodes[i] for i in g.param_ids}
    for name, arr in g.weights.items():
        if name not in params:
            raise VerifyError(f"graph {g.name!r}: weight {name!r} belongs to no param "
                              f"(params: {', '.join(sorted(params)) or 'none'})")
        node = params[name]
        shape = node.op.shape
        arr = np.asarray(arr)
        dims_ok = arr.ndim == shape.rank and all(
            not isinstance(d, int) or d == a for d, a in zip(shape.dims, arr.shape))
        if not dims_ok or arr.dtype != shape.dtype.np:
            _fail(g, node, f"declares {shape} but its weight is {arr.dtype}{list(arr.shape)}")


def _fail(g: GraphCore, node: Node, msg: str):
    raise VerifyError(f"graph {g.name!r}: node {node.describe()}: {msg}\n{_context(g, node)}")


def _context(g: GraphCore, node: Node) -> str:
    """The node's producers, the node (marked `>`), and its first consumers, as text IR."""
    from .printer import format_node

    def line(n: Node, mark: str) -> str:
        try:
            text = format_node(g, n, 4)
        except Exception:  # a node too broken to print
            text = f"    %{n.id} = {n.op!r}"
        return mark + text[1:]

    producers = []
    for v in getattr(node, "inputs", ())[:_CONTEXT * 2]:
        if isinstance(v, Value) and 0 <= v.node < len(g.nodes) and v.node != node.id:
            if v.node not in producers:
                producers.append(v.node)
    consumers = []
    for later in g.nodes[node.id + 1:] if 0 <= node.id < len(g.nodes) else ():
        if any(isinstance(v, Value) and v.node == node.id for v in later.inputs):
            consumers.append(later)
            if len(consumers) == _CONTEXT:
                break
    lines = [line(g.nodes[p], " ") for p in producers[:_CONTEXT]]
    lines.append(line(node, ">"))
    lines += [line(c, " ") for c in consumers]
    return "  around it:\n" + "\n".join(lines)
