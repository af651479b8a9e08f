"""RootDispatch: the rewrite driver tries a pattern rule only at nodes whose op its pattern's
root admits (by label, kind or class), and every rule with its own matcher everywhere; which
rules fire, and the graph they produce, do not change."""
import numpy as np

import braze as bz
from braze.ir.ops.elementwise import Binary, Unary
from braze.rewrite import P, Rule, V, rewrite
from braze.rewrite.dispatch import RootDispatch
from braze.testing import assert_equivalent

X = V("x")
ADD_ZERO = Rule("AddZero", lambda b, m: m.v("x"), pattern=P.add(X, V("z")),
                checks=(lambda m, ctx: None if _is_zero(m) else _no(m),))
NEG_OR_EXP = Rule("NegOrExp", lambda b, m: b.exp(m.v("x")), pattern=P.neg(X) | P.of(Unary, X))
SEEN: list[str] = []


def _watch(g, node, ctx):
    SEEN.append(node.op.label)
    return iter(())


WATCHER = Rule("Watcher", lambda b, m: None, matcher=_watch)


def _is_zero(m):
    node = m.graph.nodes[m.values["z"].node]
    return node.op.kind == "constant" and not np.any(node.op.value)


def _no(m):
    from braze.rewrite import MissReason, fail

    return fail(MissReason.PATTERN_MISMATCH, detail="not a zero")


def _graph(bias=0.0):
    g = bz.Graph("dispatch")
    x = g.input("x", bz.Shape((2, 3)))
    y = g.mul(g.add(x, g.constant(np.full(3, bias, np.float32))), x)
    g.set_outputs([g.sub(y, x)])
    return g


def test_pattern_rules_are_tried_only_at_admitted_ops():
    g = _graph()
    res = rewrite(g, [ADD_ZERO], None)
    assert res.stats["AddZero"].attempts == 1  # the one add, not the mul / sub / sources
    assert res.stats["AddZero"].matches == 1
    assert res.graph.count("add") == 0
    assert_equivalent(g, res.graph)


def test_candidates_keep_rule_order_and_honour_alternatives_and_classes():
    d = RootDispatch([ADD_ZERO, NEG_OR_EXP, WATCHER])
    assert d.candidates(_op("add")) == (ADD_ZERO, WATCHER)
    assert d.candidates(_op("mul")) == (WATCHER,)
    assert d.candidates(_op("tanh")) == (NEG_OR_EXP, WATCHER)  # any Unary, through the class
    assert NEG_OR_EXP.root_kinds == frozenset({"neg", Unary})
    assert WATCHER.root_kinds is None


def test_rules_with_their_own_matcher_still_see_every_node():
    g = _graph(bias=1.0)  # AddZero is tried at the add and refuses: nothing changes
    SEEN.clear()
    res = rewrite(g, [ADD_ZERO, WATCHER], None)
    assert not res.changed and res.stats["AddZero"].attempts == 2  # both orders of the add
    assert sorted(SEEN) == sorted(n.op.label for n in g.nodes if not n.op.source)


def _op(label):
    from braze.ir.ops.elementwise import BinaryFn, UnaryFn

    if label in {f.value for f in BinaryFn}:
        return Binary(BinaryFn(label))
    return Unary(UnaryFn(label))
