"""A rule whose matcher reads who reads a node declares how far (`Rule.reads_users`): after a
sweep, the driver retries it wherever the readers of what it reads may have changed (a
replaced node read them, or a new node does), so incremental sweeps find what whole sweeps
find. Without the declaration (0) the same rule misses the match the change made possible."""
import numpy as np

import braze as bz
from braze.rewrite import Match, P, Rule, V, rewrite
from braze.testing import assert_equivalent


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
    return Rule(rule.name, rule.rewrite, matcher=rule.matcher, root_test=rule.root_test)


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
