"""LowerResizeNearest2x: 2x nearest upsampling becomes reshape + expand + reshape (no gather)
with the interpreter's numbers, symbolic batch included; graphs without it are left alone; a
backend without it gets it through rewrite_for_backend."""
from collections import Counter

import numpy as np
import pytest
from lowering_helpers import op_counts

import braze as bz
from braze.passes.targets import all_op_names
from braze.testing import assert_equivalent


def _up(dims):
    g = bz.Graph("up")
    g.set_outputs([g.resize_nearest_2x(g.input("x", bz.Shape(dims)))])
    return g


@pytest.mark.parametrize("dims", [(1, 1, 1, 1), (2, 3, 5, 7), ("n", 4, 3, 2)],
                         ids=["one_pixel", "odd", "symbolic"])
def test_resize_lowers_to_reshape_expand_reshape_with_equal_numbers(dims):
    g = _up(dims)
    res = bz.LowerResizeNearest2x.run(g)
    assert res.changed
    assert op_counts(res.graph) == Counter({"reshape": 2, "expand": 1})
    out = res.graph.outputs[0]
    assert res.graph.shape_of(out) == g.shape_of(g.outputs[0])
    assert_equivalent(g, res.graph, symbols={"n": 3})


def test_each_pixel_is_repeated_two_by_two():
    low = bz.LowerResizeNearest2x(_up((1, 1, 2, 2)))
    (y,) = bz.interpret(low, {"x": np.array([[[[1, 2], [3, 4]]]], np.float32)})
    np.testing.assert_array_equal(y[0, 0], [[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 4, 4],
                                            [3, 3, 4, 4]])


def test_graph_without_resize_is_unchanged():
    g = bz.Graph("pool")
    g.set_outputs([g.global_avg_pool(g.input("x", bz.Shape((1, 2, 3, 3))))])
    res = bz.LowerResizeNearest2x.run(g)
    assert not res.changed and res.graph is g


def test_input_graph_is_not_mutated():
    g = _up((1, 2, 3, 3))
    before = str(g)
    bz.LowerResizeNearest2x(g)
    assert str(g) == before


def test_backend_without_resize_gets_it_through_rewrite_for_backend():
    g = _up(("n", 2, 3, 4))
    target = bz.get_target("cpu").restrict(all_op_names() - {"resize_nearest_2x"}, name="no_up")
    trace = Counter()
    low = bz.rewrite_for_backend(g, target, trace=trace)
    assert trace == Counter({"LowerResizeNearest2x": 1})
    assert bz.legalize(low, target) is low
    assert_equivalent(g, low, symbols={"n": 2})
