"""Reduce family specification: reduce (sum, mean, max, min, prod) and its short names, softmax
(direct reference, decomposition, stability), cumsum (exclusive / reverse) and argmax, checked
against NumPy computations written here."""
import numpy as np
import pytest

import braze as bz
from braze.interpret import decomposition_graph
from braze.ir.ops.reduce import ArgMax, Cumsum, Reduce, ReduceFn, Softmax

RNG = np.random.default_rng(2)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def run(g, outs, feeds, **kw):
    g.set_outputs(list(outs))
    return bz.interpret(g, feeds, **kw)


# -- reduce --------------------------------------------------------------------------------------
NP_REDUCE = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}


@pytest.mark.parametrize("fn", list(NP_REDUCE))
@pytest.mark.parametrize("axes, keepdims", [(None, False), (-1, True), ((0, 2), False),
                                            ((2, 0), True)])
def test_reduce_matches_numpy(fn, axes, keepdims):
    g = bz.Graph("r")
    x = g.input("x", bz.Shape((3, 4, 5)))
    y = g.reduce(x, fn, axes, keepdims)
    a = rand(3, 4, 5)
    (out,) = run(g, [y], {"x": a})
    want = NP_REDUCE[fn](a.astype(np.float64), axis=axes, keepdims=keepdims)
    assert out.dtype == np.float32 and out.shape == np.shape(want)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_reduce_stores_sorted_non_negative_axes_and_is_labelled_by_fn():
    g = bz.Graph("r")
    x = g.input("x", bz.Shape(("b", "s", 8)))
    y = g.reduce(x, "max", (-1, 0), keepdims=True)
    op = g.node(y).op
    assert op == Reduce(ReduceFn.MAX, (0, 2), True)
    assert op.label == "reduce_max"
    assert g.shape_of(y).dims == (1, "s", 1)
    assert g.shape_of(g.sum(x, 1)).dims == ("b", 8)
    assert g.node(g.mean(x)).op.axes == (0, 1, 2)
    assert g.op_counts() == {"reduce_max": 1, "reduce_sum": 1, "reduce_mean": 1}


def test_short_names_pick_their_functions():
    g = bz.Graph("r")
    x = g.input("x", bz.Shape((2, 3)))
    outs = [g.sum(x, 1), g.mean(x, 1), g.reduce_max(x, 1), g.reduce_min(x, 1), g.prod(x, 1)]
    assert [g.node(v).op.fn for v in outs] == [ReduceFn.SUM, ReduceFn.MEAN, ReduceFn.MAX,
                                               ReduceFn.MIN, ReduceFn.PROD]
    a = rand(2, 3)
    res = run(g, outs, {"x": a})
    for got, want in zip(res, [a.sum(1), a.mean(1), a.max(1), a.min(1), a.prod(1)]):
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_integer_sum_keeps_dtype():
    g = bz.Graph("r")
    x = g.input("x", bz.Shape((4, 3), bz.i32))
    y = g.sum(x, 0)
    assert g.shape_of(y).dtype == bz.i32
    a = np.arange(12, dtype=np.int32).reshape(4, 3)
    (out,) = run(g, [y], {"x": a})
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [18, 22, 26])


def test_reduce_errors_name_the_op():
    g = bz.Graph("r")
    x = g.input("x", bz.Shape((2, 3)))
    with pytest.raises(bz.ShapeError, match="reduce_sum.*axis 2 is out of range"):
        g.sum(x, 2)
    with pytest.raises(bz.ShapeError, match="reduce_mean: axes .* repeat"):
        g.mean(x, (1, -1))
    ints = g.input("i", bz.Shape((2,), bz.i64))
    with pytest.raises(bz.ShapeError, match="reduce_mean needs a float input"):
        g.mean(ints)
    with pytest.raises(bz.GraphError, match="unknown ReduceFn 'median'"):
        g.reduce(x, "median")


# -- softmax -------------------------------------------------------------------------------------
def np_softmax(a, axis):
    a = a.astype(np.float64)
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_matches_numpy_and_its_decomposition(axis):
    g = bz.Graph("s")
    x = g.input("x", bz.Shape(("b", 5, 7)))
    y = g.softmax(x, axis)
    op = g.node(y).op
    assert op == Softmax(axis % 3) and op.composite
    a = rand(3, 5, 7)
    (out,) = run(g, [y], {"x": a})
    np.testing.assert_allclose(out, np_softmax(a, axis), rtol=1e-5, atol=1e-7)
    dec = decomposition_graph(op, [bz.Shape((3, 5, 7))])
    assert dec.op_counts() == {"reduce_max": 1, "sub": 1, "exp": 1, "reduce_sum": 1, "div": 1,
                               "isinf": 1, "eq": 1, "where": 2}  # the fully-masked-row guards
    (via_dec,) = bz.interpret(dec, {"x0": a})
    np.testing.assert_allclose(via_dec, out, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("via_decomposition", [False, True])
def test_softmax_of_a_fully_masked_row_is_zero_not_nan(via_decomposition):
    g = bz.Graph("s")
    x = g.input("x", bz.Shape((2, 3)))
    y = g.sm(x)
    g.set_outputs([y])
    if via_decomposition:
        g = bz.unfuse_fused_for_autodiff(g)
        from braze.passes.expand import expand_nodes

        g, _ = expand_nodes(g, lambda op: op.composite)
        assert "softmax" not in g.op_counts()
    a = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 0.0]], np.float32)
    (out,) = bz.interpret(g, {"x": a})
    np.testing.assert_array_equal(out, [[0, 0, 0], [0.5, 0, 0.5]])


def test_log_softmax_matches_numpy_and_its_decomposition():
    g = bz.Graph("ls")
    x = g.input("x", bz.Shape((3, 5)))
    y = g.log_softmax(x, 0)
    a = rand(3, 5) * 30
    (out,) = run(g, [y], {"x": a})
    np.testing.assert_allclose(out, np.log(np_softmax(a.astype(np.float64), 0)), rtol=1e-5,
                               atol=1e-5)
    dec = decomposition_graph(g.node(y).op, [bz.Shape((3, 5))])
    (via_dec,) = bz.interpret(dec, {"x0": a})
    np.testing.assert_allclose(via_dec, out, rtol=1e-6, atol=1e-6)


def test_softmax_is_stable_for_large_logits():
    g = bz.Graph("s")
    x = g.input("x", bz.Shape((2, 3)))
    y = g.sm(x)
    a = np.array([[1000.0, 1001.0, 999.0], [-1e4, 0.0, -1e4]], np.float32)
    (out,) = run(g, [y], {"x": a})
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, np_softmax(a, -1), rtol=1e-5, atol=1e-7)


def test_softmax_rejects_integers():
    g = bz.Graph("s")
    x = g.input("x", bz.Shape((2, 3), bz.i32))
    with pytest.raises(bz.ShapeError, match="softmax needs a float input"):
        g.softmax(x)


# -- cumsum / argmax -----------------------------------------------------------------------------
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum_variants(exclusive, reverse):
    g = bz.Graph("c")
    x = g.input("x", bz.Shape(("b", 6)))
    y = g.cumsum(x, -1, exclusive=exclusive, reverse=reverse)
    assert g.node(y).op == Cumsum(1, exclusive, reverse)
    assert g.shape_of(y).dims == ("b", 6)
    a = rand(3, 6).astype(np.float64)
    want = np.zeros_like(a)
    for j in range(6):
        cols = range(j, 6) if reverse else range(j + 1)
        want[:, j] = sum(a[:, k] for k in cols if not (exclusive and k == j))
    (out,) = run(g, [y], {"x": a.astype(np.float32)})
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_argmax_gives_i64_first_maximum():
    g = bz.Graph("a")
    x = g.input("x", bz.Shape(("b", 4)))
    y = g.argmax(x, -1)
    k = g.argmax(x, 0, keepdims=True)
    assert g.node(y).op == ArgMax(1, False)
    assert g.shape_of(y) == bz.Shape(("b",), bz.i64)
    assert g.shape_of(k).dims == (1, 4)
    a = np.array([[0, 3, 3, 1], [5, 1, 2, 5], [0, 0, 9, 0]], np.float32)
    oy, ok = run(g, [y, k], {"x": a})
    assert oy.dtype == np.int64
    np.testing.assert_array_equal(oy, [1, 0, 2])
    np.testing.assert_array_equal(ok, [[1, 0, 2, 1]])


# -- float64 mode --------------------------------------------------------------------------------
def test_float64_interpret_of_the_family():
    g = bz.Graph("f64")
    x = g.input("x", bz.Shape((3, 4)))
    y = g.add(g.softmax(g.cumsum(x, 1), 0), g.mean(x, 1, keepdims=True))
    a = rand(3, 4)
    (o64,) = run(g, [y], {"x": a}, float64=True)
    (o32,) = run(g, [y], {"x": a})
    assert o64.dtype == np.float64
    a64 = a.astype(np.float64)
    want = np_softmax(np.cumsum(a64, 1), 0) + a64.mean(1, keepdims=True)
    np.testing.assert_allclose(o64, want, rtol=1e-12)
    np.testing.assert_allclose(o32, want, rtol=1e-5)
