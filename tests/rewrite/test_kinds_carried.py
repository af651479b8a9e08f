"""The op kinds a rewritten graph holds are derived from its source's (nodes the matches
replaced counted out, nodes the replacements built counted in) and kept per graph: they equal a
fresh count after every sweep, a kind a sweep removed stops its rules from being tried, and a
graph that grew after being read is counted again."""
import numpy as np

import braze as bz
from braze.rewrite import P, Rule, V, rewrite, rewrite_once
from braze.rewrite.driver import KindsPresent
from braze.testing import assert_equivalent

X = V("x")
NEG_NEG_TO_SUB_ZERO = Rule(  # -(-x) -> x - 0: a kind (sub) the graph did not hold
    "NegNegToSubZero", lambda b, m: b.sub(m.v("x"), b.constant(np.float32(0))),
    pattern=P.neg(P.neg(X)))
SUB_ZERO = Rule("SubZero", lambda b, m: m.v("x"), pattern=P.sub(X, V("zero")))


def _graph():
    g = bz.Graph("kinds")
    x = g.input("x", bz.Shape((2, 3)))
    h = g.add(x, g.constant(np.ones(3, np.float32)))
    for _ in range(3):
        h = g.exp(g.neg(g.neg(h)))
    g.set_outputs([h])
    return g


def test_kinds_after_a_sweep_equal_a_fresh_count():
    g = _graph()
    res = rewrite_once(g, [NEG_NEG_TO_SUB_ZERO], None)
    assert res.changed
    carried = KindsPresent(g).after_rewrite(g, res)
    assert carried._count == KindsPresent(res.graph)._count
    assert not carried.meets(frozenset({("neg",)})) and carried.meets(frozenset({("sub",)}))


def test_rules_see_kinds_made_and_removed_across_sweeps():
    g = _graph()
    res = rewrite(g, [NEG_NEG_TO_SUB_ZERO, SUB_ZERO])
    assert res.graph.op_counts() == {"add": 1, "exp": 3}
    assert res.stats["SubZero"].matches == 3   # the subs made by the first sweep are seen
    assert_equivalent(g, res.graph)


def test_a_graph_that_grew_is_counted_again():
    g = _graph()
    assert not KindsPresent.of(g).meets(frozenset({("tanh",)}))
    g.set_outputs([g.tanh(g.outputs[0])])
    assert KindsPresent.of(g).meets(frozenset({("tanh",)}))
    assert KindsPresent.of(g)._count == KindsPresent(g)._count


def test_cse_carries_the_kinds_of_its_result():
    from braze.passes.cleanup import common_subexpression_elimination

    g = bz.Graph("cse")
    x = g.input("x", bz.Shape((2, 3)))
    g.set_outputs([g.add(g.tanh(x), g.tanh(x)), g.exp(g.tanh(x))])
    out, changed = common_subexpression_elimination(g)
    assert changed and out.count("tanh") == 1
    seen = KindsPresent._by_graph[id(out)][3]  # remembered for the result, not recounted
    assert seen._count == KindsPresent(out)._count
    assert KindsPresent.of(out) is seen
