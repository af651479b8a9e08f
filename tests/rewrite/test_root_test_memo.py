"""The rewrite driver runs a rule's `root_test` once per op object (ops are frozen, and a rebuilt
graph shares the ops of the nodes it copies), not once per node and sweep; the rule is still
tried at every node whose op passes, in every sweep."""
import braze as bz
from braze.ir.ops.elementwise import Unary
from braze.rewrite import P, Rule, V, rewrite
from braze.testing import assert_equivalent


def _abs_chain(n: int = 8):
    g = bz.Graph("abs_chain")
    x = g.input("x", bz.Shape((4, 3)))
    h = g.tanh(x)
    for _ in range(n):
        h = g.abs(h)
    g.set_outputs([g.exp(h)])
    return g


def test_root_test_runs_once_per_op_across_sweeps():
    tested: list = []  # the ops themselves: keeps them alive, so their ids stay distinct
    tried: list[list[int]] = []

    def root_test(op):
        tested.append(op)
        return isinstance(op, Unary)

    def watch(g, node, ctx):
        if not tried or tried[-1][0] is not g:
            tried.append([g])
        tried[-1].append(node.id)
        return iter(())

    abs_abs = Rule("AbsAbsMemo", lambda b, m: b.abs(m.v("x")), pattern=P.abs(P.abs(V("x"))))
    watcher = Rule("WatchUnaryMemo", lambda b, m: None, matcher=watch, root_test=root_test)
    g = _abs_chain()
    res = rewrite(g, [abs_abs, watcher], None)

    assert res.graph.count("abs") == 1
    assert len(tried) >= 3  # several sweeps, each trying the watcher
    assert len({id(op) for op in tested}) == len(tested)  # never the same op twice
    # the copied tanh and exp are tried in every sweep, their root test ran once
    assert [op.label for op in tested].count("tanh") == 1
    assert [op.label for op in tested].count("exp") == 1
    for graph, *ids in tried:  # every unary node not claimed earlier in its sweep was tried
        want = {n.id for n in graph.nodes if isinstance(n.op, Unary)}
        assert set(ids) <= want
        assert {n.id for n in graph.nodes if n.op.label in ("tanh", "exp")} <= set(ids)
    assert_equivalent(g, res.graph)
