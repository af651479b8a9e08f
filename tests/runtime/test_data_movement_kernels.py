"""Strided-slice and constant-pad kernels against the reference interpreter (odd sizes,
negative steps and bounds, a symbolic batch), and the dispatch report lists them as native;
reflect padding still runs its reference."""
import numpy as np
import pytest

import braze as bz
from braze.ir.ops.shape import PadMode
from braze.runtime.kernels import Dispatch


def _compiled(g, symbols=None):
    exe = bz.compile(g, fuse=False)
    for seed in (0, 1):
        feeds = bz.random_feeds(g, seed, symbols)
        for got, want in zip(exe(feeds), bz.interpret(g, feeds), strict=True):
            np.testing.assert_array_equal(got, want)
    return {kind: d for _, kind, d, _ in exe.dispatch_report().rows}


@pytest.mark.parametrize("axis,start,stop,step", [(1, 0, 7, 2), (2, 1, 9, 2), (-1, -1, -10, -3),
                                                  (1, 5, 0, -1)])
def test_strided_slices_match_the_interpreter(axis, start, stop, step):
    g = bz.Graph("slice")
    x = g.input("x", bz.Shape(("batch", 7, 9)))
    g.set_outputs([g.mul(g.slice(x, axis, start, stop, step), g.constant(np.float32(2.0)))])
    kinds = _compiled(g, {"batch": 3})
    assert kinds["slice"] == Dispatch.NATIVE


@pytest.mark.parametrize("pads,value", [(((0, 0), (0, 0), (0, 1), (0, 1)), 0.0),
                                        (((0, 0), (1, 2), (3, 0), (2, 1)), -1.5),
                                        (((0, 0),) * 4, 0.0)])
def test_constant_pads_match_the_interpreter(pads, value):
    g = bz.Graph("pad")
    x = g.input("x", bz.Shape(("batch", 3, 5, 6)))
    g.set_outputs([g.relu(g.pad(x, pads, value))])
    kinds = _compiled(g, {"batch": 2})
    assert kinds["pad"] in (Dispatch.NATIVE, Dispatch.VIEW)


def test_reflect_pad_runs_its_reference():
    g = bz.Graph("reflect")
    x = g.input("x", bz.Shape((2, 3, 5, 6)))
    g.set_outputs([g.relu(g.pad(x, ((0, 0), (0, 0), (1, 1), (2, 2)), mode=PadMode.REFLECT))])
    assert _compiled(g)["pad"] == Dispatch.REFERENCE


def _gather_elements_graph(x_shape, idx_shape, axis, x_dtype=bz.f32, idx_dtype=bz.i64):
    from braze.ir.ops.indexing import GatherElements

    g = bz.Graph("gather_elements")
    x = g.input("x", bz.Shape(x_shape, x_dtype))
    i = g.input("i", bz.Shape(idx_shape, idx_dtype))
    g.set_outputs([g.add_node(GatherElements(axis=axis), [x, i])[0]])
    return g


def _gather_feeds(g, x_shape, idx_shape, axis, seed):
    rng = np.random.default_rng(seed)
    n = x_shape[axis]
    feeds = bz.random_feeds(g, seed)
    feeds["i"] = rng.integers(-n, n, idx_shape).astype(feeds["i"].dtype)  # negatives too
    return feeds


@pytest.mark.parametrize("x_shape, idx_shape, axis, x_dtype, idx_dtype", [
    ((3, 17, 40), (3, 17, 29), -1, bz.f32, bz.i64),   # DeBERTa's row gather
    ((5, 7, 9), (5, 11, 9), 1, bz.i64, bz.i32),       # a middle axis, 8-byte data, more rows
    ((6, 4), (2, 4), 0, bz.f32, bz.i64),
    ((2, 3, 4, 5), (2, 3, 4, 1), 3, bz.i32, bz.i32),
])
def test_gather_elements_matches_the_interpreter(x_shape, idx_shape, axis, x_dtype, idx_dtype):
    g = _gather_elements_graph(x_shape, idx_shape, axis, x_dtype, idx_dtype)
    exe = bz.compile(g, fuse=False)
    for seed in (0, 1):
        feeds = _gather_feeds(g, x_shape, idx_shape, axis, seed)
        np.testing.assert_array_equal(exe(feeds)[0], bz.interpret(g, feeds)[0])
    rows = exe.dispatch_report().rows
    assert [(k, d, impl) for _, k, d, impl in rows] == [
        ("gather_elements", Dispatch.NATIVE, "C gather_elements")]


def test_gather_elements_out_of_range_and_smaller_dims():
    """An index outside [-n, n) is a braze error naming the node; indices smaller than the data
    off the axis (which ONNX allows) run the reference."""
    g = _gather_elements_graph((4, 6), (4, 3), 1)
    exe = bz.compile(g, fuse=False)
    feeds = _gather_feeds(g, (4, 6), (4, 3), 1, 0)
    feeds["i"][2, 1] = 6
    with pytest.raises(bz.InterpretError, match="gather_elements .* outside"):
        exe(feeds)
    g = _gather_elements_graph((4, 6), (3, 2), 1)
    exe = bz.compile(g, fuse=False)
    feeds = _gather_feeds(g, (4, 6), (3, 2), 1, 1)
    np.testing.assert_array_equal(exe(feeds)[0], bz.interpret(g, feeds)[0])
    assert {d for _, k, d, _ in exe.dispatch_report().rows} == {Dispatch.REFERENCE}


@pytest.mark.parametrize("static", [True, False])
def test_gather_elements_index_repeated_over_leading_axes(static):
    """DeBERTa's relative-position index: [1, S, S] expanded over batch x heads. Static (a
    param here; in the model, computed once per binding) it is reduced to its distinct block
    and read from cache; fed at run time, its broadcast view is read without a copy."""
    from braze.ir.ops.indexing import GatherElements

    rng = np.random.default_rng(2)
    s, n, reps = 9, 20, 6
    table = rng.integers(-n, n, (1, s, s)).astype(np.int64)
    g = bz.Graph("rel")
    x = g.input("x", bz.Shape((reps, s, n)))
    idx = g.param("idx", bz.Shape((1, s, s), bz.i64)) if static else \
        g.input("idx", bz.Shape((1, s, s), bz.i64))
    full = g.expand(idx, (reps, s, s))
    g.set_outputs([g.add_node(GatherElements(axis=2), [g.tanh(x), full])[0]])
    params = {"idx": table} if static else {}
    exe = bz.compile(g, params=params, fuse=False)
    for _ in range(2):
        feeds = {"x": rng.standard_normal((reps, s, n)).astype(np.float32)}
        if not static:
            feeds["idx"] = table
        np.testing.assert_array_equal(exe(feeds)[0], bz.interpret(g, feeds, params)[0])
    (impl,) = [r[3] for r in exe.dispatch_report().rows if r[1] == "gather_elements"]
    assert impl.startswith("C gather_elements")
    assert ("block reused 6 times" in impl) == static
    if static:
        bad = dict(params, idx=np.where(table == table[0, 0, 0], n, table))
        exe2 = bz.compile(g, params=bad, fuse=False)
        with pytest.raises(bz.InterpretError, match="gather_elements .* outside"):
            exe2(feeds)


@pytest.mark.parametrize("dtype", [bz.f32, bz.f64, bz.i32, bz.i64, bz.f16, bz.bf16])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("exclusive, reverse", [(False, False), (True, False), (False, True),
                                                (True, True)])
def test_cumsum_matches_the_interpreter_exactly(dtype, axis, exclusive, reverse):
    """Position ids from a mask (MPNet, M2M100, LUKE): a C loop summing in NumPy's order, so
    float results are bit-identical; integers wrap as NumPy's do; f16 / bf16 sum in float32
    and round once, as the reference does."""
    shape = (3, 17, 5)
    g = bz.Graph("cumsum")
    x = g.input("x", bz.Shape(shape, dtype))
    g.set_outputs([g.cumsum(g.add(x, x), axis, exclusive, reverse)])
    exe = bz.compile(g, fuse=False)
    rng = np.random.default_rng(3)
    for _ in range(2):
        scale = 1e3 if dtype.itemsize >= 4 else 8.0  # f16 sums stay finite
        xs = (rng.standard_normal(shape) * scale).astype(dtype.np) if dtype.is_float else \
            rng.integers(-(2 ** 30), 2 ** 30, shape).astype(dtype.np)  # int32 sums overflow
        feeds = {"x": xs}
        np.testing.assert_array_equal(exe(feeds)[0], bz.interpret(g, feeds)[0])
    rows = [r for r in exe.dispatch_report().rows if r[1] == "cumsum"]
    half = " in float32" if dtype in (bz.f16, bz.bf16) else ""
    assert rows[0][2:] == (Dispatch.NATIVE, "C cumsum" + half)


@pytest.mark.parametrize("static", [True, False])
def test_gather_elements_without_negative_indices_refuses_them(static):
    """negative_indices=False (torch.gather): a negative index is an error naming the node in
    the C kernel as in the interpreter, a static index checked once."""
    from braze.ir.ops.indexing import GatherElements

    table = np.array([[[0, 2, 1], [2, -1, 0]]], np.int64)
    g = bz.Graph("torch_gather")
    x = g.input("x", bz.Shape((1, 2, 3)))
    idx = g.param("idx", bz.Shape((1, 2, 3), bz.i64)) if static else \
        g.input("idx", bz.Shape((1, 2, 3), bz.i64))
    g.set_outputs([g.add_node(GatherElements(axis=2, negative_indices=False), [x, idx])[0]])
    params = {"idx": table} if static else {}
    feeds = {"x": np.ones((1, 2, 3), np.float32)} | ({} if static else {"idx": table})
    exe = bz.compile(g, params=params, fuse=False)
    assert exe.dispatch_report().rows[-1][3].startswith("C gather_elements")
    for run in (exe, lambda f: bz.interpret(g, f, params)):
        with pytest.raises(bz.InterpretError, match=r"node %\d+ \(gather_elements\)"):
            run(feeds)
