"""The root of a sum of powers, as both importers build vector norms (torch's
linalg_vector_norm, ONNX's ReduceL2 and LpNormalization): at a zero sum the root reads a safe 1
and gives 0, so the gradient of a zero vector's norm is 0, as torch's norm backward has it,
instead of 0 * inf = NaN (sqrt and x^(1/p) have an infinite slope at 0)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..ir.graph import Graph
from ..ir.op import Value

__all__ = ["root_of_sum"]


def root_of_sum(g: Graph, total: Value, root: Callable[[Value], Value]) -> Value:
    """`root(total)`, with 0 and a zero gradient where `total` is 0."""
    dt = g.shape_of(total).dtype
    zero, one = (g.constant(np.asarray(v, dt.np), dt) for v in (0.0, 1.0))
    empty = g.eq(total, zero)
    return g.where(empty, zero, root(g.where(empty, one, total)))
