"""Specializing symbolic dims: `bind_dims(g, {"batch": 2, "seq": 16})` returns a new graph in
which those symbols are ints everywhere - value types, input and param shapes, and the dim
attributes of ops (reshape / expand targets, narrow and range lengths, sym_const values,
region bodies) - with every node's output types inferred again. Expressions are substituted
partially: binding only `batch` turns "batch*seq" into "2*seq". The input graph is unchanged.

`graph_symbols(g)` lists the symbol names a graph mentions in those places."""
from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping

from ..errors import GraphError, ShapeError
from .attrs import op_fields
from .graph_core import GraphCore
from .op import Op
from .ops.io import Input, Param, excluded_binding
from .shapes import Shape
from .symbolic import SymDim, dim_symbols

__all__ = ["bind_dims", "graph_symbols", "check_bindings"]


def graph_symbols(g: GraphCore) -> frozenset[str]:
    """Every symbol name in the graph's value types and op dim attributes (bodies included)."""
    out: set[str] = set()
    for node in g.nodes:
        for s in node.outputs:
            out |= s.symbol_names
        _op_symbols(node.op, out)
    return frozenset(out)


def check_bindings(g: GraphCore, bindings: Mapping[str, int] | None, extra: Mapping[str, int]
                   ) -> dict[str, int]:
    """Merge `bindings` and keyword `extra` into one {symbol: int} map; GraphError for a symbol
    the graph does not mention, a value that is not an int >= 0, or a symbol given twice with
    different values."""
    env: dict[str, int] = {}
    known = graph_symbols(g)
    for source in (bindings or {}), extra:
        for name, value in source.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise GraphError(f"bind takes symbol names (such as 'batch'), got {name!r}")
            if name not in known:
                have = ", ".join(sorted(known)) or "none"
                raise GraphError(f"bind: graph {g.name!r} has no symbolic dim {name!r} "
                                 f"(its symbols: {have})")
            if isinstance(value, bool) or not hasattr(value, "__index__") or int(value) < 0:
                raise GraphError(f"bind: {name} must be an int >= 0, got {value!r}")
            if env.setdefault(name, int(value)) != int(value):
                raise GraphError(f"bind: {name} is given two values, {env[name]} and {value}")
    return env


def bind_dims(g: GraphCore, env: Mapping[str, int]) -> GraphCore:
    """A copy of `g` with the symbols of `env` replaced by their ints and types re-inferred.
    A binding that makes a node invalid raises ShapeError naming the node."""
    broken = excluded_binding([n.op for n in g.nodes if isinstance(n.op, Input)], env)
    if broken is not None:
        raise ShapeError(f"bind({_fmt(env)}) of graph {g.name!r}: {broken}")
    out = type(g)(g.name, record_provenance=g.record_provenance)
    for node in g.nodes:
        try:
            op = bind_op(node.op, env)
            if isinstance(op, Input) and any(isinstance(e[0], int) for e in op.excludes):
                op = dataclasses.replace(op, excludes=tuple(  # bound dims: checked above
                    e for e in op.excludes if not isinstance(e[0], int)))
            vals = out.add_node(op, node.inputs, name=node.name, provenance=node.provenance)
        except ShapeError as e:
            raise ShapeError(f"bind({_fmt(env)}) makes node {node.describe()} of graph "
                             f"{g.name!r} invalid: {e}") from None
        if isinstance(op, Input):
            out.input_ids.append(vals[0].node)
        elif isinstance(op, Param):
            out.param_ids.append(vals[0].node)
    out.weights = dict(g.weights)
    out.set_outputs(g.outputs)
    return out


def bind_op(op: Op, env: Mapping[str, int]) -> Op:
    """`op` with the symbols of `env` substituted in its dim attributes (the same object when
    nothing changes)."""
    changes = {}
    for name, hint, _ in op_fields(type(op)):
        old = getattr(op, name)
        new = _subst(old, hint, env)
        if new is not old:
            changes[name] = new
    return dataclasses.replace(op, **changes) if changes else op


def bind_dim(d, env: Mapping[str, int]):
    """One dim with the symbols of `env` substituted (partially for expressions)."""
    if isinstance(d, int) or not dim_symbols(d) & env.keys():
        return d
    total = SymDim({})
    for mono, coef in SymDim.of(d).terms.items():
        rest = []
        for s in mono:
            if s in env:
                coef *= env[s]
            else:
                rest.append(s)
        total = total + SymDim({tuple(rest): coef})
    return total.to_dim()


# -- attribute walking, driven by the op classes' type hints ------------------------------------
def _arms(hint) -> tuple:
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return typing.get_args(hint)
    return (hint,)


def _is_dim_hint(hint) -> bool:
    arms = _arms(hint)
    return str in arms and int in arms


def _tuple_arm(hint):
    for arm in _arms(hint):
        if arm is tuple or typing.get_origin(arm) is tuple:
            return arm
    return None


def _subst(v, hint, env: Mapping[str, int]):
    if isinstance(v, Shape):
        dims = tuple(bind_dim(d, env) for d in v.dims)
        return v if dims == v.dims else Shape(dims, v.dtype)
    if isinstance(v, GraphCore):
        sub = {k: n for k, n in env.items() if k in graph_symbols(v)}
        return bind_dims(v, sub) if sub else v
    if isinstance(v, Op):
        return bind_op(v, env)
    if isinstance(v, str) and _is_dim_hint(hint):
        new = bind_dim(v, env)
        return v if new == v else new
    if isinstance(v, tuple):
        arm = _tuple_arm(hint)
        args = typing.get_args(arm) if arm is not None else ()
        if len(args) == 2 and args[1] is Ellipsis:
            hints = (args[0],) * len(v)
        elif len(args) == len(v):
            hints = args
        else:
            hints = (typing.Any,) * len(v)
        new = tuple(_subst(x, h, env) for x, h in zip(v, hints))
        return v if all(a is b for a, b in zip(new, v)) else new
    return v


def _op_symbols(op: Op, out: set[str]) -> None:
    for name, hint, _ in op_fields(type(op)):
        _value_symbols(getattr(op, name), hint, out)


def _value_symbols(v, hint, out: set[str]) -> None:
    if isinstance(v, Shape):
        out |= v.symbol_names
    elif isinstance(v, GraphCore):
        out |= graph_symbols(v)
    elif isinstance(v, Op):
        _op_symbols(v, out)
    elif isinstance(v, str) and not isinstance(v, enum.Enum) and _is_dim_hint(hint):
        try:
            out |= dim_symbols(v)
        except ValueError:
            pass
    elif isinstance(v, tuple):
        arm = _tuple_arm(hint)
        args = typing.get_args(arm) if arm is not None else ()
        each = args[0] if len(args) == 2 and args[1] is Ellipsis else None
        for i, x in enumerate(v):
            h = each if each is not None else (args[i] if len(args) == len(v) else typing.Any)
            _value_symbols(x, h, out)


def _fmt(env: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={n}" for k, n in env.items())
