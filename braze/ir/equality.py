"""Structural graph equality (`Graph.__eq__`) and `graph_diff`, which says where two graphs first
differ. Linear in graph size.

Compared: graph name, nodes in order (op class and attributes, inputs, output types, name,
provenance), the input and param lists, the outputs, and region bodies by the same rules.
Weights are compared only when BOTH graphs hold some: then the names must match and every array
must be bit-identical (dtype, shape, bytes). A graph without weights (text IR, a fresh build)
therefore equals its weighted twin; save/load keeps weights, so it is checked there."""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

import numpy as np

from .attrs import op_fields
from .op import Op

if TYPE_CHECKING:
    from .graph_core import GraphCore

__all__ = ["graphs_equal", "graph_diff", "ops_equal"]


def graphs_equal(a: GraphCore, b: GraphCore) -> bool:
    """Whether `a` and `b` are the same graph (see the module docstring for what counts)."""
    return graph_diff(a, b) is None


def graph_diff(a: GraphCore, b: GraphCore) -> str | None:
    """None when the graphs are equal, else one line naming the first difference."""
    if a is b:
        return None
    if a.name != b.name:
        return f"graph name: {a.name!r} vs {b.name!r}"
    if len(a.nodes) != len(b.nodes):
        return f"graph {a.name!r}: {len(a.nodes)} vs {len(b.nodes)} nodes"
    for na, nb in zip(a.nodes, b.nodes):
        where = f"graph {a.name!r} node {na.id} ({na.name or na.op.label})"
        if na.id != nb.id:
            return f"{where}: id {na.id} vs {nb.id}"
        d = op_diff(na.op, nb.op)
        if d is not None:
            return f"{where}: {d}"
        for field in ("inputs", "outputs", "name", "provenance"):
            va, vb = getattr(na, field), getattr(nb, field)
            if va != vb:
                return f"{where}: {field} {_show(va)} vs {_show(vb)}"
    for field in ("input_ids", "param_ids", "outputs"):
        va, vb = list(getattr(a, field)), list(getattr(b, field))
        if va != vb:
            return f"graph {a.name!r} {field}: {va} vs {vb}"
    if a.weights and b.weights:
        return _weights_diff(a, b)
    return None


def ops_equal(a: Op, b: Op) -> bool:
    """Same op class and attributes; arrays compare bitwise, region bodies by contents."""
    return op_diff(a, b) is None


def op_diff(a: Op, b: Op) -> str | None:
    """None when the ops are equal, else which attribute differs."""
    if type(a) is not type(b):
        return f"op {a.kind} vs {b.kind}"
    for name, _, _ in op_fields(type(a)):
        d = _value_diff(getattr(a, name), getattr(b, name))
        if d is not None:
            return f"{a.label} attribute {name}: {d}"
    return None


def _value_diff(x: Any, y: Any) -> str | None:
    from .graph_core import GraphCore

    if isinstance(x, GraphCore) or isinstance(y, GraphCore):
        if not (isinstance(x, GraphCore) and isinstance(y, GraphCore)):
            return f"{_show(x)} vs {_show(y)}"
        d = graph_diff(x, y)
        return None if d is None else f"body differs: {d}"
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return None if _arrays_identical(x, y) else "arrays differ"
    if isinstance(x, Op) and isinstance(y, Op):
        return op_diff(x, y)
    if isinstance(x, (tuple, list)) and isinstance(y, (tuple, list)):
        if type(x) is not type(y) or len(x) != len(y):
            return f"{_show(x)} vs {_show(y)}"
        for xi, yi in zip(x, y):
            if _value_diff(xi, yi) is not None:
                return f"{_show(x)} vs {_show(y)}"
        return None
    if type(x) is not type(y) and not (isinstance(x, enum.Enum) or isinstance(y, enum.Enum)):
        return f"{_show(x)} vs {_show(y)}"
    if x == y or (isinstance(x, float) and x != x and y != y):
        return None
    return f"{_show(x)} vs {_show(y)}"


def _arrays_identical(x: Any, y: Any) -> bool:
    if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)):
        return False
    return (x.dtype == y.dtype and x.shape == y.shape
            and np.ascontiguousarray(x).tobytes() == np.ascontiguousarray(y).tobytes())


def _weights_diff(a: GraphCore, b: GraphCore) -> str | None:
    if set(a.weights) != set(b.weights):
        only_a = sorted(set(a.weights) - set(b.weights))
        only_b = sorted(set(b.weights) - set(a.weights))
        return f"graph {a.name!r} weights: only in first {only_a}, only in second {only_b}"
    for k in a.weights:
        if not _arrays_identical(np.asarray(a.weights[k]), np.asarray(b.weights[k])):
            return f"graph {a.name!r} weight {k!r} differs"
    return None


def _show(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 80 else s[:77] + "..."
