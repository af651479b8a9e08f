"""A rule whose matcher reads who reads a node declares how far (`Rule.reads_users`): after a
sweep, the driver retries it wherever the readers of what it reads may have changed (a
replaced node read them, or a new node does), so incremental sweeps find what whole sweeps
find. Without the declaration (0) the same rule misses the match the change made possible."""
import dataclasses

import numpy as np
from hypothesis import given, settings

import braze as bz
from braze.ir.equality import graph_diff
from braze.passes.canonicalize.layout import live_users
from braze.passes.canonicalize.simplify import SIMPLIFY_RULES
from braze.rewrite import Match, P, Rule, V, rewrite
from braze.testing import assert_equivalent, random_graphs


def _zero(g, v):
    n = g.nodes[v.node]
    return n.op.kind == "constant" and not np.any(n.op.value)


# x * 0 -> zeros: the product no longer reads x
TIMES_ZERO = Rule("TimesZero",
                  lambda b, m: b.constant(np.zeros(m.root.outputs[0].dims, np.float32)),
                  pattern=P.mul(V("x"), V("c", _zero)))


def _sole_reader_matcher(rule_of):
    def matcher(g, node, ctx):
        x = node.inputs[0]
        if len(g.users(x.node)) == 1 and not g.is_output(x):  # abs is x's only reader
            yield Match(rule_of(), g, node, {"root": node}, {"x": x}, (node.id,))
    return matcher


def _sqrt_of_square(b, m):
    x = m.v("x")
    return b.sqrt(b.mul(x, x))


def _abs_rule(name: str, reads_users: int) -> Rule:
    holder: list[Rule] = []
    rule = Rule(name, _sqrt_of_square, matcher=_sole_reader_matcher(lambda: holder[0]),
                root_test=lambda op: op.label == "abs", depth=1, reads_users=reads_users)
    holder.append(rule)
    return rule


# abs(x) -> sqrt(x * x) when abs is the only reader of x
SOLE_READER = _abs_rule("SoleReaderAbs", reads_users=1)
UNDECLARED = _abs_rule("SoleReaderAbsUndeclared", reads_users=0)


def _graph():
    g = bz.Graph("readers")
    x = g.input("x", bz.Shape((3, 4)))
    p = g.tanh(x)
    far = g.exp(g.exp(g.exp(x)))
    g.set_outputs([g.add(g.abs(p), g.mul(p, g.constant(np.float32(0)))), far])
    return g


def _whole(rule):
    """`rule` without a reach: tried at every node on every sweep."""
    copy = dataclasses.replace(rule, reads_users=0)
    copy.depth = None  # a pattern rule's copy has its pattern's height again
    return copy


def test_a_reader_removed_by_a_replacement_is_seen_in_the_next_sweep():
    g = _graph()
    res = rewrite(g, (TIMES_ZERO, SOLE_READER))
    whole = rewrite(g, (TIMES_ZERO, _whole(SOLE_READER)))
    assert res.stats["TimesZero"].matches == 1
    assert res.stats["SoleReaderAbs"].matches == 1  # found in the second sweep
    assert whole.stats["SoleReaderAbs"].matches == 1
    assert res.graph.count("abs") == 0 and res.graph.count("sqrt") == 1
    assert_equivalent(g, res.graph, rtol=1e-4, atol=1e-5)


def test_without_the_declaration_the_next_sweep_looks_elsewhere():
    res = rewrite(_graph(), (TIMES_ZERO, UNDECLARED))
    assert res.stats["SoleReaderAbsUndeclared"].matches == 0  # why rules must declare it


def _sole_live_reader_tanh(g, node, ctx):
    """tanh(x) where the tanh is the only reader of x that is used (readers' readers, two
    levels, tell whether a reader is used): reads up to three edges below x."""
    x = node.inputs[0]
    if g.nodes[x.node].op.source or g.is_output(x):
        return
    if [u.id for u in live_users(g, x, 2)] == [node.id]:
        yield Match(TANH_AS_SIGMOID, g, node, {"root": node}, {"x": x}, (node.id,))


def _tanh_as_sigmoid(b, m):
    two = b.constant(np.float32(2))
    s = b.sigmoid(b.mul(m.v("x"), two))
    return b.sub(b.mul(s, two), b.constant(np.float32(1)))


TANH_AS_SIGMOID = Rule("SoleReaderTanh", _tanh_as_sigmoid, matcher=_sole_live_reader_tanh,
                       root_test=lambda op: op.label == "tanh", depth=1, reads_users=3)


# x - x -> zeros (a test rule: exact for the finite inputs the tests feed): x loses a reader
def _zeros_like_root(b, m):
    out = m.root.outputs[0]
    zero = b.constant(np.zeros((), out.dtype.np))
    return b.expand(zero, out.dims) if out.dims else zero


SELF_SUB = Rule("SelfSub", _zeros_like_root, pattern=P.sub(V("x"), V("x")))


def _dead_two_below():
    """tanh(a) beside neg(neg(a)) read only by a self-subtraction: once that is replaced, the
    negs are dead and tanh is a's only used reader (a change three edges below a)."""
    g = bz.Graph("deep")
    x = g.input("x", bz.Shape((3, 4)))
    a = g.exp(x)
    z = g.neg(g.neg(a))
    g.set_outputs([g.tanh(a), g.sub(z, z)])
    return g


def test_a_reader_dying_further_down_is_seen_in_the_next_sweep(monkeypatch):
    g = _dead_two_below()
    res = rewrite(g, (SELF_SUB, TANH_AS_SIGMOID))
    assert res.stats["SelfSub"].matches == 1 and res.stats["SoleReaderTanh"].matches == 1
    assert res.graph.count("tanh") == 0
    assert_equivalent(g, res.graph, rtol=1e-4, atol=1e-5)
    monkeypatch.setattr(TANH_AS_SIGMOID, "reads_users", 1)  # too short: a's readers only
    assert rewrite(g, (SELF_SUB, TANH_AS_SIGMOID)).stats["SoleReaderTanh"].matches == 0


@settings(max_examples=80, deadline=None)
@given(g=random_graphs(max_nodes=14))
def test_reader_reading_rules_near_the_changes_match_whole_sweeps(g):
    """Simplify rules remove and rewire readers; the tanh rule reads readers three levels
    down: incremental sweeps give what whole sweeps give."""
    rules = (*SIMPLIFY_RULES, TIMES_ZERO, SELF_SUB, SOLE_READER, TANH_AS_SIGMOID)
    near = rewrite(g, rules, max_sweeps=32)
    whole = rewrite(g, tuple(_whole(r) for r in rules), max_sweeps=32)
    assert graph_diff(near.graph, whole.graph) is None
    assert {k: s.matches for k, s in near.stats.items()} == \
        {k: s.matches for k, s in whole.stats.items()}
    assert_equivalent(g, near.graph, rtol=1e-4, atol=1e-4)
