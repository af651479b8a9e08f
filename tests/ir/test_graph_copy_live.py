"""Dead code elimination's bulk copy: `copy_live` gives the same graph as copying the live nodes
one by one with `copy_node` (same nodes, users index, names, inputs and params, in order), for
every choice of dead nodes, with multi-output nodes, repeated operands and params after the
first dead node."""
import itertools

import braze as bz
from braze.ir.equality import graphs_equal


def _graph():
    g = bz.Graph("live")
    x = g.input("x", bz.Shape((4, 6)))
    d0 = g.exp(x)                        # dead unless chosen live
    w = g.param("w", bz.Shape((6, 6)))
    h = g.matmul(x, w)
    a, b = g.split(h, 1, [2, 4])         # two outputs, the second one read
    s = g.add(b, b)                      # one operand twice: one users entry
    d1 = g.neg(a)                        # dead unless chosen live
    v = g.param("v", bz.Shape((4, 4)))
    out = g.mul(s, v)
    g.set_outputs([out, h])
    return g, (d0.node, d1.node, a.node)


def _by_copy_node(g, live):
    """The live nodes, each by copy_node (what eliminate_dead_code did before copy_live)."""
    new = bz.Graph(g.name, record_provenance=False)
    outs: list = [None] * len(g.nodes)
    for node in g.nodes:
        if live[node.id]:
            outs[node.id] = new.copy_node(node, tuple(outs[v.node][v.index] for v in node.inputs))
    new.set_outputs([outs[v.node][v.index] for v in g.outputs])
    return new, [None if o is None else o[0].node for o in outs]


def _by_copy_live(g, live):
    new = bz.Graph(g.name, record_provenance=False)
    new_id = new.copy_live(g, live)
    new.set_outputs([bz.Value(new_id[v.node], v.index) for v in g.outputs])
    return new, new_id


def test_copy_live_is_copy_node_of_each_live_node_for_every_dead_set():
    g, optional = _graph()
    tried = 0
    for pick in itertools.product([False, True], repeat=2):  # d0 and d1 dead or live
        live = [True] * len(g.nodes)
        for nid, keep in zip(optional[:2], pick):
            live[nid] = keep
        want, want_ids = _by_copy_node(g, live)
        got, got_ids = _by_copy_live(g, live)
        assert got_ids == want_ids
        assert graphs_equal(got, want)
        assert [n.name for n in got.nodes] == [n.name for n in want.nodes]
        assert got.input_ids == want.input_ids and got.param_ids == want.param_ids
        assert [got.users(n.id) for n in got.nodes] == [want.users(n.id) for n in want.nodes]
        assert got.node_by_name("v").id == want.node_by_name("v").id
        tried += 1
    assert tried == 4


def test_copy_live_renumbers_after_the_first_dead_node_and_shares_before_it():
    g, (d0, d1, _) = _graph()
    live = [True] * len(g.nodes)
    live[d0] = live[d1] = False
    got, new_id = _by_copy_live(g, live)
    assert new_id[d0] is None and new_id[d1] is None
    assert len(got.nodes) == len(g.nodes) - 2
    assert all(got.nodes[i] is g.nodes[i] for i in range(d0))  # the prefix is shared
    assert [n.op.kind for n in got.nodes] == [n.op.kind for n in g.nodes if live[n.id]]
    add = next(n for n in got.nodes if n.op.kind == "binary" and n.op.fn.name == "ADD")
    assert add.inputs[0] == add.inputs[1] and add.inputs[0].index == 1
    assert got.users(add.inputs[0]) == [add]  # x + x reads its operand once



def _wide_concat(n):
    """A concat reading `n` inputs, the first one twice, then a dead node."""
    g = bz.Graph("wide")
    xs = [g.input(f"x{i}", bz.Shape((1, 2))) for i in range(n)]
    c = g.concat([xs[0], *xs], 0)
    g.neg(c)
    g.set_outputs([c])
    return g


def _copy_steps(g) -> int:
    """Python calls made copying `g` by clone_node, copy_node and copy_live (a work count)."""
    import sys

    count = 0

    def tick(frame, event, arg):
        nonlocal count
        count += 1

    live = [True] * (len(g.nodes) - 1) + [False]
    sys.setprofile(tick)
    try:
        by_clone, vmap = bz.Graph("c", record_provenance=False), {}
        for node in g.nodes:
            vmap.update(zip(node.values, by_clone.clone_node(
                node, [vmap[v] for v in node.inputs], g)))
        _by_copy_node(g, live)
        _by_copy_live(g, live)
    finally:
        sys.setprofile(None)
    return count


def test_copies_index_a_wide_nodes_users_in_linear_work():
    """Each input of a copied node was compared with every input before it, so copying a
    5,000-input concat made 12M Value comparisons (grad_with_loss took 3 s)."""
    small, big = _wide_concat(300), _wide_concat(600)
    assert _copy_steps(big) < 2.5 * _copy_steps(small)
    got, _ = _by_copy_live(big, [True] * (len(big.nodes) - 1) + [False])
    concat = got.nodes[-1]
    assert [got.users(v) for v in concat.inputs[:2]] == [[concat], [concat]]
