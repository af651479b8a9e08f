"""Graph-handling queries under RLX's names: `shape`, `is_empty`, `use_count`, `topo_order`,
`reverse_topo`, `has_dynamic_dims`, `dynamic_symbols`, `bind` (specialize symbolic dims) and
`inspect` (an annotated text dump of the graph, or of one node or value).

Node ids are RLX's NodeIds: `g.node(i)` gives the node, and nodes are stored in topological
order, so `topo_order()` is their ids in order."""
from __future__ import annotations

from collections.abc import Mapping

from ..errors import GraphError
from .bind import bind_dims, check_bindings, graph_symbols
from .node import Node
from .op import Value
from .shapes import Shape

__all__ = ["GraphQueries"]


class GraphQueries:
    def use_count(self, v: Value | Node | int, *, include_outputs: bool = False) -> int:
        """How many nodes read `v` (each consumer once: `mul(x, x)` is one use). A Node or id
        counts users of any of its outputs. `include_outputs=True` also counts each place the
        graph returns it, which is what decides whether a value may be rewritten away."""
        ref = self._as_ref(v)
        n = len(self.users(ref))
        if include_outputs:
            if isinstance(ref, Value):
                n += self.outputs.count(ref)
            else:
                n += sum(1 for o in self.outputs if o.node == _ref_id(ref))
        return n

    def shape(self, v: Value) -> Shape:
        """RLX's name for `shape_of`: the type of value `v`."""
        return self.shape_of(v)

    def is_empty(self) -> bool:
        """Whether the graph has no nodes."""
        return not self.nodes

    def topo_order(self) -> list[int]:
        """Node ids in topological order (inputs before their users): insertion order."""
        return list(range(len(self.nodes)))

    def reverse_topo(self) -> list[int]:
        """Node ids with every node before the nodes it reads (outputs first)."""
        return list(range(len(self.nodes) - 1, -1, -1))

    def dynamic_symbols(self) -> list[str]:
        """The symbolic dim names the graph mentions (value types and op dim attributes),
        sorted. "batch*seq" mentions both names."""
        return sorted(graph_symbols(self))

    def has_dynamic_dims(self) -> bool:
        """Whether any value type or op dim attribute still has a symbolic dim."""
        return bool(graph_symbols(self))

    def bind(self, bindings: Mapping[str, int] | None = None, /, **dims: int):
        """A new graph with symbolic dims replaced by ints everywhere and types re-inferred:
        `g.bind({"batch": 2, "seq": 16})` or `g.bind(batch=2, seq=16)`. Unbound symbols stay
        symbolic. GraphError for a symbol the graph lacks, a value that is not an int >= 0,
        or one symbol given two values; ShapeError naming the node a binding makes invalid."""
        return bind_dims(self, check_bindings(self, bindings, dims))

    def inspect(self, v: Value | Node | int | str | None = None) -> str:
        """Annotated text: with no argument, the whole graph (each node's text IR line, its
        users and whether the graph returns it); with a value, node, id or node name, that
        node: op and attributes, inputs with their types, each output's type, users and
        output position, and provenance."""
        if v is None:
            return self._inspect_graph()
        return self._inspect_node(self._as_node(v), v if isinstance(v, Value) else None)

    # -- helpers --------------------------------------------------------------------------------
    def _as_ref(self, v) -> Value | Node | int:
        if isinstance(v, (Value, Node)):
            if not 0 <= _ref_id(v) < len(self.nodes):
                raise GraphError(f"{v!r} is not in graph {self.name!r}")
            return v
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(self.nodes):
            return v
        raise GraphError(f"{v!r} is not a node id, node or value of graph {self.name!r}")

    def _as_node(self, v) -> Node:
        if isinstance(v, str):
            return self.node_by_name(v)
        return self.node(self._as_ref(v))

    def _inspect_graph(self) -> str:
        from .printer import format_node

        syms = self.dynamic_symbols()
        head = (f"graph {self.name!r}: {len(self.nodes)} nodes, {len(self.input_ids)} inputs, "
                f"{len(self.param_ids)} params, {len(self.outputs)} outputs; symbolic dims: "
                f"{', '.join(syms) if syms else 'none'}")
        lines = [head]
        for node in self.nodes:
            lines.append(format_node(self, node, 2))
            notes = self._node_notes(node)
            if notes:
                lines.append("      ; " + "; ".join(notes))
        return "\n".join(lines)

    def _node_notes(self, node: Node) -> list[str]:
        from .printer import format_ref

        notes = []
        for val in node.values:
            users = self.users(val)
            tag = f"{format_ref(self, val)}: " if len(node.outputs) > 1 else ""
            where = [i for i, o in enumerate(self.outputs) if o == val]
            parts = []
            if users:
                parts.append(f"{len(users)} user{'s' if len(users) > 1 else ''} "
                             f"({', '.join(format_ref(self, u.value) for u in users)})")
            if where:
                parts.append(f"graph output {', '.join(map(str, where))}")
            if not users and not where:
                parts.append("unused")
            notes.append(tag + ", ".join(parts))
        return notes

    def _inspect_node(self, node: Node, only: Value | None) -> str:
        from .printer import format_node, format_op, format_ref

        lines = [format_node(self, node, 0).rstrip(),
                 f"  op: {format_op(node.op)} ({type(node.op).__name__})"]
        for pos, v in enumerate(node.inputs):
            src = self.nodes[v.node]
            lines.append(f"  input {pos}: {format_ref(self, v)} {self.shape_of(v)} "
                         f"from {src.op.label}")
        for val, shape in zip(node.values, node.outputs):
            if only is not None and val != only:
                continue
            users = self.users(val)
            who = ", ".join(u.label for u in users) or "none"
            where = [i for i, o in enumerate(self.outputs) if o == val]
            ret = f"; graph output {', '.join(map(str, where))}" if where else ""
            lines.append(f"  output {val.index}: {format_ref(self, val)} {shape}; "
                         f"users ({len(users)}): {who}{ret}")
        lines.append(f"  provenance: {node.provenance or 'unknown'}")
        return "\n".join(lines)


def _ref_id(v: Value | Node | int) -> int:
    if isinstance(v, Value):
        return v.node
    return v.id if isinstance(v, Node) else v
