"""`prepare_graph_for_ad`: the one place that turns a graph into what the autodiff engines walk.
Fused kinds are unfused, and every composite op without a VJP rule (logical ops, regions,
backward ops) is replaced by its decomposition, repeatedly, so each remaining node has a rule or
is marked non-differentiable. Custom functions without derivative overrides are inlined,
checkpointed scans become scans over segments (`convert_scans_for_ad`), control-flow bodies'
params become graph params (`lift_body_params`) and bounded loops `if`-guarded steps
(`guard_loops_for_ad`) first."""
from __future__ import annotations

from ..errors import AutodiffError
from ..ir.graph import Graph
from ..passes.expand import expand_nodes
from ..passes.unfuse import unfuse_fused_for_autodiff
from .control import guard_loops_for_ad, lift_body_params
from .custom import inline_custom_fn_for_autodiff
from .registry import differentiability, get_vjp, non_differentiable_reason
from .scan import convert_scans_for_ad

__all__ = ["prepare_graph_for_ad", "check_differentiable"]


def prepare_graph_for_ad(g: Graph) -> Graph:
    """A new graph, numerically equal to `g`, whose every op has a VJP rule or a
    non-differentiable mark: fused ops unfused, override-free custom functions inlined,
    checkpointed scans segmented, composite ops without a rule decomposed.
    Raises AutodiffError naming the first node (label and provenance) that has neither."""
    out = convert_scans_for_ad(inline_custom_fn_for_autodiff(unfuse_fused_for_autodiff(g)))
    out = guard_loops_for_ad(lift_body_params(out))
    out, _ = expand_nodes(out, lambda op: get_vjp(op) is None
                          and non_differentiable_reason(op) is None)
    check_differentiable(out)
    return out


def check_differentiable(g: Graph) -> None:
    """AutodiffError unless every node's op has a rule or a non-differentiable mark."""
    for node in g.nodes:
        if differentiability(node.op) in ("rule", "non_differentiable"):
            continue
        raise AutodiffError(
            f"{node.describe()}: op {node.op.kind!r} has no VJP rule, no decomposition and no "
            "non_differentiable mark; register one in braze/autodiff/rules/")
