"""After a sweep changed the graph, the rewrite driver tries rules with a `depth` again only near
the change (nodes a replacement built or rewired, and up to `depth` edges below them) and at the
roots of matches it did not take. The graph, the matches and the misses are those of sweeping
every node again; only fewer roots are visited."""
import numpy as np
from hypothesis import given, settings

import braze as bz
from braze.ir.equality import graphs_equal
from braze.passes.canonicalize.simplify import SIMPLIFY_RULES
from braze.rewrite import P, Rule, V, rewrite
from braze.testing import assert_equivalent, random_graphs

X = V("x")
VISITED: list[int] = []


def _watch(g, node, ctx):
    VISITED.append(node.id)
    return iter(())


WATCH = Rule("Watch", lambda b, m: None, matcher=_watch, depth=1)
# abs(abs(x)) -> abs(x): a chain of 8 abs halves per sweep (the new abs meets the next one)
ABS_ABS = Rule("AbsAbs", lambda b, m: b.abs(m.v("x")), pattern=P.abs(P.abs(X)))
CHAIN_RULES = (ABS_ABS, WATCH)


def _chain(with_layout: bool = True):
    """abs(-(-h)) 8 times (or abs 8 times) beside an exp / tanh branch (through 3 transposes)."""
    g = bz.Graph("chain")
    x = g.input("x", bz.Shape((4, 3)))
    far = g.exp(g.tanh(x))
    h = x
    for _ in range(8):
        h = g.abs(g.neg(g.neg(h)) if with_layout else h)
    if not with_layout:
        g.set_outputs([g.add(h, far)])
        return g
    t = g.transpose(g.transpose(g.transpose(far, (1, 0)), (1, 0)), (1, 0))
    g.set_outputs([g.mul(h, g.constant(np.float32(1))), t])
    return g


def _visits(g, rules, monkeypatch=None):
    VISITED.clear()
    if monkeypatch is None:
        res = rewrite(g, rules)
    else:
        with monkeypatch.context() as mp:
            _full_sweeps(mp, rules)
            res = rewrite(g, rules)
    return res, len(VISITED)


def _full_sweeps(monkeypatch, rules):
    for r in rules:
        monkeypatch.setattr(r, "depth", None)


def _misses(res):
    return sorted((m.pattern, m.node, m.reason.name, m.detail) for m in res.misses)


def _same_as_full(g, rules, monkeypatch):
    incremental = rewrite(g, rules, max_sweeps=32)
    with monkeypatch.context() as mp:
        _full_sweeps(mp, rules)
        full = rewrite(g, rules, max_sweeps=32)
    assert graphs_equal(incremental.graph, full.graph)
    assert incremental.changed == full.changed
    assert _misses(incremental) == _misses(full)
    assert {k: s.matches for k, s in incremental.stats.items()} == \
        {k: s.matches for k, s in full.stats.items()}
    return incremental


def test_later_sweeps_visit_only_nodes_near_the_changes(monkeypatch):
    g = _chain(with_layout=False)
    res = _same_as_full(g, CHAIN_RULES, monkeypatch)
    assert res.stats["AbsAbs"].matches == 4 + 2 + 1  # three sweeps change the graph
    assert_equivalent(g, res.graph)
    _, incremental = _visits(g, CHAIN_RULES)
    _, full = _visits(g, CHAIN_RULES, monkeypatch)
    assert incremental < full  # the exp / tanh branch is visited by the first sweep only


def test_a_rule_without_a_depth_keeps_whole_sweeps(monkeypatch):
    g = _chain(with_layout=False)
    unbounded = Rule("WatchAll", lambda b, m: None, matcher=_watch)
    _, with_unbounded = _visits(g, (ABS_ABS, unbounded))
    _, full = _visits(g, CHAIN_RULES, monkeypatch)
    assert with_unbounded == full


def test_simplify_rules_on_a_chain_match_whole_sweeps(monkeypatch):
    from braze.passes.cleanup import dead_code_elimination

    g = _chain()
    res = _same_as_full(g, SIMPLIFY_RULES, monkeypatch)
    live, _ = dead_code_elimination(res.graph)
    assert live.count("neg") == 0 and live.count("transpose") == 1 and live.count("mul") == 0
    assert_equivalent(g, res.graph)


@settings(max_examples=60, deadline=None)
@given(g=random_graphs(max_nodes=14))
def test_simplify_rules_on_random_graphs_match_whole_sweeps(g):
    from _pytest.monkeypatch import MonkeyPatch

    mp = MonkeyPatch()
    try:
        res = _same_as_full(g, SIMPLIFY_RULES, mp)
    finally:
        mp.undo()
    assert_equivalent(g, res.graph)


NEG_NEG = Rule("NegNeg", lambda b, m: m.v("x"), pattern=P.neg(P.neg(X)))


def _from_input(g, v):
    return g.nodes[v.node].op.kind == "input"


# exp(tanh(x)) of a graph input x (read two edges above the root) -> exp(tanh(x) * 1)
EXP_TANH_OF_INPUT = Rule(
    "ExpTanhOfInput", lambda b, m: b.exp(b.mul(b.tanh(m.v("x")), b.constant(np.float32(1)))),
    pattern=P.exp(P.tanh(V("x", _from_input))))


def _no_neg_left(m, ctx):
    from braze.rewrite import MissReason, fail

    if any(n.op.label == "neg" for n in m.graph.nodes):
        return fail(MissReason.PATTERN_MISMATCH, detail="a neg is left in the graph")
    return None


# tanh(x) -> 2 sigmoid(2x) - 1, refused by a check that reads the whole graph
TANH_AS_SIGMOID = Rule(
    "TanhAsSigmoid",
    lambda b, m: b.sub(b.mul(b.sigmoid(b.mul(m.v("x"), b.constant(np.float32(2)))),
                             b.constant(np.float32(2))), b.constant(np.float32(1))),
    pattern=P.tanh(X), checks=(_no_neg_left,))


def test_a_match_made_possible_above_the_root_is_found(monkeypatch):
    g = bz.Graph("above")
    x = g.input("x", bz.Shape((4, 3)))
    g.set_outputs([g.exp(g.tanh(g.neg(g.neg(x))))])
    res = _same_as_full(g, (NEG_NEG, EXP_TANH_OF_INPUT), monkeypatch)
    assert res.stats["ExpTanhOfInput"].matches == 1  # in the second sweep, one edge below
    assert_equivalent(g, res.graph)


def test_a_match_a_check_refused_is_tried_again(monkeypatch):
    g = bz.Graph("refused")
    x = g.input("x", bz.Shape((4, 3)))
    y = g.input("y", bz.Shape((4, 3)))
    g.set_outputs([g.tanh(x), g.neg(g.neg(y))])
    res = _same_as_full(g, (NEG_NEG, TANH_AS_SIGMOID), monkeypatch)
    assert res.stats["TanhAsSigmoid"].matches == 1 and res.graph.count("tanh") == 0
    assert_equivalent(g, res.graph)


def _simplified(g, monkeypatch=None):
    from braze.passes.canonicalize import simplify

    if monkeypatch is not None:
        monkeypatch.setattr(simplify, "_ALL_BOUNDED", False)
    try:
        return simplify.AlgebraicSimplify().run(g)
    finally:
        if monkeypatch is not None:
            monkeypatch.undo()


@settings(max_examples=40, deadline=None)
@given(g=random_graphs(max_nodes=14))
def test_algebraic_simplify_later_rounds_look_where_whole_rounds_find(g):
    from _pytest.monkeypatch import MonkeyPatch

    fast, whole = _simplified(g), _simplified(g, MonkeyPatch())
    assert graphs_equal(fast.graph, whole.graph) and fast.changed == whole.changed
    assert _misses(fast) == _misses(whole)
    assert {k: s.matches for k, s in fast.stats.items()} == \
        {k: s.matches for k, s in whole.stats.items()}
    assert_equivalent(g, fast.graph)
