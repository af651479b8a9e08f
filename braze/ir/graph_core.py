"""The graph container: append-only nodes in topological order, inputs, params (with optional
weights), outputs, and a users index maintained as nodes are appended.

Builder methods (the public op surface) live in `builder/` mixins; `Graph` in `graph.py`
combines them with this core."""
from __future__ import annotations

import bisect
import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterable, Sequence

import numpy as np

from ..errors import GraphError, ShapeError
from .dtypes import dtype_from_numpy
from .node import Node
from .op import Op, Value
from .shapes import Shape
from .weights import WeightStore

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_IR_DIR = os.path.join(_PKG_DIR, "ir")


def call_site() -> str | None:
    """Where the node being built comes from: the first caller outside braze's IR and builder
    (braze/ir/). User code is named `file.py:line`; braze's own model builders
    `braze/models/bert.py:95`, so a builtin model's nodes name the builder line that made them
    (not the console script or runpy that ran it)."""
    f = sys._getframe(1)
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if not fn.startswith(_IR_DIR):
            if fn.startswith(_PKG_DIR):
                rel = os.path.relpath(fn, os.path.dirname(_PKG_DIR))
                return f"{rel}:{f.f_lineno}"
            return f"{os.path.basename(fn)}:{f.f_lineno}"
        f = f.f_back
    return None


_INFER_CACHE: dict = {}
_INFER_CACHE_LIMIT = 1 << 16


def infer_cached(op: Op, in_shapes: tuple[Shape, ...]):
    """`op.infer(in_shapes)`, memoized: inference is a pure function of the op's attributes
    and the input types, and passes rebuild graphs node by node, re-inferring the same
    (op, shapes) pairs many times. Errors are not cached."""
    try:
        key = (op, in_shapes)
        hit = _INFER_CACHE.get(key)
    except TypeError:  # an op with an unhashable attribute
        return op.infer(in_shapes)
    if hit is None:
        hit = op.infer(in_shapes)
        if len(_INFER_CACHE) >= _INFER_CACHE_LIMIT:
            _INFER_CACHE.clear()
        _INFER_CACHE[key] = hit
    return hit


_FIRST_VALUES: list[tuple[Value]] = []


def first_values(nid: int) -> tuple[Value]:
    """`(Value(nid, 0),)`, shared: values are immutable handles compared by field, and graph
    rebuilds make one per copied node (a frozen dataclass is slow to construct)."""
    global _FIRST_VALUES
    table = _FIRST_VALUES
    if nid < len(table):
        return table[nid]
    # a longer table replaces the old one, which is never changed: readers in other threads
    # always see entry i holding Value(i, 0)
    table = table + [(Value(i, 0),) for i in range(len(table), 2 * nid + 64)]
    _FIRST_VALUES = table
    return table[nid]


def _values_of(nid: int, n_outputs: int) -> tuple[Value, ...]:
    """The output values of node `nid` (the shared tuple for a single output)."""
    if n_outputs == 1:
        return first_values(nid)
    return tuple(Value(nid, i) for i in range(n_outputs))


def _distinct(inputs: tuple[Value, ...]) -> tuple[Value, ...]:
    """`inputs` without repeats, first occurrences in order (a node reading a value twice is
    one user of it); a set past a few inputs, so a 5,000-input concat is not 12M comparisons."""
    if len(inputs) < 2:
        return inputs
    if len(inputs) <= 8:
        return tuple(v for i, v in enumerate(inputs) if i == 0 or v not in inputs[:i])
    return tuple(dict.fromkeys(inputs))


def _node_maker():
    """A constructor for `Node` that sets its slots directly: the same object as `Node(...)`
    (checked in tests/ir), without the frozen dataclass's per-field `object.__setattr__`."""
    fields = ("id", "op", "inputs", "outputs", "name", "provenance")
    if tuple(f.name for f in dataclasses.fields(Node)) != fields:  # Node changed: play safe
        return Node
    setters = [getattr(Node, f).__set__ for f in fields]
    s_id, s_op, s_in, s_out, s_name, s_prov = setters
    new = object.__new__

    def make(nid: int, op: Op, inputs: tuple[Value, ...], outputs: tuple[Shape, ...],
             name: str | None, provenance: str | None) -> Node:
        n = new(Node)
        s_id(n, nid)
        s_op(n, op)
        s_in(n, inputs)
        s_out(n, outputs)
        s_name(n, name)
        s_prov(n, provenance)
        return n
    return make


_new_node = _node_maker()


class GraphCore:
    """Nodes, inputs, params, weights, outputs and the users index. See `Graph`."""

    def __init__(self, name: str = "graph", *, record_provenance: bool = True):
        self.name = name
        self.nodes: list[Node] = []
        self.input_ids: list[int] = []
        self.param_ids: list[int] = []
        self.weights = WeightStore()
        self.outputs: list[Value] = []
        self.record_provenance = record_provenance
        self._users: list[list[tuple[int, int]]] = []  # per node: (consumer id, output index)
        self._names: dict[str, int] = {}
        self._provenance_scope: str | None = None
        self.edits = 0  # nodes changed other than by appending (per-graph memos compare it)

    @property
    def weights(self) -> WeightStore:
        """Stored param values by name (`braze.ir.weights`: entries a fusion joined are computed
        when first read)."""
        return self._weights

    @weights.setter
    def weights(self, value: dict) -> None:
        self._weights = value if isinstance(value, WeightStore) else WeightStore(value)

    @contextlib.contextmanager
    def provenance_scope(self, provenance: str | None):
        """Nodes added inside the block get `provenance` (an ONNX node name, a torch module path)
        instead of the builder's call site."""
        saved = self._provenance_scope
        self._provenance_scope = provenance
        try:
            yield self
        finally:
            self._provenance_scope = saved

    # -- construction ---------------------------------------------------------------------------
    def add_node(
        self,
        op: Op,
        inputs: Sequence[Value] = (),
        *,
        name: str | None = None,
        provenance: str | None = None,
    ) -> tuple[Value, ...]:
        """Append `op(inputs)`, inferring output types. Returns the new node's output values.

        Raises ShapeError naming the op, node and input shapes when inference rejects them, and
        GraphError when an input value does not exist in this graph."""
        inputs = tuple(inputs)
        nid = len(self.nodes)
        for pos, v in enumerate(inputs):
            if not isinstance(v, Value):
                raise GraphError(
                    f"input {pos} of new {op.kind} node is {v!r}, not a braze Value; pass values "
                    "returned by this graph's builder methods"
                )
            if not (0 <= v.node < nid) or v.index >= len(self.nodes[v.node].outputs):
                raise GraphError(
                    f"input {pos} of new {op.kind} node refers to unknown value {v!r} "
                    f"(graph {self.name!r} has {nid} nodes); values from another graph "
                    "cannot be used"
                )
        if provenance is None:
            provenance = self._provenance_scope
        if provenance is None and self.record_provenance:
            provenance = call_site()
        in_shapes = tuple(self.nodes[v.node].outputs[v.index] for v in inputs)
        try:
            op.check_arity(len(inputs))
            out = infer_cached(op, in_shapes)
        except ShapeError as e:
            who = name or f"%{nid}"
            where = f" at {provenance}" if provenance else ""
            shapes = ", ".join(str(s) for s in in_shapes) or "no inputs"
            raise ShapeError(f"{op.kind} node {who}{where}: {e} (inputs: {shapes})") from None
        outs = (out,) if isinstance(out, Shape) else tuple(out)
        if name is not None:
            if name in self._names:
                raise GraphError(f"node name {name!r} is already used in graph {self.name!r}")
            self._names[name] = nid
        self.nodes.append(_new_node(nid, op, inputs, outs, name, provenance))
        self._users.append([])
        seen = set()
        for v in inputs:
            if (v.node, v.index) not in seen:
                seen.add((v.node, v.index))
                self._users[v.node].append((nid, v.index))
        return _values_of(nid, len(outs))

    def clone_node(self, node: Node, inputs: Sequence[Value], source: GraphCore | None = None
                   ) -> tuple[Value, ...]:
        """Append a copy of `node` (from graph `source`) reading `inputs`: same op, name and
        provenance; inputs and params are registered as such. Passes rebuild graphs with this;
        when `source` is given and the new inputs have the old inputs' types, the node keeps its
        output types without re-running inference."""
        inputs = tuple(inputs)
        name = node.name if node.name is not None and node.name not in self._names else None
        if source is not None and self._same_types(inputs, node.inputs, source):
            vals = self._append(node.op, inputs, node.outputs, name, node.provenance)
        else:
            vals = self.add_node(node.op, inputs, name=name, provenance=node.provenance)
        if node.op.source:
            self._list_source(vals[0].node, node.op)
        return vals

    def copy_node(self, node: Node, inputs: tuple[Value, ...]) -> tuple[Value, ...]:
        """`clone_node` for graph rebuilds that know each new input has the old input's type
        (a copy of it, or a replacement checked to keep it): nothing is re-checked or
        re-inferred. Keeps the op, name (unless taken), provenance and output types."""
        nid = len(self.nodes)
        name = node.name
        if name is not None:
            if name in self._names:
                name = None
            else:
                self._names[name] = nid
        op = node.op
        self.nodes.append(_new_node(nid, op, inputs, node.outputs, name, node.provenance))
        self._users.append([])
        users = self._users
        if len(inputs) == 1:
            v = inputs[0]
            users[v.node].append((nid, v.index))
        elif inputs:
            for v in _distinct(inputs):
                users[v.node].append((nid, v.index))
        if op.source:
            self._list_source(nid, op)
        return _values_of(nid, len(node.outputs))

    def _list_source(self, nid: int, op: Op) -> None:
        """A copied input or param joins the graph's input / param lists."""
        if op.kind == "input":
            self.input_ids.append(nid)
        elif op.kind == "param":
            self.param_ids.append(nid)

    def copy_prefix(self, source: GraphCore, k: int) -> list[tuple[Value, ...]]:
        """Make this empty graph's first `k` nodes those of `source` (a prefix of a topological
        order reads only itself), sharing the immutable Node objects: what `copy_node` would
        make of them one by one, without the per-node work. Returns their output values."""
        self._share_prefix(source, k)
        return [_values_of(n.id, len(n.outputs)) for n in self.nodes]

    def _share_prefix(self, source: GraphCore, k: int) -> None:
        """`copy_prefix` without building the values it returns."""
        if self.nodes:
            raise GraphError(f"copy_prefix needs an empty graph; {self.name!r} has nodes")
        nodes = source.nodes[:k]
        self.nodes = nodes
        self._users = [[u for u in us if u[0] < k] for us in source._users[:k]]
        names = self._names
        for n in nodes:
            if n.name is not None:
                if n.name in names:  # a clash copy_node would resolve by dropping the name
                    nodes[n.id] = _new_node(n.id, n.op, n.inputs, n.outputs, None, n.provenance)
                else:
                    names[n.name] = n.id
            if n.op.source:
                self._list_source(n.id, n.op)

    def copy_live(self, source: GraphCore, live: list[bool]) -> list[int | None]:
        """Make this empty graph the nodes of `source` marked `live` (every input of a live node
        is live), in order, renumbered: what `copy_node` would make of each, in one loop (dead
        code elimination). Nodes before the first dead one are shared (`copy_prefix`). Returns
        each source node's id here (None for a dropped node)."""
        try:
            first = live.index(False)
        except ValueError:
            first = len(live)
        self._share_prefix(source, first)
        src = source.nodes
        new_id: list[int | None] = list(range(first)) + [None] * (len(src) - first)
        first_values(len(src))  # grows the shared table to cover every id used below
        table = _FIRST_VALUES
        users, names, make = self._users, self._names, _new_node
        push_node, push_users = self.nodes.append, users.append
        nid = first
        for node in src[first:]:
            if not live[node.id]:
                continue
            new_id[node.id] = nid
            ins = tuple([table[new_id[v.node]][0] if v.index == 0
                         else Value(new_id[v.node], v.index) for v in node.inputs])
            name = node.name
            if name is not None:
                if name in names:
                    name = None
                else:
                    names[name] = nid
            op = node.op
            push_node(make(nid, op, ins, node.outputs, name, node.provenance))
            push_users([])
            n_in = len(ins)
            if n_in == 1:
                a = ins[0]
                users[a.node].append((nid, a.index))
            elif n_in == 2:  # no Value comparisons
                a, b = ins
                users[a.node].append((nid, a.index))
                if a.node != b.node or a.index != b.index:
                    users[b.node].append((nid, b.index))
            else:
                for v in _distinct(ins):
                    users[v.node].append((nid, v.index))
            if op.source:
                self._list_source(nid, op)
            nid += 1
        return new_id

    def _same_types(self, new: tuple[Value, ...], old: tuple[Value, ...], source: GraphCore
                    ) -> bool:
        if len(new) != len(old):
            return False
        for nv, ov in zip(new, old):
            if not (0 <= nv.node < len(self.nodes)):
                return False
            a = self.nodes[nv.node].outputs
            b = source.nodes[ov.node].outputs[ov.index]
            if nv.index >= len(a) or (a[nv.index] is not b and a[nv.index] != b):
                return False
        return True

    def _append(self, op: Op, inputs: tuple[Value, ...], outs: tuple[Shape, ...],
                name: str | None, provenance: str | None) -> tuple[Value, ...]:
        """Append a node whose inputs are checked and output types known (clone_node)."""
        nid = len(self.nodes)
        if name is not None:
            self._names[name] = nid
        self.nodes.append(_new_node(nid, op, inputs, outs, name, provenance))
        self._users.append([])
        for v in _distinct(inputs):
            self._users[v.node].append((nid, v.index))
        return _values_of(nid, len(outs))

    # -- patching a graph a pass owns -----------------------------------------------------------
    def detached_copy(self) -> GraphCore:
        """A graph of the same class holding these nodes (the immutable Node objects shared)
        with its own node list, users index, names, source lists, weight store and outputs: a
        pass may patch it (`replace_node`, `drop_after`) without changing this graph."""
        new = type(self)(self.name, record_provenance=False)
        new.nodes = list(self.nodes)
        new._users = [list(u) for u in self._users]
        new._names = dict(self._names)
        new.input_ids = list(self.input_ids)
        new.param_ids = list(self.param_ids)
        new.weights = self.weights.carry()
        new.outputs = list(self.outputs)
        return new

    def replace_node(self, node: Node) -> None:
        """Put `node` where the node with its id is, keeping the users index (in topological
        order) and names right: for a graph a pass owns (`detached_copy`). The new node reads
        earlier nodes only and has as many outputs; inputs and params are not replaced."""
        nid = node.id
        old = self.nodes[nid]
        if old.op.source or node.op.source or len(node.outputs) != len(old.outputs) or \
                any(not 0 <= v.node < nid for v in node.inputs):
            raise GraphError(f"cannot put {node.label} in place of {old.label}: a source, a "
                             "different number of outputs, or an input that is not earlier")
        users = self._users
        before, after = set(old.inputs), set(node.inputs)
        for v in before - after:
            users[v.node].remove((nid, v.index))
        for v in after - before:
            bisect.insort(users[v.node], (nid, v.index))
        if old.name != node.name:
            if node.name is not None and node.name in self._names:
                raise GraphError(f"node name {node.name!r} is already used in graph "
                                 f"{self.name!r}")
            if old.name is not None and self._names.get(old.name) == nid:
                del self._names[old.name]
            if node.name is not None:
                self._names[node.name] = nid
        self.nodes[nid] = node
        self.edits += 1

    def drop_after(self, start: int) -> list[Node]:
        """Remove the nodes from id `start` on (the last appended: nothing before reads them)
        and return them, as if never added (a replacement built at the end, taken off)."""
        dropped = self.nodes[start:]
        if not dropped:
            return dropped
        del self.nodes[start:]
        del self._users[start:]
        self.edits += 1
        users = self._users
        for n in dropped:
            for v in set(n.inputs):
                if v.node < start:  # users are in id order: the dropped readers are a suffix
                    us = users[v.node]
                    while us and us[-1][0] >= start:
                        us.pop()
            if n.name is not None and self._names.get(n.name, -1) >= start:
                del self._names[n.name]
            if n.op.source:
                self.input_ids = [i for i in self.input_ids if i < start]
                self.param_ids = [i for i in self.param_ids if i < start]
                if n.op.kind == "param":
                    self.weights.pop(n.op.name, None)
        return dropped

    def set_outputs(self, outputs: Iterable[Value]) -> None:
        """Declare the graph's results (order matters)."""
        outs = list(outputs)
        for v in outs:
            if not isinstance(v, Value) or not (0 <= v.node < len(self.nodes)) or v.index >= len(
                self.nodes[v.node].outputs
            ):
                raise GraphError(f"output {v!r} is not a value of graph {self.name!r}")
        self.outputs = outs

    # -- queries --------------------------------------------------------------------------------
    def node(self, v: Value | int) -> Node:
        return self.nodes[v.node if isinstance(v, Value) else v]

    def shape_of(self, v: Value) -> Shape:
        """The inferred type of value `v`."""
        try:
            return self.nodes[v.node].outputs[v.index]
        except (IndexError, AttributeError):
            raise GraphError(f"{v!r} is not a value of graph {self.name!r}") from None

    def users(self, v: Value | Node | int) -> list[Node]:
        """Consumer nodes of value `v` (each once), in topological order. A Node or id means
        users of any of its outputs."""
        if isinstance(v, Value):
            return [self.nodes[c] for c, i in self._users[v.node] if i == v.index]
        nid = v.id if isinstance(v, Node) else v
        out, seen = [], set()
        for c, _ in self._users[nid]:
            if c not in seen:
                seen.add(c)
                out.append(self.nodes[c])
        return out

    def reader_ids(self, ids: Iterable[int]) -> set[int]:
        """The ids of the nodes reading any output of the nodes `ids` (one call for a whole
        frontier: graph walks)."""
        users = self._users
        return {c for nid in ids for c, _ in users[nid]}

    def is_output(self, v: Value) -> bool:
        """Whether the graph returns `v`."""
        return v in self._output_set()

    def _output_set(self) -> set[Value]:
        return set(self.outputs)

    def has_name(self, name: str) -> bool:
        """Whether a node of this graph is named `name`."""
        return name in self._names

    def node_by_name(self, name: str) -> Node:
        try:
            return self.nodes[self._names[name]]
        except KeyError:
            raise GraphError(f"graph {self.name!r} has no node named {name!r}") from None

    @property
    def inputs(self) -> list[Node]:
        return [self.nodes[i] for i in self.input_ids]

    @property
    def params(self) -> list[Node]:
        return [self.nodes[i] for i in self.param_ids]

    def input_value(self, name: str) -> Value:
        for i in self.input_ids:
            if self.nodes[i].name == name:
                return Value(i)
        raise GraphError(f"graph {self.name!r} has no input named {name!r}")

    def __len__(self) -> int:
        return len(self.nodes)

    def op_counts(self) -> dict[str, int]:
        """Nodes per op label (sources excluded), e.g. {'matmul': 12, 'gelu': 12}."""
        counts: dict[str, int] = {}
        for n in self.nodes:
            if not n.op.source:
                counts[n.op.label] = counts.get(n.op.label, 0) + 1
        return counts

    def count(self, label_or_cls) -> int:
        """How many nodes have this op label (str) or op class."""
        if isinstance(label_or_cls, str):
            return sum(1 for n in self.nodes if n.op.label == label_or_cls)
        return sum(1 for n in self.nodes if isinstance(n.op, label_or_cls))

    # -- values ---------------------------------------------------------------------------------
    def _register_source(self, kind_list: list[int], vals: tuple[Value, ...]) -> Value:
        kind_list.append(vals[0].node)
        return vals[0]

    def _coerce(self, x, like: Value | None = None) -> Value:
        """A Value for `x`: Values pass through; Python/NumPy scalars and arrays become
        constants (scalars take the dtype of `like`)."""
        if isinstance(x, Value):
            return x
        from .ops.io import Constant

        if isinstance(x, (bool, int, float, np.number)) and not isinstance(x, np.ndarray):
            dt = self.shape_of(like).dtype if like is not None else None
            arr = np.asarray(x, dtype=dt.np if dt is not None else None)
            if dt is None and isinstance(x, float):
                arr = arr.astype(np.float32)  # a Python float is f32, as in `constant`
        elif isinstance(x, np.ndarray):
            arr = x
        else:
            raise GraphError(f"cannot use {type(x).__name__} {x!r} as a graph value")
        dtype_from_numpy(arr.dtype)  # validates
        return self.add_node(Constant(arr), ())[0]
