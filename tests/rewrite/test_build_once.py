"""The rewrite driver builds a replacement once: the trial build that vetted a match is replayed
into the rebuilt graph (stand-ins become the real values, in the order the rule asked for them),
and the rule runs again only when a name the trial took is taken in the real graph. The graph
is the one running every rule again would build."""
from collections import Counter

import numpy as np
from hypothesis import given, settings

import braze as bz
import braze.rewrite.driver as driver
from braze.interpret import interpret, random_feeds
from braze.ir.equality import graph_diff
from braze.passes.canonicalize.simplify import SIMPLIFY_RULES
from braze.rewrite import P, Rule, V, rewrite
from braze.testing import assert_equivalent, random_graphs

CALLS: Counter = Counter()


def _counted(name, build):
    def rewrite_fn(b, m):
        CALLS[name] += 1
        return build(b, m)
    return rewrite_fn


def _minus_then_plus(b, m):
    """(0 - x) + y, asking for x and y between its own nodes."""
    zero = b.constant(np.float32(0))
    t = b.sub(zero, m.v("x"))
    return b.add(t, m.v("y"))


# neg(x) + y -> (0 - x) + y: y may be made after neg, so the rebuild emits it mid-replacement
INTERLEAVED = Rule("Interleaved", _counted("Interleaved", _minus_then_plus),
                   pattern=P.add(P.neg(V("x")), V("y")))


def _scaled_by_fresh_param(b, m):
    """x * s for neg(neg(x)), s a new param equal to 1 named "scale" (suffixed while the graph
    being built or the matched one has that name)."""
    name, k = "scale", 1
    while b.has_name(name) or m.graph.has_name(name):
        k += 1
        name = f"scale#{k}"
    return b.mul(m.v("x"), b.param(name, bz.Shape(()), np.float32(1)))


FRESH_NAME = Rule("FreshName", _counted("FreshName", _scaled_by_fresh_param),
                  pattern=P.neg(P.neg(V("x"))))


def _always_rebuild(monkeypatch):
    monkeypatch.setattr(driver, "replay", lambda trial, b, resolve: None)


def _interleaved_graph():
    g = bz.Graph("interleaved")
    x = g.input("x", bz.Shape((3, 4)))
    n1 = g.neg(x)
    y1 = g.tanh(g.abs(x))  # made after the neg it is added to
    n2 = g.neg(y1)
    y2 = g.exp(g.abs(y1))
    g.set_outputs([g.add(n1, y1), g.add(y2, n2)])
    return g


def test_each_replacement_is_built_once():
    g = _interleaved_graph()
    CALLS.clear()
    res = rewrite(g, (INTERLEAVED,))
    assert res.stats["Interleaved"].matches == 2
    assert CALLS["Interleaved"] == 2  # one trial build each; the rebuild replays it
    assert res.graph.count("neg") == 0 and res.graph.count("sub") == 2
    assert_equivalent(g, res.graph)


def test_replay_builds_the_graph_a_second_build_would(monkeypatch):
    g = _interleaved_graph()
    replayed = rewrite(g, (INTERLEAVED,))
    with monkeypatch.context() as mp:
        _always_rebuild(mp)
        CALLS.clear()
        rebuilt = rewrite(g, (INTERLEAVED,))
        assert CALLS["Interleaved"] == 4  # the old way: trial and real build
    assert graph_diff(replayed.graph, rebuilt.graph) is None
    assert replayed.node_map == rebuilt.node_map and replayed.made == rebuilt.made


def test_a_name_taken_in_the_real_graph_builds_the_rule_again(monkeypatch):
    g = bz.Graph("names")
    x = g.input("x", bz.Shape((3, 4)))
    g.set_outputs([g.neg(g.neg(x)), g.neg(g.neg(g.abs(x)))])
    CALLS.clear()
    res = rewrite(g, (FRESH_NAME,))
    assert res.stats["FreshName"].matches == 2
    # both trials chose "scale"; the second replacement is built again and takes "scale#2"
    assert CALLS["FreshName"] == 3
    assert sorted(p.op.name for p in res.graph.params) == ["scale", "scale#2"]
    assert set(res.graph.weights) == {"scale", "scale#2"}
    with monkeypatch.context() as mp:
        _always_rebuild(mp)
        rebuilt = rewrite(g, (FRESH_NAME,))
    assert graph_diff(res.graph, rebuilt.graph) is None
    feeds = random_feeds(g, 0)
    want = interpret(g, feeds, {})
    got = interpret(res.graph, feeds, dict(res.graph.weights))
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(a, b)


@settings(max_examples=40, deadline=None)
@given(g=random_graphs(max_nodes=14))
def test_replayed_simplify_sweeps_equal_rebuilt_ones(g):
    from _pytest.monkeypatch import MonkeyPatch

    replayed = rewrite(g, SIMPLIFY_RULES, max_sweeps=32)
    mp = MonkeyPatch()
    try:
        _always_rebuild(mp)
        rebuilt = rewrite(g, SIMPLIFY_RULES, max_sweeps=32)
    finally:
        mp.undo()
    assert graph_diff(replayed.graph, rebuilt.graph) is None
    assert replayed.made == rebuilt.made and replayed.node_map == rebuilt.node_map


def test_replacement_nodes_take_the_roots_provenance(monkeypatch):
    g = bz.Graph("provenance")
    x = g.input("x", bz.Shape((3, 4)))
    with g.provenance_scope("model.neg"):
        n = g.neg(x)
    with g.provenance_scope("model.add"):
        y = g.add(n, g.exp(x))
    g.set_outputs([y])
    replayed = rewrite(g, (INTERLEAVED,)).graph
    with monkeypatch.context() as mp:
        _always_rebuild(mp)
        rebuilt = rewrite(g, (INTERLEAVED,)).graph
    for out in (replayed, rebuilt):
        made = [nd for nd in out.nodes if nd.op.label in ("constant", "sub", "add")]
        assert len(made) == 3 and {nd.provenance for nd in made} == {"model.add"}
    assert graph_diff(replayed, rebuilt) is None
