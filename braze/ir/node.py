"""A node of a braze graph: an op applied to input values, with inferred output types."""
from __future__ import annotations

from dataclasses import dataclass

from .op import Op, Value
from .shapes import Shape


@dataclass(frozen=True, slots=True)
class Node:
    """One op application. `outputs` are inferred types; `provenance` says where it came from
    (builder call site, ONNX node name, torch module path, or the pass that created it)."""

    id: int
    op: Op
    inputs: tuple[Value, ...]
    outputs: tuple[Shape, ...]
    name: str | None = None
    provenance: str | None = None

    @property
    def value(self) -> Value:
        """The first (usually only) output."""
        return Value(self.id, 0)

    @property
    def values(self) -> tuple[Value, ...]:
        if len(self.outputs) == 1:
            return (Value(self.id, 0),)
        return tuple(Value(self.id, i) for i in range(len(self.outputs)))

    @property
    def label(self) -> str:
        """`name` if set, else `%id`, plus the op kind: how errors and reports name a node."""
        who = self.name or f"%{self.id}"
        return f"{who} ({self.op.label})"

    def describe(self) -> str:
        """Label with provenance, for errors and reports."""
        return self.label + (f" from {self.provenance}" if self.provenance else "")
