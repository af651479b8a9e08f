"""MaterializeStaticGenerators: `range` and `sym_const` nodes whose dims are all static become
constants (the op's own reference, evaluated once), for backends that claim `constant` but no
generator kernel. Lowered losses build their one-hot with a range over the class axis, so a
backend of primitives needs this to run them. Symbolic lengths are left alone: their values
exist only at run time."""
from __future__ import annotations

from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.op import Value
from .registry import Lowering, register_lowering


def _static(node: Node, g: Graph) -> bool:
    op = node.op
    dims = (op.length,) if op.kind == "range" else op.values
    return all(isinstance(d, int) for d in dims)


def materialize_generator(g: Graph, node: Node, ins: list[Value], old: Graph) -> Value:
    """Build a constant holding what the static generator `node` produces."""
    return g.constant(node.op.reference(symbols={}), dtype=node.op.dtype)


MATERIALIZE_STATIC_GENERATORS = Lowering(
    "MaterializeStaticGenerators", frozenset({"range", "sym_const"}), materialize_generator,
    when=_static, doc="range / sym_const with static dims -> constant")
MaterializeStaticGenerators = register_lowering(MATERIALIZE_STATIC_GENERATORS)
