"""Moving params across the compile-time / run-time line.

`promote_params_to_inputs(g, names)` turns params into graph inputs of the same name and type
(fed with the other inputs: weights that change per call, LoRA adapters, fine-tuning);
`specialize_params(g, values)` bakes params in as constants (values given, or the params' stored
ones), so constant folding and the fusions can use them. Both return a new graph whose nodes
keep their order, names and provenance; the input graph is never changed. A name that is not a
param of the graph, a missing value or a value of the wrong shape or dtype is a GraphError
naming the param."""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from ..errors import GraphError
from ..ir.dtypes import dtype_from_numpy
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.op import Value
from ..ir.ops.io import Constant, Input

__all__ = ["promote_params_to_inputs", "specialize_params"]


def promote_params_to_inputs(g: Graph, names: Iterable[str]) -> Graph:
    """A copy of `g` where each param in `names` is a graph input with the param's name and
    shape (symbolic dims included); its stored value, if any, is dropped (feed it instead).
    The new inputs come after the graph's existing inputs, in node order."""
    chosen = _params_named(g, names)
    promoted = {nid: Input(g.nodes[nid].op.name, g.nodes[nid].op.shape) for nid in chosen}
    return _rebuild(g, promoted)


def specialize_params(g: Graph, values: Mapping[str, np.ndarray] | Iterable[str]) -> Graph:
    """A copy of `g` where chosen params are constants. `values` maps param names to arrays,
    or lists names whose stored values (`g.weights`) are used. Each array must have the
    param's (static) shape and dtype; the constant keeps the param's name and provenance."""
    given = dict(values) if isinstance(values, Mapping) else None
    chosen = _params_named(g, given if given is not None else values)
    consts = {}
    for nid in chosen:
        op = g.nodes[nid].op
        if given is not None and op.name in given:
            arr = np.asarray(given[op.name])
        elif op.name in g.weights:
            arr = g.weights[op.name]
        else:
            raise GraphError(f"param {op.name!r} {op.shape} of graph {g.name!r} has no stored "
                             "value; pass specialize_params a dict {name: array}")
        _check_value(g.nodes[nid], arr)
        consts[nid] = Constant(arr)
    return _rebuild(g, consts)


def _params_named(g: Graph, names: Iterable[str]) -> list[int]:
    """Node ids of the params called `names` (in node order); unknown names are an error."""
    wanted = [names] if isinstance(names, str) else list(names)
    by_name = {g.nodes[i].op.name: i for i in g.param_ids}
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        have = ", ".join(sorted(by_name)) or "none"
        raise GraphError(f"graph {g.name!r} has no param named {', '.join(map(repr, unknown))}; "
                         f"its params: {have}")
    return sorted(by_name[n] for n in set(wanted))


def _check_value(node: Node, arr: np.ndarray) -> None:
    shape = node.op.shape
    where = f" (from {node.provenance})" if node.provenance else ""
    if not shape.is_static:
        raise GraphError(f"param {node.op.name!r}{where} has symbolic shape {shape}; a constant "
                         "fixes every dim, so bind the dims first (g.bind) or keep it a param")
    if tuple(arr.shape) != shape.dims:
        raise GraphError(f"value for param {node.op.name!r}{where} has shape {arr.shape}, the "
                         f"param declares {shape}")
    got = dtype_from_numpy(arr.dtype)
    if got != shape.dtype:
        raise GraphError(f"value for param {node.op.name!r}{where} is {got}, the param "
                         f"declares {shape}; cast it (arr.astype(...)) first")


def _rebuild(g: Graph, replace: dict) -> Graph:
    """Copy `g`, giving the nodes in `replace` (id -> source op) their new op (same type)."""
    new = Graph(g.name, record_provenance=False)
    vmap: dict[Value, Value] = {}
    promoted: list[int] = []
    for n in g.nodes:
        op = replace.get(n.id)
        if op is None:
            vmap.update(zip(n.values, new.clone_node(n, [vmap[v] for v in n.inputs], g)))
            continue
        v = new.add_node(op, (), name=n.name, provenance=n.provenance)[0]
        if isinstance(op, Input):
            promoted.append(v.node)
        vmap[n.values[0]] = v
    new.input_ids = [vmap[Value(i)].node for i in g.input_ids] + promoted
    new.weights = {k: w for k, w in g.weights.items()
                   if k in {p.op.name for p in new.params}}
    new.set_outputs([vmap[v] for v in g.outputs])
    return new
