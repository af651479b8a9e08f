"""trilu and dynamic_narrow kernels (runtime/kernels/indexing.py) give the reference
interpreter's bits on fresh random inputs: triu / tril at every diagonal offset (past both
corners included), batched, wide and tall, empty, every dtype width, in parallel; a dynamic
narrow at each binding of its symbols, the out-of-range binding still raising the reference's
error. The dispatch report names the kernel, never the reference."""
import numpy as np
import pytest

import braze as bz
from braze.errors import BrazeError
from braze.ir.dtypes import dtype_from_numpy
from braze.ir.ops.indexing import DynamicNarrow
from braze.runtime.kernels import Dispatch, indexing

pytestmark = pytest.mark.skipif(indexing.lib() is None, reason="no C compiler on this machine")


def _assert_same_bits(want, got):
    assert want.dtype == got.dtype and want.shape == got.shape
    np.testing.assert_array_equal(np.atleast_1d(got).view(np.uint8),
                                  np.atleast_1d(want).view(np.uint8))


def _implementation(exe, kind, empty=False):
    """The kind's implementation, native; the reference for an empty tensor (has_empty)."""
    rows = [(d, impl) for _, k, d, impl in exe.dispatch_report().rows if k == kind]
    want = Dispatch.REFERENCE if empty else Dispatch.NATIVE
    assert rows and all(d == want for d, _ in rows), rows
    return rows[0][1]


def _trilu_graph(shape, dtype, upper, k):
    g = bz.Graph("trilu")
    x = g.input("x", bz.Shape(shape, dtype))
    g.set_outputs([g.trilu(x, upper, k)])
    return g


@pytest.mark.parametrize("dtype", [bz.f32, bz.f64, bz.bf16, bz.i8, bz.i64, bz.bool_], ids=str)
@pytest.mark.parametrize("shape", [(5, 7), (7, 5), (2, 3, 4, 6), (1, 1), (0, 3), (3, 0), (9,) * 2])
@pytest.mark.parametrize("upper", [True, False], ids=["triu", "tril"])
def test_trilu_matches_reference(dtype, shape, upper):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 10).astype(dtype.np)
    if dtype.is_float:
        x[x < -8] = -0.0  # signed zeros stay where kept; zeroed entries are +0 as np.triu's
    for k in (-9, -3, -1, 0, 1, 2, 5, 10):
        g = _trilu_graph(shape, dtype, upper, k)
        exe = bz.compile(g, "cpu")
        _assert_same_bits(bz.interpret(g, {"x": x})[0], exe({"x": x})[0])
        want = "reference trilu" if 0 in shape else f"C {'triu' if upper else 'tril'}"
        assert _implementation(exe, "trilu", 0 in shape) == want


def test_trilu_in_place_and_in_parallel():
    """After an elementwise producer the output may share its input's buffer; a batch past
    BRAZE_PAR_MIN elements splits rows across threads."""
    g = bz.Graph("trilu_chain")
    x = g.input("x", bz.Shape((40, 240, 250)))
    g.set_outputs([g.trilu(g.mul(x, 2.0), False, -3)])
    exe = bz.compile(g, "cpu", threads=2, fuse=False)
    for seed in (0, 1):
        feeds = bz.random_feeds(g, seed)
        _assert_same_bits(bz.interpret(g, feeds)[0], exe(feeds)[0])
    assert _implementation(exe, "trilu") == "C tril"


@pytest.mark.parametrize("axis, start, length", [(1, "s-2", 2), (1, 0, "s"), (1, "s-1", 1),
                                                 (-2, "s-3", 3), (2, 1, 2), (0, 1, 1)])
def test_dynamic_narrow_matches_reference_per_binding(axis, start, length):
    g = bz.Graph("dyn")
    x = g.input("x", bz.Shape((3, "s", 5)))
    g.set_outputs([g.add_node(DynamicNarrow(axis, start, length), (x,))[0]])
    exe = bz.compile(g, "cpu")
    rng = np.random.default_rng(0)
    for s in (3, 8, 4):
        a = rng.standard_normal((3, s, 5)).astype(np.float32)
        _assert_same_bits(bz.interpret(g, {"x": a})[0], exe({"x": a})[0])
        assert _implementation(exe, "dynamic_narrow").startswith("dynamic_narrow copy")


def test_dynamic_narrow_of_a_view_and_other_dtypes():
    g = bz.Graph("dyn_view")
    x = g.input("x", bz.Shape(("s", 6), bz.i64))
    y = g.add_node(DynamicNarrow(0, "s-2", 2), (g.narrow(x, 1, 1, 4),))[0]
    g.set_outputs([y])
    exe = bz.compile(g, "cpu")
    a = np.arange(42, dtype=np.int64).reshape(7, 6)
    _assert_same_bits(bz.interpret(g, {"x": a})[0], exe({"x": a})[0])
    assert dtype_from_numpy(exe({"x": a})[0].dtype) == bz.i64


def test_dynamic_narrow_out_of_range_binding_raises_as_the_reference():
    g = bz.Graph("dyn_bad")
    x = g.input("x", bz.Shape((3, "s", 4)))
    g.set_outputs([g.add_node(DynamicNarrow(1, "s-4", 4), (x,))[0]])
    exe = bz.compile(g, "cpu")
    with pytest.raises(BrazeError, match="dynamic_narrow"):
        exe({"x": np.zeros((3, 2, 4), np.float32)})
    a = np.ones((3, 6, 4), np.float32)  # a good binding afterwards still runs the kernel
    _assert_same_bits(bz.interpret(g, {"x": a})[0], exe({"x": a})[0])
    assert _implementation(exe, "dynamic_narrow") == "dynamic_narrow copy [2, 6)"
