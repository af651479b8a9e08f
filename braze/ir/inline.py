"""Inline one graph into another: the sub-graph's inputs are bound, by position, to values of the
target, and its nodes are copied after them. Control-flow ops use it to decompose, and the
control-flow lowering (braze/passes/lower/control_flow.py) exposes it as
`inline_subgraph_into` / `inline_subgraph_into_outputs`.

Params of the sub-graph become params of the target, keeping their name and stored value:
a target param of the same name, type and value (or, with no value stored on either side, the
same type) is shared, so inlining one body many times (an unrolled loop) adds each weight once.
Otherwise the param is renamed (`w` -> `w_1`) so it never captures a different tensor of the
target. Copied nodes lose their names (names are per graph) and keep their provenance."""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..errors import GraphError
from .op import Value
from .ops.io import Constant, Input, Param

if TYPE_CHECKING:
    from .graph_core import GraphCore
    from .node import Node

__all__ = ["inline_graph"]


def inline_graph(
    target: GraphCore,
    sub: GraphCore,
    inputs: Sequence[Value],
    *,
    reserved_names: Collection[str] = (),
    outer_weights: Mapping[str, np.ndarray] | None = None,
    provenance: str | None = None,
) -> list[Value]:
    """Copy `sub`'s nodes into `target`, its i-th input reading `inputs[i]`; returns the target
    values of `sub.outputs`, in order.

    `reserved_names` are names a param of `sub` may not take unless shared (names the target
    will still receive, e.g. nodes of the graph a pass is rebuilding); `outer_weights` are
    values those names will carry. Copied nodes without provenance get `provenance`.
    GraphError when the input count or types do not match."""
    inputs = list(inputs)
    if len(inputs) != len(sub.input_ids):
        raise GraphError(f"cannot inline graph {sub.name!r}: it takes {len(sub.input_ids)} "
                         f"inputs, got {len(inputs)}")
    env: dict[Value, Value] = {}
    for i, (nid, v) in enumerate(zip(sub.input_ids, inputs)):
        want, got = sub.nodes[nid].outputs[0], target.shape_of(v)
        if want != got:
            raise GraphError(f"cannot inline graph {sub.name!r}: input {i} "
                             f"{sub.nodes[nid].op.name!r} is {want}, got {got}")
        env[Value(nid)] = v
    params = _ParamMap(target, reserved_names, outer_weights or {})
    for node in sub.nodes:
        if isinstance(node.op, Input):
            continue
        if isinstance(node.op, Param):
            env[node.value] = params.get(node, sub.weights.get(node.op.name))
            continue
        ins = tuple(env[v] for v in node.inputs)
        prov = node.provenance if node.provenance is not None else provenance
        if isinstance(node.op, Constant):
            ins = ()
        outs = target.add_node(node.op, ins, provenance=prov)
        env.update(zip(node.values, outs))
    return [env[v] for v in sub.outputs]


class _ParamMap:
    """Finds or makes the target param standing for a sub-graph param (see module docstring)."""

    def __init__(self, target: GraphCore, reserved: Collection[str],
                 outer_weights: Mapping[str, np.ndarray]):
        self.target = target
        self.reserved = reserved
        self.outer_weights = outer_weights
        self.by_name = {target.nodes[i].op.name: i for i in target.param_ids}

    def get(self, node: Node, value: np.ndarray | None) -> Value:
        base, shape = node.op.name, node.op.shape
        name, k = base, 0
        while True:  # w, w_1, w_2, ...: the first that is this param already, or free
            nid = self.by_name.get(name)
            if nid is not None and self._same(nid, shape, value):
                return Value(nid)
            if nid is None and name not in self.reserved and self._free(name):
                break
            k += 1
            name = f"{base}_{k}"
        v = self.target.add_node(Param(name, shape), (), name=name, provenance=node.provenance)[0]
        self.target.param_ids.append(v.node)
        self.by_name[name] = v.node
        if value is not None:
            self.target.weights[name] = np.asarray(value)
        return v

    def _same(self, nid: int, shape, value: np.ndarray | None) -> bool:
        t = self.target
        if t.nodes[nid].op.shape != shape:
            return False
        name = t.nodes[nid].op.name
        have = t.weights.get(name, self.outer_weights.get(name))
        if have is None or value is None:
            return have is None and value is None
        have, value = np.asarray(have), np.asarray(value)
        return (have.dtype == value.dtype and have.shape == value.shape
                and have.tobytes() == value.tobytes())

    def _free(self, name: str) -> bool:
        try:
            self.target.node_by_name(name)
        except GraphError:
            return name not in self.by_name
        return False
