"""LowerResizeNearest2x: resize_nearest_2x `[N, C, H, W]` -> reshape to `[N, C, H, 1, W, 1]`,
expand to `[N, C, H, 2, W, 2]` and reshape to `[N, C, 2H, 2W]`: each pixel repeated 2x2 with
views and one broadcast, no gather, for backends without an upsampling kernel."""
from __future__ import annotations

from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.op import Value
from .registry import Lowering, register_lowering


def lower_resize_nearest_2x(g: Graph, node: Node, ins: list[Value], old: Graph) -> Value:
    """Build 2x nearest upsampling `node` from reshape, expand, reshape in `g`."""
    (x,) = ins
    n, c, h, w = g.shape_of(x).dims
    spread = g.expand(g.reshape(x, (n, c, h, 1, w, 1)), (n, c, h, 2, w, 2))
    return g.reshape(spread, (n, c, 2 * h, 2 * w))


LOWER_RESIZE_NEAREST_2X = Lowering(
    "LowerResizeNearest2x", frozenset({"resize_nearest_2x"}), lower_resize_nearest_2x,
    doc="resize_nearest_2x -> reshape + expand + reshape (each pixel repeated 2x2)")
LowerResizeNearest2x = register_lowering(LOWER_RESIZE_NEAREST_2X)
