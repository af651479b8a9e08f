"""FoldAttentionInputScale walks q's and k's chains of scales, casts, layouts and ropes upward
for as long as each node has one reader: no depth bounds it. Its retry hook finds the
attention ops such a walk from a changed node reaches (downward through one-reader nodes), so
sweeps after the first try it only there, and find what whole sweeps find."""
import numpy as np
from helpers import check_same_as_whole_sweeps, whole_sweeps
from hypothesis import given, settings
from hypothesis import strategies as st

import braze as bz
from braze.ir.equality import graph_diff
from braze.passes.canonicalize.attention import FOLD_REPEAT_KV
from braze.passes.canonicalize.attention_input_scale import FOLD_INPUT_SCALE
from braze.passes.canonicalize.heads import HEAD_LAYOUT_RULES
from braze.passes.canonicalize.layout import LAYOUT_RULES
from braze.rewrite import P, Rule, V, rewrite
from braze.testing import assert_equivalent


def _zeros(b, m):
    return b.expand(b.constant(np.float32(0)), m.root.outputs[0].dims)


# x - x -> 0 (exact on the finite feeds here): x loses a reader, which can let a scale fold
FORGET_SELF_DIFF = Rule("ForgetSelfDiff", _zeros, pattern=P.sub(V("x"), V("x")))


def _heads(g, x, e, i, scale=None, extra=None):
    """transpose(reshape(x @ w (* scale), [B, S, 2, E/2])): heads first."""
    p = g.mm(x, g.param(f"w{i}", bz.Shape((e, e))))
    if scale is not None:
        p = g.mul(p, g.constant(np.float32(scale)))
        if extra is not None:
            extra.append(g.sub(p, p))  # a second reader of the scaled projection
    b, s = g.shape_of(x).dims[:2]
    return g.transpose(g.reshape(p, (b, s, 2, e // 2)), (0, 2, 1, 3))


def test_a_scale_whose_second_reader_goes_is_folded_in_the_next_sweep(monkeypatch):
    g = bz.Graph("scaled_q")
    x = g.input("x", bz.Shape((1, 4, 8)))
    extra: list = []
    q = _heads(g, x, 8, 0, scale=0.5, extra=extra)
    out = g.attention(q, _heads(g, x, 8, 1), _heads(g, x, 8, 2))
    g.set_outputs([out, *extra])
    rules = (FORGET_SELF_DIFF, FOLD_INPUT_SCALE)
    res = rewrite(g, rules)
    whole = rewrite(g, tuple(whole_sweeps(r) for r in rules))
    assert res.stats["FoldAttentionInputScale"].matches == 1  # the second sweep, 3 edges up
    assert graph_diff(res.graph, whole.graph) is None
    assert res.graph.count("mul") == 0
    assert_equivalent(g, res.graph, params=bz.init_params(g, 0), rtol=1e-4, atol=1e-5)
    # a depth that stops short of the scale misses it: the hook is what finds it
    monkeypatch.setattr(FOLD_INPUT_SCALE, "retry", None)
    monkeypatch.setattr(FOLD_INPUT_SCALE, "depth", 1)
    monkeypatch.setattr(FOLD_INPUT_SCALE, "reads_users", 1)
    assert rewrite(g, rules).stats["FoldAttentionInputScale"].matches == 0


RULES = LAYOUT_RULES + HEAD_LAYOUT_RULES + (FOLD_REPEAT_KV, FOLD_INPUT_SCALE,
                                            FORGET_SELF_DIFF)


@st.composite
def scaled_attention_graphs(draw):
    """Attention over q / k / v head splits of projections, each under random scales, casts,
    identity layouts, transpose pairs and reshape pairs, some read twice (by a self
    difference that a rule removes, or by an output)."""
    g = bz.Graph("scaled")
    x = g.input("x", bz.Shape((1, 4, 8)))
    outs: list = []
    sides = []
    for i in range(3):
        v = g.mm(x, g.param(f"w{i}", bz.Shape((8, 8))))
        v = g.reshape(v, (1, 4, 2, 4))
        for _ in range(draw(st.integers(0, 5))):
            step = draw(st.sampled_from(["mul", "div", "cast", "ident", "tpair", "rpair"]))
            if step == "mul":
                v = g.mul(v, g.constant(np.float32(draw(st.sampled_from([0.5, 2.0])))))
            elif step == "div":
                v = g.div(v, g.constant(np.float32(2.0)))
            elif step == "cast":
                v = g.cast(v, bz.f32)
            elif step == "ident":
                v = g.transpose(v, (0, 1, 2, 3))
            elif step == "tpair":
                v = g.transpose(g.transpose(v, (0, 2, 1, 3)), (0, 2, 1, 3))
            else:
                v = g.reshape(g.reshape(v, (1, 4, 8)), (1, 4, 2, 4))
            second = draw(st.sampled_from([None, None, "diff", "output"]))
            if second == "diff":
                outs.append(g.sub(v, v))
            elif second == "output":
                outs.append(v)
        sides.append(g.transpose(v, (0, 2, 1, 3)))
    g.set_outputs([g.attention(*sides), *outs])
    return g


@settings(max_examples=120, deadline=None)
@given(g=scaled_attention_graphs())
def test_input_scales_near_the_changes_match_whole_sweeps(g):
    check_same_as_whole_sweeps(g, RULES, max_sweeps=32)
