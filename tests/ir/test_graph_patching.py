"""Patching a graph a pass owns: `detached_copy` shares nothing a patch changes with the
original, `replace_node` keeps the users index and names as a graph built with the new node
would have them, and `drop_after` leaves the graph as if the dropped nodes were never added."""
import numpy as np
import pytest

import braze as bz
from braze.errors import GraphError
from braze.ir.equality import graphs_equal
from braze.ir.node import Node


def _graph():
    g = bz.Graph("patch", record_provenance=False)
    x = g.input("x", bz.Shape((2, 3)))
    w = g.param("w", bz.Shape((2, 3)), value=np.ones((2, 3), np.float32))
    a = g.add(x, w)
    b = g.exp(a)
    c = g.mul(b, a)
    g.set_outputs([c])
    return g, x, w, a, b, c


def _index(g):
    """The users index as `users` reports it, names, sources, outputs and weights."""
    return ([[u.id for u in g.users(n.id)] for n in g.nodes], dict(g._names),
            list(g.input_ids), list(g.param_ids), list(g.outputs), sorted(g.weights))


def test_a_detached_copy_is_patched_without_changing_the_original():
    g, x, w, a, b, c = _graph()
    before = _index(g)
    work = g.detached_copy()
    assert graphs_equal(work, g) and type(work) is type(g)
    work.replace_node(Node(b.node, g.nodes[b.node].op, (x,), g.nodes[b.node].outputs))
    work.exp(x)
    work.weights["extra"] = np.zeros(1, np.float32)
    assert _index(g) == before and not graphs_equal(work, g)


def test_replace_node_keeps_the_users_index_of_a_graph_built_that_way():
    g, x, w, a, b, c = _graph()
    work = g.detached_copy()
    named = Node(b.node, g.nodes[b.node].op, (x,), g.nodes[b.node].outputs, name="e")
    work.replace_node(named)  # exp reads x instead of a, and gets a name
    built = bz.Graph("patch", record_provenance=False)
    x2 = built.input("x", bz.Shape((2, 3)))
    w2 = built.param("w", bz.Shape((2, 3)), value=np.ones((2, 3), np.float32))
    a2 = built.add(x2, w2)
    b2 = built.add_node(g.nodes[b.node].op, (x2,), name="e")[0]
    built.set_outputs([built.mul(b2, a2)])
    assert _index(work) == _index(built) and graphs_equal(work, built)
    assert work.node_by_name("e").id == b.node
    assert [u.id for u in work.users(x)] == [a.node, b.node]  # topological order


def test_replace_node_refuses_what_would_break_the_graph():
    g, x, w, a, b, c = _graph()
    work = g.detached_copy()
    exp = g.nodes[b.node]
    with pytest.raises(GraphError):  # reads a later node
        work.replace_node(Node(b.node, exp.op, (c,), exp.outputs))
    with pytest.raises(GraphError):  # an input is not replaced
        work.replace_node(Node(x.node, exp.op, (), exp.outputs))
    with pytest.raises(GraphError):  # a name another node has
        work.replace_node(Node(b.node, exp.op, (a,), exp.outputs, name="x"))
    assert graphs_equal(work, g) and _index(work) == _index(g)


def test_drop_after_forgets_the_dropped_nodes():
    g, x, w, a, b, c = _graph()
    work = g.detached_copy()
    before = _index(work)
    start = len(work.nodes)
    work.add_node(g.nodes[b.node].op, (a,), name="tmp")
    work.input("z", bz.Shape((2, 3)))
    work.param("v", bz.Shape((1,)), value=np.zeros(1, np.float32))
    dropped = work.drop_after(start)
    assert [n.op.kind for n in dropped] == ["unary", "input", "param"]
    assert _index(work) == before and graphs_equal(work, g)
    assert work.drop_after(len(work.nodes)) == []


class _Unread(list):
    """A users list that fails the test when iterated whole."""

    def __iter__(self):
        raise AssertionError("drop_after read a whole users list")


def test_drop_after_trims_only_the_dropped_readers():
    """Users lists are in id order, so the dropped readers are a suffix. drop_after rebuilt each
    whole list instead: with a value read 32,000 times, every trial rewrite reading it cost
    32,000 steps, and fuse took 33 s instead of 2 s."""
    g, x, w, a, b, c = _graph()
    work = g.detached_copy()
    want = [u.id for u in work.users(a)]
    work._users[a.node] = _Unread(work._users[a.node])
    start = len(work.nodes)
    work.exp(a)
    work.add(a, a)
    work.drop_after(start)
    assert [u for u, _ in list.__iter__(work._users[a.node])] == want
