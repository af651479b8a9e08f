"""`inline_custom_fn_for_autodiff`: the pre-autodiff pass that replaces every `CustomFn` without
derivative overrides by its `fwd_body`, so it differentiates like the plain function. Custom
functions with a `vjp_body` or `jvp_body` stay, and their rules (rules/custom.py) use them."""
from __future__ import annotations

from ..ir.graph import Graph
from ..ir.ops.custom import CustomFn
from ..passes.expand import expand_where

__all__ = ["inline_custom_fn_for_autodiff"]


def inline_custom_fn_for_autodiff(g: Graph) -> Graph:
    """A new graph with every override-free custom_fn node inlined (`g` if there is none)."""
    out, _ = expand_where(g, lambda node, graph: isinstance(node.op, CustomFn)
                          and not node.op.has_overrides)
    return out
