"""LowerNonLastAxisReduce: every reduction kind over non-trailing or several axes becomes a
trailing-axis one with equal numbers (keepdims honoured, symbolic dims kept); trailing-axis
reductions are untouched; a reduce_last_axis_only backend gets legal graphs through
rewrite_for_backend."""
from collections import Counter

import numpy as np
import pytest
from lowering_helpers import op_counts

import braze as bz
from braze.passes.constraints import reduces_last_axis_only
from braze.testing import assert_equivalent

SHAPE = bz.Shape(("b", 5, 7, 3))


def _graph(build, shape=SHAPE):
    g = bz.Graph("red")
    g.set_outputs([build(g, g.input("x", shape))])
    return g


CASES = {
    "sum_two_axes": (lambda g, x: g.sum(x, (0, 2)), "reduce_sum"),
    "mean_middle_keepdims": (lambda g, x: g.mean(x, (1, 2), keepdims=True), "reduce_mean"),
    "max_one_axis": (lambda g, x: g.reduce_max(x, 1), "reduce_max"),
    "min_leading_keepdims": (lambda g, x: g.reduce_min(x, 0, keepdims=True), "reduce_min"),
    "prod_every_axis": (lambda g, x: g.prod(x, None, keepdims=True), "reduce_prod"),
    "sum_two_trailing": (lambda g, x: g.sum(x, (2, 3)), "reduce_sum"),
    "argmax_keepdims": (lambda g, x: g.argmax(x, 1, keepdims=True), "argmax"),
    "argmax_symbolic_axis": (lambda g, x: g.argmax(x, 0), "argmax"),
    "cumsum_exclusive_reverse": (lambda g, x: g.cumsum(x, 1, True, True), "cumsum"),
    "softmax": (lambda g, x: g.softmax(x, 2), "softmax"),
    "log_softmax": (lambda g, x: g.log_softmax(x, 0), "log_softmax"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_off_axis_reductions_become_last_axis_ones_with_equal_numbers(case):
    build, label = CASES[case]
    g = _graph(build)
    res = bz.LowerNonLastAxisReduce.run(g)
    assert res.changed
    (node,) = [n for n in res.graph.nodes if n.op.label == label]
    assert reduces_last_axis_only(node, res.graph)
    assert res.graph.shape_of(res.graph.outputs[0]) == g.shape_of(g.outputs[0])
    assert_equivalent(g, res.graph, symbols={"b": 4})


def test_several_axes_are_merged_into_one_reduction():
    res = bz.LowerNonLastAxisReduce.run(_graph(lambda g, x: g.mean(x, (0, 2), keepdims=True)))
    assert op_counts(res.graph) == Counter({"transpose": 1, "reshape": 2, "reduce_mean": 1})
    (red,) = [n for n in res.graph.nodes if n.op.kind == "reduce"]
    assert res.graph.shape_of(red.inputs[0]).dims == (5, 3, "7*b")


def test_axis_moves_back_after_softmax():
    res = bz.LowerNonLastAxisReduce.run(_graph(lambda g, x: g.softmax(x, 1)))
    assert op_counts(res.graph) == Counter({"transpose": 2, "softmax": 1})


def test_reduce_over_no_axes_is_the_identity():
    g = _graph(lambda g, x: g.exp(g.reduce(x, "sum", ())), bz.Shape((2, 3)))
    res = bz.LowerNonLastAxisReduce.run(g)
    assert op_counts(res.graph) == Counter({"exp": 1})
    assert_equivalent(g, res.graph)


@pytest.mark.parametrize("build", [
    lambda g, x: g.sum(x, 3), lambda g, x: g.softmax(x, -1), lambda g, x: g.argmax(x, 3),
    lambda g, x: g.cumsum(x, 3), lambda g, x: g.mean(x, -1, keepdims=True),
], ids=["sum", "softmax", "argmax", "cumsum", "mean_keepdims"])
def test_last_axis_reductions_are_untouched(build):
    g = _graph(build)
    res = bz.LowerNonLastAxisReduce.run(g)
    assert not res.changed and res.graph is g


def test_input_graph_is_not_mutated():
    g = _graph(CASES["sum_two_axes"][0])
    before = str(g)
    bz.LowerNonLastAxisReduce(g)
    assert str(g) == before


def test_reduce_last_axis_only_backend_gets_a_legal_graph():
    g = bz.Graph("net")
    x = g.input("x", bz.Shape(("b", 4, 6)))
    h = g.softmax(g.mm(x, g.param("w", bz.Shape((6, 6)))), 1)
    g.set_outputs([g.add(g.mean(h, (0, 1)), g.sum(h, -1, keepdims=True))])
    target = bz.get_target("cpu").with_options(constraints=frozenset({"reduce_last_axis_only"}))
    with pytest.raises(bz.LegalizeError, match="reduce_last_axis_only"):
        bz.legalize(g, target)
    trace = Counter()
    low = bz.rewrite_for_backend(g, target, trace=trace)
    assert trace == Counter({"LowerNonLastAxisReduce": 2})
    assert bz.legalize(low, target) is low
    assert_equivalent(g, low, symbols={"b": 3})


def test_lowered_argmax_keeps_the_first_maximum():
    g = _graph(lambda g, x: g.argmax(x, 0), bz.Shape((4, 3)))
    low = bz.LowerNonLastAxisReduce(g)
    x = np.array([[1, 5, 2], [3, 5, 2], [3, 0, 2], [0, 5, 1]], np.float32)
    (want,), (got,) = bz.interpret(g, {"x": x}), bz.interpret(low, {"x": x})
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, [1, 0, 0])
