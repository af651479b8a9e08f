"""LegalizeBroadcast: operands of binary / compare / where that broadcast other than as a scalar or
a trailing block get an explicit expand to the output's trailing dims (symbolic dims kept), legal
operands are untouched, numbers are equal, and a trailing_broadcast_only backend gets a legal
graph through bz.rewrite_for_backend."""
from collections import Counter

import numpy as np
import pytest

import braze as bz
from braze.passes.constraints import broadcasts_trailing_only
from braze.testing import assert_equivalent

TRAILING = bz.get_target("cpu").with_options(constraints=frozenset({"trailing_broadcast_only"}))


def legal(g):
    return all(broadcasts_trailing_only(n, g) for n in g.nodes)


def expands(g):
    return sorted((tuple(n.outputs[0].dims) for n in g.nodes if n.op.kind == "expand"), key=str)


def test_column_and_middle_broadcasts_become_expands():
    g = bz.Graph("bcast")
    x = g.input("x", bz.Shape(("b", 4, 6)))
    col = g.input("col", bz.Shape((4, 1)))
    mask = g.input("mask", bz.Shape(("b", 1, 6), bz.bool_))
    mid = g.input("mid", bz.Shape((2, 1, 1)))
    y = g.where(mask, g.add(x, col), 0.0)
    z = g.mul(g.input("big", bz.Shape((3, 2, 5, 7))), mid)
    g.set_outputs([y, z])
    before = str(g)
    assert not legal(g)
    out = bz.LegalizeBroadcast(g)
    assert str(g) == before
    assert legal(out)
    assert expands(out) == [("b", 4, 6), (2, 5, 7), (4, 6)]
    assert out.op_counts() == {"expand": 3, "add": 1, "where": 1, "mul": 1}
    assert_equivalent(g, out, symbols={"b": 2})


def test_scalars_rows_and_full_shapes_are_left_alone():
    g = bz.Graph("fine")
    x = g.input("x", bz.Shape(("b", 4, 6)))
    row = g.input("row", bz.Shape((1, 6)))
    block = g.input("block", bz.Shape((4, 6)))
    y = g.add(g.mul(x, 2.0), row)
    g.set_outputs([g.sub(y, block), g.lt(x, g.constant(np.zeros((1, 1, 6), np.float32)))])
    assert legal(g)
    res = bz.LegalizeBroadcast.run(g)
    assert not res.changed and res.graph is g


def test_compare_with_a_leading_broadcast_operand():
    g = bz.Graph("cmp")
    x = g.input("x", bz.Shape((5, 3)))
    t = g.input("t", bz.Shape((5, 1)))
    g.set_outputs([g.lt(t, x)])
    out = bz.LegalizeBroadcast(g)
    assert expands(out) == [(5, 3)] and [n.op.kind for n in out.nodes][-1] == "compare"
    assert_equivalent(g, out)


def test_trailing_broadcast_backend_gets_a_legal_graph_through_rewrite_for_backend():
    g = bz.Graph("net")
    x = g.input("x", bz.Shape(("b", 4, 6)))
    w = g.param("w", bz.Shape((6, 6)))
    h = g.mm(x, w)
    scale = g.reduce_max(h, -1, keepdims=True)               # [b, 4, 1]: a column
    g.set_outputs([g.div(h, scale)])
    with pytest.raises(bz.LegalizeError, match="trailing_broadcast_only"):
        bz.legalize(g, TRAILING)
    trace = Counter()
    low = bz.rewrite_for_backend(g, TRAILING, trace=trace)
    assert trace == Counter({"LegalizeBroadcast": 1})
    assert bz.legalize(low, TRAILING) is low
    assert bz.rewrite_for_backend(low, TRAILING) is low
    assert_equivalent(g, low, symbols={"b": 3})


def test_targets_without_the_constraint_keep_the_broadcasts():
    g = bz.Graph("cpu")
    x = g.input("x", bz.Shape((4, 6)))
    g.set_outputs([g.add(x, g.input("c", bz.Shape((4, 1))))])
    assert bz.rewrite_for_backend(g, "cpu") is g
