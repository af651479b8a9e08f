"""Logical kernels to primitives, for a backend without native kernels for them.

`lower_logical_kernels(g, kinds)` rewrites the logical ops (layer_norm, rms_norm, softmax,
log_softmax, attention, rope, the activations gelu, gelu_approx, silu, quick_gelu, hard_swish,
relu6) and every fused kind into primitives through each op's own `decompose`, repeatedly, so
a fused transformer layer ends as matmuls, reductions and elementwise math. `kinds` (op
labels) limits which are lowered; ops produced by a decomposition are lowered too when their
label is in it.

The composite kinds need no registry entry (`rewrite_for_backend` decomposes a composite its
target does not claim), but the activations are primitive ops of kind "unary": the registered
`LowerLogicalActivations` is how a target that does not claim "gelu" still gets a graph."""
from __future__ import annotations

from collections.abc import Iterable

from ...errors import GraphError
from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.op import OP_REGISTRY, Op, Value
from ...ir.ops.elementwise import LOGICAL_UNARY, Unary
from ..expand import MAX_DEPTH, replace_nodes
from .registry import Lowering, register_lowering

LOGICAL_ACTIVATIONS = frozenset(fn.value for fn in LOGICAL_UNARY)
LOGICAL_KINDS = frozenset({"layer_norm", "rms_norm", "softmax", "log_softmax", "attention",
                           "rope"}) | LOGICAL_ACTIVATIONS


def _fused_kinds() -> frozenset[str]:
    return frozenset(k for k, cls in OP_REGISTRY.items() if cls.fused)


def _decomposable(op: Op) -> bool:
    return op.composite or (isinstance(op, Unary) and op.fn in LOGICAL_UNARY)


def decomposable_labels() -> frozenset[str]:
    """Every label `lower_logical_kernels` can lower: composite kinds and logical activations."""
    composite = {label for cls in OP_REGISTRY.values() if cls.composite for label in cls.labels()}
    return frozenset(composite) | LOGICAL_ACTIVATIONS


def _wanted(kinds: Iterable[str] | None) -> frozenset[str]:
    if kinds is None:
        return LOGICAL_KINDS | _fused_kinds()
    wanted = frozenset([kinds] if isinstance(kinds, str) else kinds)
    unknown = wanted - decomposable_labels()
    if unknown:
        raise GraphError(f"lower_logical_kernels cannot lower {sorted(unknown)}: only composite "
                         f"kinds and the logical activations decompose; known: "
                         f"{', '.join(sorted(decomposable_labels()))}")
    return wanted


def _decompose(new: Graph, node: Node, ins: list[Value], old: Graph):
    return node.op.decompose(new, ins)


def lower_logical_kernels(g: Graph, kinds: Iterable[str] | None = None) -> Graph:
    """`g` with every op whose label is in `kinds` (default: the logical ops and every fused
    kind) replaced by its decomposition, until none is left. Returns `g` itself when nothing
    applies; the input graph is never changed. An unknown or primitive label in `kinds` is a
    GraphError listing the labels that can be lowered."""
    wanted = _wanted(kinds)

    def pick(node: Node, graph: Graph):
        return _decompose if node.op.label in wanted and _decomposable(node.op) else None

    for _ in range(MAX_DEPTH):
        if not any(pick(n, g) for n in g.nodes):
            return g
        g = replace_nodes(g, pick)
    raise GraphError(f"lower_logical_kernels: decompositions still produce {sorted(wanted)} "
                     f"after {MAX_DEPTH} rounds")


def _is_logical_activation(node: Node, g: Graph) -> bool:
    return isinstance(node.op, Unary) and node.op.fn in LOGICAL_UNARY


LOWER_LOGICAL_ACTIVATIONS = Lowering(
    "LowerLogicalActivations", frozenset({"unary"}), _decompose, when=_is_logical_activation,
    doc="gelu, gelu_approx, silu, quick_gelu, hard_swish, relu6 -> erf / tanh / sigmoid / clamp "
        "arithmetic")
LowerLogicalActivations = register_lowering(LOWER_LOGICAL_ACTIVATIONS)
