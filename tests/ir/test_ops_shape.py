"""Shape family specification: reshape (with -1 and symbolic dims), transpose, narrow, concat,
expand, gather, pad, split (multi-output), squeeze / unsqueeze; inference, errors naming the op,
and interpreter results against NumPy written here."""
import numpy as np
import pytest

import braze as bz
from braze.ir.ops.shape import Concat, Narrow, Reshape, Split, Transpose, resolve_reshape

RNG = np.random.default_rng(1)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def run(g, outs, feeds, **kw):
    g.set_outputs(list(outs))
    return bz.interpret(g, feeds, **kw)


# -- reshape -------------------------------------------------------------------------------------
@pytest.mark.parametrize("src, target, want", [
    ((2, 3, 4), (6, -1), (6, 4)),
    ((2, 3, 4), (-1,), (24,)),
    (("b", 4, 8), ("b", -1), ("b", 32)),
    (("b", 4, 8), (-1, 32), ("b", 32)),
    (("b", "s", 8), ("s", "b", 2, -1), ("s", "b", 2, 4)),
    (("b", 6), (2, "b", 3), (2, "b", 3)),
    (("b", 4), (-1,), ("4*b",)),                     # products of symbols are dims too
    (("b", "s", 8), (-1, 8), ("b*s", 8)),
    (("b*s", 8), ("b", "s", 8), ("b", "s", 8)),
    # element counts equal as polynomials, dims written differently (a CLS token, a KV cache)
    (("b", "s+1", 16), ("b*s+b", 16), ("b*s+b", 16)),
    (("b", "s+1", 16), (-1, 16), ("b*s+b", 16)),
    (("b*s+b", 16), ("b", -1, 16), ("b", "s+1", 16)),
    (("b", 1, "p+s"), ("b*p+b*s",), ("b*p+b*s",)),
])
def test_reshape_resolves_minus_one_and_keeps_symbols(src, target, want):
    g = bz.Graph("r")
    x = g.input("x", bz.Shape(src))
    y = g.reshape(x, target)
    assert g.shape_of(y).dims == want
    assert g.node(y).op == Reshape(want)  # the op stores the resolved dims


@pytest.mark.parametrize("src, target, needle", [
    ((2, 3, 4), (5, -1), "do not divide"),
    ((2, 3, 4), (5, 5), "element counts 24 vs 25"),
    (("b", 4), ("c", 4), "symbolic dims"),
    (("b", 4), (-1, 3), "do not divide"),
    (("b", "s+1"), ("b*s", -1), "that input (b, s+1) lacks"),    # no polynomial quotient
    (("b", "s+1"), ("b*s+1",), "symbolic dims"),
    ((2, 3), (-1, -1), "more than one -1"),
])
def test_reshape_errors_name_the_op(src, target, needle):
    g = bz.Graph("r")
    x = g.input("x", bz.Shape(src))
    with pytest.raises(bz.ShapeError, match="reshape") as e:
        g.reshape(x, target)
    assert needle in str(e.value)


def test_resolve_reshape_is_usable_without_a_graph():
    assert resolve_reshape(("n", 2, 2), (-1, 4)) == ("n", 4)


def test_reshape_with_several_symbols_runs_through_the_interpreter():
    g = bz.Graph("r")
    x = g.input("x", bz.Shape(("b", "s", 4, 8)))
    y = g.reshape_(x, ("b", "s", 32))
    z = g.reshape(y, ("s", "b", 2, 16))  # symbols reordered: values need the bindings
    a = rand(2, 3, 4, 8)
    oy, oz = run(g, [y, z], {"x": a})
    np.testing.assert_array_equal(oy, a.reshape(2, 3, 32))
    np.testing.assert_array_equal(oz, a.reshape(3, 2, 2, 16))


def test_a_flatten_of_a_sum_dim_runs_through_the_interpreter():
    g = bz.Graph("r")
    x = g.input("x", bz.Shape(("b", "s+1", 4)))
    flat = g.reshape(x, ("b*s+b", 4))
    back = g.reshape(g.mul(flat, flat), ("b", -1, 4))
    a = rand(3, 5, 4)
    of, ob = run(g, [flat, back], {"x": a})
    np.testing.assert_array_equal(of, a.reshape(15, 4))
    np.testing.assert_array_equal(ob, a * a)


def test_reshape_reference_needs_bindings_only_for_several_symbols():
    a = rand(2, 3, 32)
    np.testing.assert_array_equal(Reshape(("b", 96)).reference(a), a.reshape(2, 96))
    with pytest.raises(ValueError, match=r"reshape target \(s, b, 32\) needs values"):
        Reshape(("s", "b", 32)).reference(a)
    out = Reshape(("s", "b", 32)).reference(a, symbols={"b": 2, "s": 3})
    np.testing.assert_array_equal(out, a.reshape(3, 2, 32))


# -- transpose / narrow / concat -----------------------------------------------------------------
def test_transpose_permutes_axes_and_rejects_non_permutations():
    g = bz.Graph("t")
    x = g.input("x", bz.Shape(("b", 3, 5)))
    y = g.transpose(x, (2, 0, 1))
    assert g.shape_of(y).dims == (5, "b", 3)
    rev = g.transpose_(x)
    assert g.node(rev).op == Transpose((2, 1, 0))
    a = rand(2, 3, 5)
    oy, orev = run(g, [y, rev], {"x": a})
    np.testing.assert_array_equal(oy, np.moveaxis(a, 2, 0))
    np.testing.assert_array_equal(orev, a.T)
    with pytest.raises(bz.ShapeError, match="transpose.*not a permutation"):
        g.transpose(x, (0, 0, 1))


def test_narrow_slices_and_stores_a_non_negative_axis():
    g = bz.Graph("n")
    x = g.input("x", bz.Shape(("b", 10)))
    y = g.narrow(x, -1, 3, 4)
    assert g.node(y).op == Narrow(1, 3, 4)
    assert g.shape_of(y).dims == ("b", 4)
    sym = g.narrow_(x, 0, 1, 1)  # symbolic dim: bounds are checked at run time
    assert g.shape_of(sym).dims == (1, 10)
    a = rand(3, 10)
    oy, osym = run(g, [y, sym], {"x": a})
    np.testing.assert_array_equal(oy, a[:, 3:7])
    np.testing.assert_array_equal(osym, a[1:2])
    with pytest.raises(bz.ShapeError, match=r"narrow.*\[8, 12\) is out of bounds"):
        g.narrow(x, 1, 8, 4)
    with pytest.raises(bz.ShapeError, match="narrow"):
        g.narrow(x, 2, 0, 1)


def test_concat_joins_along_an_axis_with_symbolic_other_dims():
    g = bz.Graph("c")
    xs = [g.input(f"x{i}", bz.Shape(("b", n, 4))) for i, n in enumerate((1, 2, 3))]
    y = g.concat(xs, -2)
    assert g.node(y).op == Concat(1)
    assert g.shape_of(y).dims == ("b", 6, 4)
    arrs = [rand(2, n, 4) for n in (1, 2, 3)]
    (out,) = run(g, [y], {f"x{i}": a for i, a in enumerate(arrs)})
    np.testing.assert_array_equal(out, np.concatenate(arrs, axis=1))
    other = g.input("o", bz.Shape(("b", 2, 5)))
    with pytest.raises(bz.ShapeError, match="concat inputs differ at axis 2"):
        g.concat_([xs[0], other], 1)
    seq = g.input("s", bz.Shape(("b", "s", 4)))
    joined = g.concat([xs[0], seq], 1)                 # symbolic sizes add up: s+1
    assert g.shape_of(joined).dims == ("b", "s+1", 4)
    a, b = rand(2, 1, 4), rand(2, 5, 4)
    feeds = {"x0": a, "x1": rand(2, 2, 4), "x2": rand(2, 3, 4), "o": rand(2, 2, 5), "s": b}
    (out,) = run(g, [joined], feeds)
    np.testing.assert_array_equal(out, np.concatenate([a, b], axis=1))


# -- expand / gather / pad -----------------------------------------------------------------------
def test_expand_broadcasts_including_symbolic_targets():
    g = bz.Graph("e")
    x = g.input("x", bz.Shape((1, 4)))
    n = g.input("n", bz.Shape(("b", 3, 1)))
    y = g.expand(x, ("b", 3, 4))
    keep = g.expand(n, (-1, -1, 4))
    assert g.shape_of(y).dims == ("b", 3, 4)
    assert g.shape_of(keep).dims == ("b", 3, 4)
    a, c = rand(1, 4), rand(2, 3, 1)
    oy, ok = run(g, [y, keep], {"x": a, "n": c})
    np.testing.assert_array_equal(oy, np.tile(a, (2, 3, 1)))
    np.testing.assert_array_equal(ok, np.repeat(c, 4, axis=2))
    with pytest.raises(bz.ShapeError, match="expand cannot stretch input dim 1 of size 4 to 5"):
        g.expand(x, (2, 5))


def test_gather_takes_along_an_axis_with_any_index_rank():
    g = bz.Graph("g")
    table = g.input("t", bz.Shape((5, "d", 3)))
    idx = g.input("i", bz.Shape(("b", 2), bz.i64))
    rows = g.gather_(table, idx)
    mid = g.gather(table, idx, axis=-2)
    assert g.shape_of(rows).dims == ("b", 2, "d", 3)
    assert g.shape_of(mid).dims == (5, "b", 2, 3)
    t = rand(5, 4, 3)
    i = np.array([[0, 3], [2, 2], [1, 0]], dtype=np.int64)
    orow, omid = run(g, [rows, mid], {"t": t, "i": i})
    np.testing.assert_array_equal(orow[1, 0], t[2])
    np.testing.assert_array_equal(orow[0, 1], t[3])
    np.testing.assert_array_equal(omid[:, 0, 1], t[:, 3])
    np.testing.assert_array_equal(omid[:, 2, 0], t[:, 1])
    with pytest.raises(bz.ShapeError, match="gather indices must be integers"):
        g.gather(table, table)


def test_pad_adds_constant_borders():
    g = bz.Graph("p")
    x = g.input("x", bz.Shape(("b", 2, 3)))
    y = g.pad(x, ((0, 0), (1, 0), (2, 1)), value=-7.0)
    assert g.shape_of(y).dims == ("b", 3, 6)
    a = rand(2, 2, 3)
    (out,) = run(g, [y], {"x": a})
    want = np.full((2, 3, 6), -7.0, np.float32)
    want[:, 1:, 2:5] = a
    np.testing.assert_array_equal(out, want)
    with pytest.raises(bz.ShapeError, match="pad needs one .* pair per axis"):
        g.pad(x, ((1, 1),))
    grown = g.pad(x, ((1, 0), (0, 0), (0, 0)))          # a padded symbol is an expression
    assert g.shape_of(grown).dims == ("b+1", 2, 3)
    (out,) = run(g, [grown], {"x": a})
    assert out.shape == (3, 2, 3) and not out[0].any()


# -- split ---------------------------------------------------------------------------------------
def test_split_outputs_feed_downstream_nodes():
    g = bz.Graph("s")
    x = g.input("x", bz.Shape(("b", 10)))
    q, k, v = g.split(x, -1, (2, 3, 5))
    assert g.node(q).op == Split(1, (2, 3, 5))
    assert [g.shape_of(t).dims for t in (q, k, v)] == [("b", 2), ("b", 3), ("b", 5)]
    assert q.node == k.node == v.node and (k.index, v.index) == (1, 2)
    y = g.add(g.mul(q, g.narrow(k, 1, 0, 2)), g.narrow(v, 1, 3, 2))
    assert [n.op for n in g.users(k)] == [Narrow(1, 0, 2)]
    assert [n.op.label for n in g.users(q)] == ["mul"]
    a = rand(4, 10)
    (out,) = run(g, [y], {"x": a})
    np.testing.assert_allclose(out, a[:, 0:2] * a[:, 2:4] + a[:, 8:10], rtol=1e-6)
    with pytest.raises(bz.ShapeError, match=r"split sizes \(2, 3\) sum to 5, axis 1 has 10"):
        g.split(x, 1, (2, 3))
    with pytest.raises(bz.ShapeError, match="split axis 0 is symbolic"):
        g.split(x, 0, (1, 2))


# -- squeeze / unsqueeze -------------------------------------------------------------------------
def test_squeeze_and_unsqueeze_are_reshapes():
    g = bz.Graph("q")
    x = g.input("x", bz.Shape(("b", 1, 4, 1)))
    s = g.squeeze(x, 1)
    s_all = g.squeeze(x)
    u = g.unsqueeze(s_all, (0, -1))
    assert g.shape_of(s).dims == ("b", 4, 1)
    assert g.shape_of(s_all).dims == ("b", 4)
    assert g.shape_of(u).dims == (1, "b", 4, 1)
    assert g.count(Reshape) == 3
    a = rand(3, 1, 4, 1)
    os_, oa, ou = run(g, [s, s_all, u], {"x": a})
    np.testing.assert_array_equal(os_, np.squeeze(a, 1))
    np.testing.assert_array_equal(ou, np.expand_dims(np.squeeze(a), (0, -1)))
    with pytest.raises(bz.ShapeError, match="squeeze axis 2 has size 4"):
        g.squeeze(x, 2)


# -- float64 mode --------------------------------------------------------------------------------
def test_float64_interpret_runs_the_whole_family():
    g = bz.Graph("f64")
    x = g.input("x", bz.Shape((2, 6)))
    i = g.input("i", bz.Shape((3,), bz.i32))
    a, b = g.split(x, 1, (4, 2))
    y = g.concat([g.transpose(g.reshape(a, (2, 2, 2)), (0, 2, 1)), g.expand(
        g.unsqueeze(b, 2), (2, 2, 2))], 2)
    z = g.gather(g.pad(y, ((0, 0), (1, 1), (0, 0))), i, axis=1)
    feeds = {"x": rand(2, 6), "i": np.array([0, 3, 1], np.int32)}
    (o32,) = run(g, [z], feeds)
    (o64,) = run(g, [z], feeds, float64=True)
    assert o32.dtype == np.float32 and o64.dtype == np.float64
    xa = feeds["x"].astype(np.float64)
    ya = np.concatenate([xa[:, :4].reshape(2, 2, 2).transpose(0, 2, 1),
                         np.broadcast_to(xa[:, 4:, None], (2, 2, 2))], axis=2)
    want = np.pad(ya, ((0, 0), (1, 1), (0, 0)))[:, [0, 3, 1]]
    np.testing.assert_allclose(o64, want, rtol=1e-12)
    np.testing.assert_allclose(o32, want, rtol=1e-6)
