"""Names for what a pass adds: a weight or node name free in both the graph being rewritten
and the one being built."""
from __future__ import annotations

from ..ir.graph_core import GraphCore

__all__ = ["fresh_name"]


def fresh_name(old: GraphCore, new: GraphCore, base: str) -> str:
    """`base`, or `base#2`, `base#3`, ...: no node of either graph and no stored weight of
    `new` has it (old nodes may still be copied into `new`)."""
    name, i = base, 1
    while old.has_name(name) or new.has_name(name) or name in new.weights:
        i += 1
        name = f"{base}#{i}"
    return name
