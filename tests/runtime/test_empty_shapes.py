"""Degenerate sizes: a node making values out of an empty input (a K = 0 matmul, a reduction
over a zero-length axis) runs the NumPy reference, as the interpreter does
(registry.kernel_for), so no native kernel meets one: a K = 0 matmul is zeros (plus bias,
through the activation), reductions over an empty axis give ONNX's identities (max -inf, min
+inf, sum 0), softmax of an empty array is empty. Found by a strided-view sweep: the compiled
K = 0 matmul had raised."""
import numpy as np
import pytest

import braze as bz


def _matmul(g):
    x = g.input("x", bz.Shape((4, 6, 16)))
    return [g.matmul(g.narrow(x, 2, 3, 0), g.param("w", bz.Shape((0, 8))))]


def _batched(g):
    x = g.input("x", bz.Shape((4, 6, 0)))
    return [g.matmul(x, g.input("y", bz.Shape((4, 0, 5))))]


def _linear(g):
    x = g.input("x", bz.Shape((4, 6, 0)))
    return [g.linear_fused(x, g.param("w", bz.Shape((0, 8))), g.param("b", bz.Shape((8,))),
                           "gelu")]


def _bias_relu(g):
    x = g.input("x", bz.Shape((4, 6, 0)))
    y = g.add(g.matmul(x, g.param("w", bz.Shape((0, 8)))), g.param("b", bz.Shape((8,))))
    return [g.relu(y)]


def _reductions(g):
    v = g.narrow(g.input("x", bz.Shape((4, 6, 16))), 2, 0, 0)
    return [g.reduce(v, "max", [2]), g.reduce(v, "min", [2]), g.reduce(v, "sum", [2]),
            g.softmax(v, -1), g.log_softmax(v, -1)]


CASES = {"matmul": _matmul, "batched": _batched, "linear_fused": _linear,
         "matmul + bias + relu": _bias_relu, "reductions": _reductions}


@pytest.mark.parametrize("precision", [None, "bf16"])
@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_empty_operands_compile_to_the_reference(case, fuse, precision):
    g = bz.Graph("empty")
    g.set_outputs(CASES[case](g))
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params, fuse=fuse, precision=precision)
    for seed in (0, 1):
        feeds = bz.random_feeds(g, seed)
        want = bz.interpret(exe.graph, feeds, params)
        for got, ref in zip(exe(feeds), want, strict=True):
            assert got.shape == ref.shape
            np.testing.assert_array_equal(got, ref)
    if case != "reductions":
        (out,) = want
        assert out.size and not np.isnan(out).any()
        if case in ("matmul", "batched"):
            assert not out.any()  # a sum of no products


def test_reductions_over_an_empty_axis_are_the_identities():
    g = bz.Graph("empty")
    g.set_outputs(_reductions(g))
    mx, mn, total, sm, lsm = bz.interpret(g, bz.random_feeds(g, 0))
    assert (mx == -np.inf).all() and (mn == np.inf).all() and (total == 0).all()
    assert sm.shape == lsm.shape == (4, 6, 0)


@pytest.mark.parametrize("dtype", [bz.u8, bz.i32, bz.i64])
def test_integer_max_and_min_over_an_empty_axis_are_the_dtype_bounds(dtype):
    """An empty integer max is the dtype's lowest value and its min the highest, compiled and
    interpreted (unsigned types had failed: the max's start was -max, out of a u8's range)."""
    g = bz.Graph("empty_int")
    x = g.input("x", bz.Shape((0, 3), dtype))
    g.set_outputs([g.reduce_max(x, (0,)), g.reduce_min(x, (0,))])
    info = np.iinfo(dtype.np)
    feeds = {"x": np.zeros((0, 3), dtype.np)}
    for mx, mn in (bz.interpret(g, feeds), bz.compile(g)(feeds)):
        assert (mx == info.min).all() and (mn == info.max).all()
        assert mx.dtype == mn.dtype == dtype.np
