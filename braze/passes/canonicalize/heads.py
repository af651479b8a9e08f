"""q and k in the canonical head layout: rope applied before the head transpose (GPT-J rotates
[B, S, H, D] and then transposes to [B, H, S, D]) moves after it, its cos / sin tables
transposed alike, so the attention block fusion sees rope(transpose(reshape(x @ w))):

  transpose(rope(x, cos, sin), p)  ->  rope(transpose(x, p), p(cos), p(sin))   (p keeps D last)

Rope is elementwise over positions (every axis but the last), so permuting those axes before or
after it is the same; tables of lower rank are padded with leading unit axes first."""
from __future__ import annotations

from ...ir.ops.attention import Rope
from ...ir.ops.shape import Transpose
from ...rewrite import Match, Rule
from .layout import LIVE_READS, live_users

__all__ = ["ROPE_BEFORE_TRANSPOSE", "HEAD_LAYOUT_RULES"]


def _matcher(g, node, ctx):
    perm = node.op.perm
    rope = g.nodes[node.inputs[0].node]
    if not isinstance(rope.op, Rope) or perm[-1] != len(perm) - 1:
        return
    if len(live_users(g, rope.value)) != 1 or g.is_output(rope.value):
        return
    x, cos, sin = rope.inputs
    yield Match(ROPE_BEFORE_TRANSPOSE, g, node, {"root": node, "rope": rope},
                {"x": x, "cos": cos, "sin": sin}, (node.id,))  # the dead rope goes in DCE


def _table(b, t, perm):
    dims = b.shape_of(t).dims
    rank = len(perm)
    if len(dims) < rank:
        t = b.reshape(t, (1,) * (rank - len(dims)) + tuple(dims))
    return b.transpose(t, perm)


def _build(b, m):
    perm = m.root.op.perm
    x = b.transpose(m.v("x"), perm)
    op = m.op("rope")
    return b.rope(x, _table(b, m.v("cos"), perm), _table(b, m.v("sin"), perm),
                  interleaved=op.interleaved, n_rot=op.n_rot)


ROPE_BEFORE_TRANSPOSE = Rule("RopeAfterHeadTranspose", _build, matcher=_matcher,
                             root_test=lambda op: isinstance(op, Transpose),
                             depth=2, reads_users=LIVE_READS)  # transpose <- rope <- x, tables

HEAD_LAYOUT_RULES = (ROPE_BEFORE_TRANSPOSE,)
