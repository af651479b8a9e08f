"""Graph rebuilds share what they do not change: `copy_prefix` gives the same graph as copying
the nodes one by one with `copy_node` (same nodes, users, names, inputs and params), and the
fast node constructor builds nodes equal to `Node(...)`."""
import numpy as np

import braze as bz
from braze.ir.equality import graphs_equal
from braze.ir.graph_core import _new_node, first_values
from braze.ir.node import Node
from braze.ir.op import Value


def _graph():
    g = bz.Graph("prefix")
    x = g.input("x", bz.Shape((2, 3)))
    w = g.param("w", bz.Shape((3, 3)))
    h = g.matmul(x, w)
    h = g.add(h, h)
    y = g.input("y", bz.Shape((2, 3)))
    out = g.mul(g.exp(h), y)
    g.set_outputs([out, h])
    return g


def _copied(g, k):
    """The first k nodes of g by copy_prefix, the rest by copy_node."""
    new = bz.Graph(g.name)
    outs = new.copy_prefix(g, k)
    for node in g.nodes[k:]:
        outs.append(new.copy_node(node, tuple(outs[v.node][v.index] for v in node.inputs)))
    new.weights = g.weights.carry()
    new.set_outputs([outs[v.node][v.index] for v in g.outputs])
    return new


def test_copy_prefix_then_copy_node_is_the_same_graph_at_every_split():
    g = _graph()
    whole = _copied(g, 0)
    for k in range(len(g.nodes) + 1):
        new = _copied(g, k)
        assert graphs_equal(new, whole) and graphs_equal(new, g)
        assert new.input_ids == g.input_ids and new.param_ids == g.param_ids
        assert [new.users(n.id) for n in new.nodes] == [whole.users(n.id) for n in whole.nodes]
        assert new.node_by_name("x").id == g.node_by_name("x").id
        assert all(new.nodes[i] is g.nodes[i] for i in range(k))  # shared, not copied


def test_copy_prefix_leaves_the_source_alone_and_needs_an_empty_graph():
    g = _graph()
    users_before = [list(u) for u in g._users]
    new = bz.Graph("t")
    new.copy_prefix(g, 3)
    new.add(Value(0), Value(0))  # growing the copy does not touch the source
    assert [list(u) for u in g._users] == users_before and len(g.nodes) == 7
    try:
        new.copy_prefix(g, 2)
    except bz.GraphError as e:
        assert "empty graph" in str(e)
    else:
        raise AssertionError("copy_prefix into a non-empty graph must fail")


def test_fast_node_constructor_and_shared_values_equal_the_plain_ones():
    g = _graph()
    for n in g.nodes:
        made = _new_node(n.id, n.op, n.inputs, n.outputs, n.name, n.provenance)
        assert made == n and hash(made) == hash(n) and type(made) is Node
    assert first_values(5) == (Value(5, 0),) and first_values(5) is first_values(5)
    assert first_values(10_000)[0] == Value(10_000)
    assert np.all([first_values(i)[0].node == i for i in range(50)])
