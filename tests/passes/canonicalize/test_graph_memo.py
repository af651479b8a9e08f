"""The matchers' per-graph memo answers again only for the same, unchanged graph: a graph that
grew, had a node replaced in place or nodes dropped is computed anew."""
import dataclasses

import braze as bz
from braze.ir.ops.elementwise import Unary, UnaryFn
from braze.passes.canonicalize.graph_memo import per_graph


def test_memo_recomputes_after_every_kind_of_change():
    calls = []
    labels = per_graph(lambda g: calls.append(1) or [n.op.label for n in g.nodes])
    g = bz.Graph("memo")
    x = g.input("x", bz.Shape((2, 3)))
    g.set_outputs([g.tanh(g.exp(x))])
    assert labels(g) == labels(g) and len(calls) == 1        # same graph, unchanged: memo
    g.set_outputs([g.sigmoid(g.outputs[0])])                  # grew
    assert labels(g)[-1] == "sigmoid" and len(calls) == 2
    g.set_outputs(g.outputs[:])                               # outputs alone: the same nodes
    labels(g)
    assert len(calls) == 2

    work = g.detached_copy()
    assert labels(work) == labels(g) and len(calls) == 3     # another graph object
    exp = next(n for n in work.nodes if n.op.label == "exp")
    work.replace_node(dataclasses.replace(exp, op=Unary(UnaryFn.LOG)))
    assert "log" in labels(work) and "exp" not in labels(work) and len(calls) == 4
    work.drop_after(len(work.nodes) - 1)
    assert "sigmoid" not in labels(work) and len(calls) == 5
    assert "exp" in labels(g) and len(calls) == 5            # the original: still memoized
