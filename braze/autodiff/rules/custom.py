"""VJP and JVP rules of `CustomFn`: the override bodies inlined (JAX custom_vjp / custom_jvp).

Reverse mode inlines `vjp_body(primals, outputs, cotangents)`; with only a `jvp_body` it
transposes that (linear) body. Forward mode inlines `jvp_body(primals, tangents)`; with only a
`vjp_body` it transposes the VJP. Without overrides both go through `fwd_body` (normally
`prepare_graph_for_ad` has inlined such nodes already)."""
from __future__ import annotations

from ...ir.graph import Graph
from ...ir.node import Node
from ...ir.ops._body import inline_body
from ...ir.ops.custom import CustomFn
from ..emit import add_optional, is_float, zeros
from ..forward import _transposed_vjp
from ..registry import jvp_rule, vjp_rule
from ..reverse import backpropagate
from ._composite import jvp_through_decomposition


def _filled(b: Graph, vals, types):
    return [v if v is not None else zeros(b, t) for v, t in zip(vals, types)]


def _float_only(b: Graph, vals):
    return [v if v is not None and is_float(b.shape_of(v)) else None for v in vals]


def _vjp_through_jvp_body(b: Graph, node: Node, ins, cts):
    """Transpose `jvp_body`: probe tangents (zeros) in, reverse mode from the output tangents
    seeded with the cotangents back to the probes."""
    probes = [zeros(b, b.shape_of(v)) for v in ins]
    return _pull_back(b, node.op.jvp_body, [*ins, *probes], cts, probes)


def _pull_back(b: Graph, body: Graph, body_ins, cts, wrt):
    """Inline `body` reading `body_ins`, then reverse mode from its outputs (seeded with `cts`)
    back to the values `wrt`; their cotangents (None for non-float or unreached)."""
    start = len(b.nodes)
    seeds = {}
    for r, ct in zip(inline_body(b, body, body_ins), cts):
        if ct is not None and is_float(b.shape_of(r)):
            seeds[r] = add_optional(b, seeds.get(r), ct)
    found = backpropagate(b.nodes[start:], b, lambda v: v, seeds, {v.node for v in wrt})
    return _float_only(b, [found.get(v) for v in wrt])


@vjp_rule(CustomFn)
def _custom_fn_vjp(b: Graph, node: Node, ins, outs, cts):
    op: CustomFn = node.op
    if op.vjp_body is not None:
        in_cts = inline_body(b, op.vjp_body, [*ins, *outs, *_filled(b, cts, node.outputs)])
        return _float_only(b, in_cts)
    if op.jvp_body is not None:
        return _vjp_through_jvp_body(b, node, ins, cts)
    return _pull_back(b, op.fwd_body, ins, cts, ins)


@jvp_rule(CustomFn)
def _custom_fn_jvp(b: Graph, node: Node, ins, outs, tangents):
    op: CustomFn = node.op
    if op.jvp_body is not None:
        ts = [t if t is not None else zeros(b, b.shape_of(v)) for t, v in zip(tangents, ins)]
        return _float_only(b, inline_body(b, op.jvp_body, [*ins, *ts]))
    if op.vjp_body is not None:
        return _transposed_vjp(b, node, ins, outs, tangents)
    return jvp_through_decomposition(b, node, ins, outs, tangents)
