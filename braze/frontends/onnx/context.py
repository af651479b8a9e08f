"""The state of one ONNX import: what each ONNX tensor name refers to (a braze value, a
compile-time `Known`, or both), the opset, and the helpers converters use to read inputs and
attributes. Converters (ops/) see only this."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ...errors import FrontendError
from ...ir.dtypes import DType
from ...ir.graph import Graph
from ...ir.op import Value
from ...ir.symbolic import SymDim
from ..small_sizes import exclude_binding, failing_small_bindings
from .dtypes import braze_dtype
from .known import Known

__all__ = ["Tensor", "ImportContext", "NodeView", "Body", "Converter", "CONVERTERS", "converter"]


@dataclass
class Tensor:
    """What an ONNX name refers to. `value` is created lazily for known tensors."""

    value: Value | None = None
    known: Known | None = None


@dataclass
class NodeView:
    """An ONNX node with its attributes decoded once (ints, floats, strings, lists, arrays)."""

    op_type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict
    domain: str = ""
    attr_types: dict = field(default_factory=dict)  # name -> AttributeProto type
    schema: object = None  # ONNX's OpSchema (schema.py), None outside the default domain
    captures: list[str] = field(default_factory=list)  # outer names its subgraphs read

    @property
    def reads(self) -> list[str]:
        """Every name the node reads: its inputs, then its subgraphs' captures."""
        return [*self.inputs, *self.captures]

    @property
    def label(self) -> str:
        return f"{self.name or (self.outputs[0] if self.outputs else '?')} ({self.op_type})"

    def attr(self, key: str, default=None):
        return self.attrs.get(key, default)


@dataclass
class Body:
    """An ONNX subgraph imported as a closed braze graph: its inputs are the formals given as
    types, in order, then one per outer value the subgraph captures (`captures`, the outer
    values to pass in, in the same order); captured compile-time values stay known inside.
    `known_outputs[k]` is output k's compile-time value, when the import knows it."""

    graph: Graph
    captures: list[Value]
    known_outputs: list[Known | None]


Converter = Callable[["ImportContext", NodeView], Sequence]
CONVERTERS: dict[str, Converter] = {}


def converter(*op_types: str):
    """Register `fn(ctx, node) -> outputs` for ONNX op types (default domain). Outputs are braze
    Values, Knowns, or None for an absent optional output."""

    def deco(fn: Converter) -> Converter:
        for t in op_types:
            if t in CONVERTERS:
                raise TypeError(f"ONNX op {t} has two converters")
            CONVERTERS[t] = fn
        return fn

    return deco


@dataclass
class ImportContext:
    g: Graph
    opset: int
    source: str = "model"
    env: dict[str, Tensor] = field(default_factory=dict)
    _materialized: dict[int, Value] = field(default_factory=dict)
    scopes: object = None  # the importer: imports subgraphs (`body`, `inline`)
    root: ImportContext | None = None  # the top-level graph's context, inside a subgraph

    # -- subgraphs ---------------------------------------------------------------------------------
    def body(self, node: NodeView, attr: str, formals: Sequence, name: str) -> Body:
        """Import graph attribute `attr` of `node` as a closed braze graph named `name`.
        `formals` gives each subgraph input, in order, a braze Shape (a body input) or a
        Known (bound at import: no input)."""
        return self.scopes.import_body(self, node, attr, formals, name)

    def inline(self, node: NodeView, attr: str, why: str) -> list[Tensor]:
        """Import graph attribute `attr` of `node` (a subgraph without inputs) into this graph
        in place of the node; its nodes' provenance says `why`. Returns its outputs."""
        return self.scopes.inline_body(self, node, attr, why)

    # -- reading inputs ---------------------------------------------------------------------------
    def has(self, node: NodeView, i: int) -> bool:
        """Whether optional input `i` is given."""
        return i < len(node.inputs) and node.inputs[i] != ""

    def tensor(self, node: NodeView, i: int) -> Tensor:
        name = node.inputs[i]
        try:
            return self.env[name]
        except KeyError:
            raise FrontendError(f"{self.source}: node {node.label} reads {name!r}, which no "
                                "graph input, initializer or earlier node produces") from None

    def known(self, node: NodeView, i: int) -> Known | None:
        return self.tensor(node, i).known if self.has(node, i) else None

    def value(self, node: NodeView, i: int) -> Value:
        """The braze value of input `i` (materializing a compile-time value)."""
        t = self.tensor(node, i)
        if t.value is None:
            t.value = self.materialize(t.known)
        return t.value

    def opt_value(self, node: NodeView, i: int) -> Value | None:
        return self.value(node, i) if self.has(node, i) else None

    def materialize(self, k: Known) -> Value:
        """A constant (or sym_const for symbolic entries) holding `k`."""
        if k.symbolic:
            vals = tuple(v.to_dim() if isinstance(v, SymDim) else int(v) for v in k.ints())
            return self.g.sym_const(vals, k.array.shape, k.dtype)
        arr = np.asarray(k.array)
        if arr.dtype != k.dtype.np:
            arr = arr.astype(k.dtype.np)
        return self.g.constant(arr, k.dtype)

    def ints(self, node: NodeView, i: int, what: str) -> list:
        """Input `i` as a list of ints / SymDims; it must be known at import time."""
        k = self.known(node, i)
        if k is None:
            raise FrontendError(f"{self.source}: node {node.label}: {what} (input {i}) is "
                                "computed from data at run time; braze needs it at import time "
                                "(static or symbolic in the input dims)")
        return k.ints()

    def static_ints(self, node: NodeView, i: int, what: str) -> list[int]:
        vals = self.ints(node, i, what)
        if any(not isinstance(v, int) for v in vals):
            raise FrontendError(f"{self.source}: node {node.label}: {what} must be static, got "
                                f"{[str(v) for v in vals]}; pass input_shapes= to import_onnx to "
                                "fix the dims")
        return vals

    def scalar(self, node: NodeView, i: int, what: str, default=None):
        """Input `i` as one Python number (it must be known and hold one element)."""
        if not self.has(node, i):
            if default is None:
                raise FrontendError(f"{self.source}: node {node.label} needs {what}")
            return default
        k = self.known(node, i)
        if k is None:
            raise FrontendError(f"{self.source}: node {node.label}: {what} (input {i}) is "
                                "computed from data at run time; braze needs it at import time "
                                "(a constant or initializer)")
        if k.array.size != 1:
            raise FrontendError(f"{self.source}: node {node.label}: {what} must be a scalar, "
                                f"got shape {k.array.shape}")
        v = k.array.reshape(-1)[0]
        return v if isinstance(v, SymDim) else v.item()

    def dtype(self, v: Value) -> DType:
        return self.g.shape_of(v).dtype

    def dims(self, v: Value) -> tuple:
        return self.g.shape_of(v).dims

    def fail(self, node: NodeView, message: str) -> FrontendError:
        return FrontendError(f"{self.source}: node {node.label}: {message}")

    def exclude(self, node: NodeView, dim, value: int, why: str) -> None:
        """Record that the conversion of `node` does not hold when `dim` binds to `value` (it
        decided for the sizes >= 2 that braze assumes): the first graph input naming the dim's
        symbols refuses that binding (`Input.excludes`), naming the node and `why` (the first
        node's, once: a pattern repeated per layer adds no copies)."""
        if self.root is not None:  # a subgraph's inputs are not the model's
            self.root.exclude(node, dim, value, why)
            return
        exclude_binding(self.g, dim, value, f"{self.source}: node {node.label}: {why}")

    def exclude_small(self, node: NodeView, symbols, holds, why: str) -> None:
        """`exclude` each binding of a symbol to 0 or 1 (braze.frontends.small_sizes) where
        `holds(binding)` is False: a decision `node` took for symbols >= 2; `why` may name
        `{sym}` and `{value}`."""
        for sym, value in failing_small_bindings(symbols, holds):
            self.exclude(node, sym, value, why.format(sym=sym, value=value))

    def const_like(self, value, like: Value) -> Value:
        """A scalar constant of `like`'s dtype."""
        dt = self.dtype(like)
        return self.g.constant(np.asarray(value, dtype=dt.np), dt)


def known_from_array(arr: np.ndarray) -> Known:
    return Known(arr, braze_dtype(arr.dtype))
