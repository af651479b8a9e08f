"""CanonicalizeAttention after its first sweep: the rule needs a softmax (every match and near
miss walks back from its root to one), so a graph without one is not swept again; where a
softmax is left, its retry hook tries it only at the matmuls whose walk back may read a
changed node, and finds what whole sweeps find (hypothesis, against whole sweeps)."""
import dataclasses

import numpy as np
from helpers import check_same_as_whole_sweeps
from hypothesis import given, settings
from hypothesis import strategies as st
from test_input_scale_retry import FORGET_SELF_DIFF  # x - x -> 0

import braze as bz
from braze.ir.ops.attention import MaskKind
from braze.passes.canonicalize.attention import CANONICALIZE_ATTENTION
from braze.rewrite import P, Rule, V, rewrite
from braze.testing import assert_equivalent


def _attention(g, x, i, e=8, mask=None):
    """softmax(q @ k^T * c (+ mask)) @ v over two heads of x's projections."""
    def heads(j):
        p = g.mm(x, g.param(f"w{i}_{j}", bz.Shape((e, e))))
        return g.transpose(g.reshape(p, (1, 4, 2, e // 2)), (0, 2, 1, 3))

    q, k, v = heads(0), heads(1), heads(2)
    s = g.mul(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), g.constant(np.float32(0.5)))
    if mask is not None:
        s = g.add(s, mask)
    o = g.matmul(g.softmax(s, -1), v)
    return g.reshape(g.transpose(o, (0, 2, 1, 3)), (1, 4, e))


def _counting(monkeypatch):
    calls: list[int] = []
    inner = CANONICALIZE_ATTENTION.matcher

    def matcher(g, node, ctx):
        calls.append(node.id)
        yield from inner(g, node, ctx)

    monkeypatch.setattr(CANONICALIZE_ATTENTION, "matcher", matcher)
    return calls


def test_no_sweep_after_the_last_softmax_is_canonicalized(monkeypatch):
    g = bz.Graph("two_layers")
    x = g.input("x", bz.Shape((1, 4, 8)))
    g.set_outputs([_attention(g, _attention(g, x, 0), 1)])
    matmuls = g.count("matmul")
    calls = _counting(monkeypatch)
    res = rewrite(g, (CANONICALIZE_ATTENTION,))
    assert res.stats["CanonicalizeAttention"].matches == 2
    assert res.graph.count("attention") == 2 and res.graph.count("softmax") == 0
    # the first sweep's roots only (less the two scores matmuls, claimed by then)
    assert len(calls) == matmuls - 2
    assert_equivalent(g, res.graph, params=bz.init_params(g, 0), rtol=1e-4, atol=1e-5)
    # without the requirement the second sweep tries every matmul left
    monkeypatch.setattr(CANONICALIZE_ATTENTION, "requires", frozenset())
    calls.clear()
    rewrite(g, (CANONICALIZE_ATTENTION,))
    assert len(calls) > matmuls


def test_a_graph_without_softmax_is_not_tried(monkeypatch):
    g = bz.Graph("mlp")
    x = g.input("x", bz.Shape((4, 8)))
    g.set_outputs([g.mm(g.relu(g.mm(x, g.param("w0", bz.Shape((8, 8))))),
                        g.param("w1", bz.Shape((8, 8))))])
    calls = _counting(monkeypatch)
    res = rewrite(g, (CANONICALIZE_ATTENTION,))
    assert not res.changed and calls == []
    assert dataclasses.asdict(res.stats["CanonicalizeAttention"])["attempts"] == 0


def test_a_bias_sharing_a_mask_seen_param_free_is_still_a_bias():
    """The later layer (matched first) reads the mask alone: its nodes are remembered as free
    of params; the earlier layer's bias adds a learned table to that mask."""
    g = bz.Graph("mask_and_bias")
    x = g.input("x", bz.Shape((1, 4, 8)))
    keep = g.input("keep", bz.Shape((1, 1, 1, 4)))
    mask = g.mul(g.sub(g.constant(np.float32(1)), keep), g.constant(np.float32(-1e4)))
    bias = g.add(mask, g.param("rel", bz.Shape((1, 2, 4, 4))))
    g.set_outputs([_attention(g, _attention(g, x, 0, mask=bias), 1, mask=mask)])
    res = rewrite(g, (CANONICALIZE_ATTENTION,))
    kinds = [n.op.mask for n in res.graph.nodes if n.op.kind == "attention"]
    assert kinds == [MaskKind.BIAS, MaskKind.CUSTOM]
    assert_equivalent(g, res.graph, params=bz.init_params(g, 0), rtol=1e-4, atol=1e-5)


def _same(b, m):
    return m.v("x")


# neg(neg(x)) -> x: a walk stopped by the pair goes through in the next sweep
DROP_DOUBLE_NEG = Rule("DropDoubleNeg", _same, pattern=P.neg(P.neg(V("x"))))


def _maybe(g, v, draw, outs):
    """v under 0-3 steps: a removable neg pair, a cast, a second reader that a rule removes,
    or an extra output."""
    for _ in range(draw(st.integers(0, 3))):
        step = draw(st.sampled_from(["negs", "cast", "cast", "diff", "output"]))
        if step == "negs":
            v = g.neg(g.neg(v))
        elif step == "cast":
            v = g.cast(v, bz.f32)
        elif step == "diff":
            outs.append(g.sub(v, v))
        else:
            outs.append(v)
    return v


@st.composite
def attention_graphs(draw):
    """Two attention layers in primitives with removable neg pairs, casts and second readers
    drawn on q, k, v, the scores, the mask and the probabilities."""
    g = bz.Graph("random_attention")
    x = g.input("x", bz.Shape((1, 4, 8)))
    mask = g.input("mask", bz.Shape((1, 1, 4, 4)))
    outs: list = []
    h = x
    for i in range(2):
        sides = []
        for j in range(3):
            p = _maybe(g, g.mm(h, g.param(f"w{i}_{j}", bz.Shape((8, 8)))), draw, outs)
            t = g.transpose(g.reshape(p, (1, 4, 2, 4)), (0, 2, 1, 3))
            sides.append(_maybe(g, t, draw, outs))
        q, k, v = sides
        s = g.matmul(q, g.transpose(k, (0, 1, 3, 2)))
        s = _maybe(g, g.mul(s, g.constant(np.float32(0.5))), draw, outs)
        if draw(st.booleans()):
            s = _maybe(g, g.add(s, _maybe(g, mask, draw, outs)), draw, outs)
        probs = _maybe(g, g.softmax(s, -1), draw, outs)
        o = g.matmul(probs, v)
        h = g.reshape(g.transpose(o, (0, 2, 1, 3)), (1, 4, 8))
    g.set_outputs([h, *outs])
    return g


RULES = (CANONICALIZE_ATTENTION, DROP_DOUBLE_NEG, FORGET_SELF_DIFF)


@settings(max_examples=150, deadline=None)
@given(g=attention_graphs())
def test_attention_near_the_changes_matches_whole_sweeps(g):
    check_same_as_whole_sweeps(g, RULES)


def test_a_neg_pair_above_the_probabilities_casts_is_found_in_the_next_sweep(monkeypatch):
    """softmax -> neg -> neg -> cast -> cast -> matmul: the first sweep's walk back from the
    matmul stops at a neg (no match, no near miss); the pair goes, and the root is two edges
    below the rewired cast."""
    g = bz.Graph("negs")
    x = g.input("x", bz.Shape((1, 4, 8)))
    heads = [g.transpose(g.reshape(g.mm(x, g.param(f"w{j}", bz.Shape((8, 8)))),
                                   (1, 4, 2, 4)), (0, 2, 1, 3)) for j in range(3)]
    s = g.mul(g.matmul(heads[0], g.transpose(heads[1], (0, 1, 3, 2))), 0.5)
    probs = g.cast(g.cast(g.neg(g.neg(g.softmax(s, -1))), bz.f32), bz.f32)
    g.set_outputs([g.matmul(probs, heads[2])])
    rules = (CANONICALIZE_ATTENTION, DROP_DOUBLE_NEG)
    res = rewrite(g, rules)
    assert res.stats["CanonicalizeAttention"].matches == 1
    assert res.graph.count("attention") == 1 and res.graph.count("softmax") == 0
    assert_equivalent(g, res.graph, params=bz.init_params(g, 0), rtol=1e-4, atol=1e-5)
    # a hook reaching only one edge below the changes misses it
    monkeypatch.setattr(CANONICALIZE_ATTENTION, "retry",
                        lambda g, changed: set(changed) | g.reader_ids(changed))
    assert rewrite(g, rules).stats["CanonicalizeAttention"].matches == 0
