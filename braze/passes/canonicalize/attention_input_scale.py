"""`FoldAttentionInputScale`: constant scales of q or k fold into an attention op's score
scale. A frontend that makes the attention op directly (torch's sdpa after OPT / BART scale the
projection) leaves attention(split(x @ w * c), ...); the rule makes it
attention(split(x @ w), ..., scale * c), so the head split reads the projection again and the
QKV fusions see it."""
from __future__ import annotations

import math
from dataclasses import replace

from ...ir.ops.attention import Attention
from ...rewrite import Match, Rule
from .attention import _Parse, _peel_scales, _replay, _single_use

__all__ = ["FOLD_INPUT_SCALE"]


def _input_scale_matcher(g, node, ctx):
    """q or k of an attention op is scaled by constants (mul / div), possibly under its head
    split: the scale moves into the op. Only scales read by nothing else are peeled, and only
    when the unscaled value keeps the input's dtype (a cast between them stays)."""
    op, d = node.op, node.inputs[0]
    if op.scale is None and not isinstance(g.shape_of(d).dims[-1], int):
        return  # the default scale 1/sqrt(D) of a symbolic D cannot take a factor
    factor, consumed, values, layouts = 1.0, [node.id], {}, {}
    for side, v in (("q", node.inputs[0]), ("k", node.inputs[1])):
        parse = _Parse()
        base = _peel_scales(g, v, parse, side, through_rope=True)
        if base != v and not _single_use(g, g.nodes[v.node]):
            base = v  # v's producer is read elsewhere too (asked only when it would peel)
        if base == v or g.shape_of(base).dtype != g.shape_of(v).dtype:
            values[side] = v
            continue
        factor *= parse.scale
        consumed += parse.consumed
        values[f"{side}0"] = base
        layouts[side] = tuple(_named_rope_tables(getattr(parse, f"{side}_layout"), side, values))
    if not layouts:
        return
    values["v"] = node.inputs[2]
    if len(node.inputs) > 3:
        values["mask"] = node.inputs[3]
    yield Match(FOLD_INPUT_SCALE, g, node, {"root": node}, values, tuple(consumed),
                data={"factor": factor, "layouts": layouts})


def _named_rope_tables(layout, side, values):
    """The layout ops with each rope's (cos, sin) replaced by names entered in `values` (a
    replacement reads outside values through its match)."""
    for i, op in enumerate(layout):
        if isinstance(op, tuple):
            names = tuple(f"{side}_rope{i}_{j}" for j in range(len(op[1])))
            values.update(zip(names, op[1]))
            op = (op[0], names)
        yield op


def _build_input_scale(b, m):
    op = m.root.op
    layouts = {side: tuple((o[0], tuple(m.v(n) for n in o[1])) if isinstance(o, tuple) else o
                           for o in ops) for side, ops in m.data["layouts"].items()}
    q, k = (_replay(b, m.v(f"{s}0"), layouts[s]) if s in layouts else m.v(s) for s in "qk")
    d = b.shape_of(q).dims[-1]
    default = 1.0 / math.sqrt(d) if isinstance(d, int) else None
    scale = (op.scale if op.scale is not None else default) * m.data["factor"]
    if default is not None and math.isclose(scale, default, rel_tol=1e-6):
        scale = None
    ins = [q, k, m.v("v")] + ([m.v("mask")] if "mask" in m.values else [])
    return b.add_node(replace(op, scale=scale), ins)[0]


def _attentions_below(g, changed: set[int]) -> set[int]:
    """The attention nodes whose input-scale match may read a node of `changed` (the
    FoldAttentionInputScale retry hook). From an attention op, the matcher reads q's and k's
    producers, then walks up while each node has one reader and is not an output
    (`_single_use`), reading each node's op, inputs, the producers of a mul / div's operands,
    and the readers of the node where it stops. So an attention reads a changed node X only
    when it is one of X's readers, or is reached from one by following nodes that have
    exactly one reader (the one-reader walk below over-approximates)."""
    roots: set[int] = set()
    seen: set[int] = set()
    stack = list(changed) + list(g.reader_ids(changed))
    while stack:
        nid = stack.pop()
        if nid in seen:
            continue
        seen.add(nid)
        if isinstance(g.nodes[nid].op, Attention):
            roots.add(nid)
            continue
        readers = g.reader_ids((nid,))
        if len(readers) == 1:
            stack.extend(readers)
    return roots


FOLD_INPUT_SCALE = Rule("FoldAttentionInputScale", _build_input_scale,
                        matcher=_input_scale_matcher,
                        root_test=lambda op: isinstance(op, Attention),
                        retry=_attentions_below,
                        # a match peels a mul / div by a constant or a dtype-keeping cast
                        requires=frozenset({(Attention,), ("mul", "div", "cast")}))
