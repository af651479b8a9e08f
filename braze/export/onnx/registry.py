"""Which braze op maps to which ONNX nodes: `EXPORTERS[op class](builder, node, input names,
target) -> output names`, with an optional per-class `accept(node, graph, target)` saying when
the mapping applies (a composite node it does not accept is exported as its decomposition)."""
from __future__ import annotations

from collections.abc import Callable

__all__ = ["EXPORTERS", "ACCEPTS", "TARGETS", "exporter", "accepts"]

TARGETS = ("onnxruntime", "standard")
EXPORTERS: dict[type, Callable] = {}
ACCEPTS: dict[type, Callable] = {}


def exporter(*classes, accept: Callable | None = None):
    def deco(fn):
        for cls in classes:
            EXPORTERS[cls] = fn
            if accept is not None:
                ACCEPTS[cls] = accept
        return fn

    return deco


def accepts(node, graph, target: str) -> bool:
    """Whether `node` is written by its own mapping for `target` (else: decomposed)."""
    cls = type(node.op)
    if node.op.source:
        return True
    if cls not in EXPORTERS:
        return False
    rule = ACCEPTS.get(cls)
    return rule is None or bool(rule(node, graph, target))
