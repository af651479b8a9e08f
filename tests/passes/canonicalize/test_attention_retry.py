"""CanonicalizeAttention after its first sweep: the rule needs a softmax (every match and near
miss walks back from its root to one), so a graph without one is not swept again; where a
softmax is left, its retry hook tries it only at the matmuls whose walk back may read a
changed node, and finds what whole sweeps find."""
import dataclasses

import numpy as np

import braze as bz
from braze.ir.ops.attention import MaskKind
from braze.passes.canonicalize.attention import CANONICALIZE_ATTENTION
from braze.rewrite import rewrite
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
