"""Rule.requires: a pattern rule is skipped on a graph that lacks an op kind every match of its
pattern needs (`Pattern.required_kinds`); its statistics and near misses, the rules that fire
and the graph they produce are the same as when it is tried."""
import numpy as np

import braze as bz
from braze.ir.ops.elementwise import Unary
from braze.rewrite import MissReason, P, Rule, V, fail, rewrite
from braze.rewrite.dispatch import KindsPresent
from braze.testing import assert_equivalent

X = V("x")
CONV_THEN_ADD = Rule("ConvThenAdd", lambda b, m: m.v("x"),
                     pattern=P.add(P.conv2d(X, V("w"), name="conv"), V("b")))
EXP_OF_NEG_OR_RELU_ADD = Rule(
    "ExpOfNegOrReluAdd", lambda b, m: m.v("x"),
    pattern=P.exp(P.neg(X) | P.relu(P.add(X, V("y")))),
    checks=(lambda m, ctx: fail(MissReason.PATTERN_MISMATCH, detail="always refused"),))


def test_requirements_of_trees_alternatives_and_vars():
    assert CONV_THEN_ADD.requires == frozenset({("add",), ("conv2d",)})
    assert EXP_OF_NEG_OR_RELU_ADD.requires == frozenset({("exp",), ("neg", "relu"), ("neg", "add")})
    assert (P.neg(X) | X).required_kinds() == frozenset()   # a bare value needs nothing
    assert P.of(Unary, X).required_kinds() == frozenset({(Unary,)})


def test_kinds_present_reads_labels_kinds_and_classes():
    g = bz.Graph("kinds")
    x = g.input("x", bz.Shape((2, 3)))
    g.set_outputs([g.exp(g.add(x, x))])
    present = KindsPresent(g)
    assert present.meets(frozenset({("add",), ("exp", "conv2d")}))
    assert present.meets(frozenset({(Unary,)}))
    assert not present.meets(frozenset({("add",), ("conv2d",)}))
    assert not present.meets(frozenset({("relu", "neg")}))


def _graph(with_neg: bool):
    g = bz.Graph("skip")
    x = g.input("x", bz.Shape((2, 3)))
    y = g.add(x, g.constant(np.ones(3, np.float32)))
    inner = g.neg(y) if with_neg else g.tanh(y)
    g.set_outputs([g.exp(inner)])
    return g


def test_a_rule_missing_a_kind_is_not_tried_and_reports_the_same():
    g = _graph(with_neg=False)
    res = rewrite(g, [CONV_THEN_ADD, EXP_OF_NEG_OR_RELU_ADD], None)
    assert not res.changed and res.graph is g
    assert res.stats["ConvThenAdd"].attempts == 0       # no conv2d: skipped
    assert res.stats["ExpOfNegOrReluAdd"].attempts == 0  # neither neg nor relu
    assert res.misses == []


def test_a_rule_whose_kinds_are_present_is_tried_and_its_miss_reported():
    g = _graph(with_neg=True)
    res = rewrite(g, [CONV_THEN_ADD, EXP_OF_NEG_OR_RELU_ADD], None)
    st = res.stats["ExpOfNegOrReluAdd"]
    assert (st.attempts, st.matches, st.near_misses) == (1, 0, 1)
    assert [m.reason for m in res.misses] == [MissReason.PATTERN_MISMATCH]
    assert res.graph is g
    assert_equivalent(g, res.graph)
