"""Element-wise kernels for the dtypes NumPy's own loops serve slowly or not exactly
(runtime/kernels/elementwise_c.py, float_tests.py) give the reference interpreter's bits on
fresh random inputs: float16 / bfloat16 add, sub, mul, div, max, min, pow, mod and fmod under
every broadcasting pattern, with subnormals, infinities, signed zeros and NaN (NaN payloads
may differ, the NaN positions may not); half-precision clamps at bounds that round, straddle
zero or are infinite; integer clamps of every integer dtype at fractional, infinite and huge
bounds (int64 rounding through float64 as the reference does); isnan / isinf. The dispatch
report names the kernel."""
import numpy as np
import pytest

import braze as bz
from braze.ir.ops.elementwise import Clamp
from braze.runtime.kernels import Dispatch, elementwise_c
from braze.runtime.kernels.elementwise_c import merged_strides

pytestmark = [
    pytest.mark.skipif(elementwise_c.lib() is None, reason="no C compiler on this machine"),
    # the inputs hold infinities and NaN on purpose: the reference's NumPy warns about them
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]

HALF = [bz.f16, bz.bf16]
INTS = [bz.i8, bz.i16, bz.i32, bz.i64, bz.u8, bz.u32]


def _half_values(shape, dtype, rng):
    """Magnitudes from subnormal to overflow, with NaN, infinities and signed zeros."""
    scale = rng.choice([1e-7, 1e-3, 1.0, 100.0, 7e4], shape)
    a = np.asarray(rng.standard_normal(shape) * scale, np.float32)
    pick = rng.random(shape)
    a[pick < 0.03] = np.nan
    a[(pick > 0.03) & (pick < 0.05)] = np.inf
    a[(pick > 0.05) & (pick < 0.07)] = -np.inf
    a[(pick > 0.07) & (pick < 0.1)] = 0.0
    a[(pick > 0.1) & (pick < 0.13)] = -0.0
    return a.astype(dtype.np)


def _assert_same(want, got):
    """Same dtype, shape and bits; for floats, NaN only where the reference has NaN (its
    payload aside)."""
    assert want.dtype == got.dtype and want.shape == got.shape
    want, got = np.atleast_1d(want), np.atleast_1d(got)
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
        return
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    bits = np.dtype(f"u{want.dtype.itemsize}")
    np.testing.assert_array_equal(np.where(nan, 0, got.view(bits)),
                                  np.where(nan, 0, want.view(bits)))


def _run(g, feeds, threads=None, fuse=True):
    exe = bz.compile(g, "cpu", threads=threads, fuse=fuse)
    for want, got in zip(bz.interpret(g, feeds), exe(feeds), strict=True):
        _assert_same(want, got)
    return exe


def _implementation(exe, kind, empty=False):
    """The kind's implementation, native; the reference for an empty tensor (has_empty)."""
    rows = [(d, impl) for _, k, d, impl in exe.dispatch_report().rows if k == kind]
    want = Dispatch.REFERENCE if empty else Dispatch.NATIVE
    assert rows and all(d == want for d, _ in rows), rows
    return rows[0][1]


SHAPES = [((37,), (37,)), ((5, 37), (37,)), ((5, 1), (1, 37)), ((2, 3, 9000), (3, 1)),
          ((1,), (9, 7)), ((4, 1, 6), (4, 5, 6)), ((), (3,)), ((3, 4, 5), (3, 1, 5)),
          ((0, 4), (4,))]


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("fn", ["add", "sub", "mul", "div", "max", "min", "pow", "mod", "fmod"])
@pytest.mark.parametrize("a_shape, b_shape", SHAPES)
def test_half_binary_matches_reference(dtype, fn, a_shape, b_shape):
    rng = np.random.default_rng(len(a_shape) * 7 + len(b_shape))
    for swap in (False, True):
        sa, sb = (b_shape, a_shape) if swap else (a_shape, b_shape)
        g = bz.Graph("half")
        a, b = g.input("a", bz.Shape(sa, dtype)), g.input("b", bz.Shape(sb, dtype))
        g.set_outputs([g.binary(a, b, fn)])
        exe = _run(g, {"a": _half_values(sa, dtype, rng), "b": _half_values(sb, dtype, rng)})
        empty = 0 in (*sa, *sb)
        assert empty or _implementation(exe, fn) == f"C {fn} ({dtype.name})"
        assert not empty or _implementation(exe, fn, empty).startswith("reference")


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_max_min_ties_and_nan_pick_the_reference_operand(dtype):
    """float16 keeps the first operand on ties, bfloat16 (ml_dtypes) the second: visible on
    signed zeros; a NaN operand wins."""
    a = np.array([-0.0, 0.0, np.nan, 1.0, np.nan, -np.nan], np.float32).astype(dtype.np)
    b = np.array([0.0, -0.0, 1.0, np.nan, np.nan, 2.0], np.float32).astype(dtype.np)
    for fn in ("max", "min"):
        g = bz.Graph("tie")
        x, y = g.input("a", bz.Shape((6,), dtype)), g.input("b", bz.Shape((6,), dtype))
        g.set_outputs([g.binary(x, y, fn)])
        _run(g, {"a": a, "b": b})


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("fn", ["neg", "abs"])
def test_half_sign_ops_match_reference_bit_for_bit(dtype, fn):
    """Sign-bit operations: NaN signs included, so compared as raw bits."""
    g = bz.Graph("sign")
    g.set_outputs([g.unary(g.input("x", bz.Shape((5, 301), dtype)), fn)])
    x = _half_values((5, 301), dtype, np.random.default_rng(6))
    exe = bz.compile(g, "cpu", fuse=False)
    np.testing.assert_array_equal(exe({"x": x})[0].view(np.uint16),
                                  bz.interpret(g, {"x": x})[0].view(np.uint16))
    assert _implementation(exe, fn) == f"C {fn} ({dtype.name})"


def test_half_argmin_as_imported_runs_native_kernels():
    """Importers write ArgMin as argmax(neg(x)): both steps get kernels in float16."""
    g = bz.Graph("argmin")
    g.set_outputs([g.argmax(g.neg(g.input("x", bz.Shape((6, 50), bz.f16))), 1)])
    x = _half_values((6, 50), bz.f16, np.random.default_rng(7))
    exe = _run(g, {"x": x}, fuse=False)
    assert _implementation(exe, "neg") == "C neg (f16)"
    assert _implementation(exe, "argmax") == "C argmax (f16)"


def test_half_chain_unfused_in_place_and_parallel():
    """A chain of half ops, each writing over a dead input, with 2^21+ elements split across
    threads; a scalar operand broadcasts (stride 0)."""
    g = bz.Graph("chain")
    x, y = g.input("x", bz.Shape((3, 1024, 700), bz.f16)), g.input("y", bz.Shape((700,), bz.f16))
    g.set_outputs([g.mul(g.sub(g.add(x, y), x), 0.5)])
    rng = np.random.default_rng(5)
    exe = _run(g, {"x": _half_values((3, 1024, 700), bz.f16, rng),
                   "y": _half_values((700,), bz.f16, rng)}, threads=2, fuse=False)
    assert {impl for _, k, _, impl in exe.dispatch_report().rows} >= {"C add (f16)",
                                                                      "C mul (f16)"}


def test_merged_strides_collapse_dims_walked_alike():
    assert merged_strides((4, 5, 6), (4, 5, 6), (6,)) == ([20, 6], [[6, 1], [0, 1]])
    assert merged_strides((4, 5, 6), (4, 5, 6), (4, 5, 6)) == ([120], [[1], [1]])
    assert merged_strides((3, 1, 5), (3, 1, 5), (1, 1, 5)) == ([3, 5], [[5, 1], [0, 1]])
    assert merged_strides((), (), ()) == ([1], [[0], [0]])


HALF_BOUNDS = [(-0.5, 0.5), (0.0, 0.0), (-0.0, 1e-9), (1e-9, 2.0), (-np.inf, 0.3),
               (0.1, np.inf), (-7e5, 7e5), (0.1, 0.1)]


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("lo, hi", HALF_BOUNDS)
def test_half_clamp_matches_reference(dtype, lo, hi):
    g = bz.Graph("clamp")
    g.set_outputs([g.clamp(g.input("x", bz.Shape((3, 1001), dtype)), lo, hi)])
    rng = np.random.default_rng(0)
    exe = _run(g, {"x": _half_values((3, 1001), dtype, rng)})
    assert _implementation(exe, "clamp") == f"C clamp ({dtype.name})"


INT_BOUNDS = [(-3.0, 4.0), (-2.5, 3.7), (2.5, 3.5), (-3.7, -2.2), (-np.inf, 5.9), (0.5, np.inf),
              (-1e30, 1e30), (-np.inf, np.inf), (-3, 4), (-1000, 1000)]


def _int_values(dtype, rng):
    info = np.iinfo(dtype.np)
    a = rng.integers(info.min, info.max, (3, 333), endpoint=True, dtype=dtype.np)
    a[0, :20] = np.arange(-10, 10).astype(dtype.np)
    a[1, :2] = [info.min, info.max]
    if dtype == bz.i64:  # beyond 2^53 the reference rounds through float64
        a[2, :3] = [2 ** 53 + 1, -2 ** 60 - 3, 2 ** 62 + 1]
    return a


@pytest.mark.parametrize("dtype", INTS, ids=str)
@pytest.mark.parametrize("lo, hi", INT_BOUNDS)
def test_int_clamp_matches_reference(dtype, lo, hi):
    g = bz.Graph("clamp")
    x = g.input("x", bz.Shape((3, 333), dtype))
    # Python-int bounds (an op built directly, not through the builder's float conversion)
    # keep np.clip in the integer type: the exact path
    y = g.add_node(Clamp(lo, hi), (x,))[0] if isinstance(lo, int) else g.clamp(x, lo, hi)
    g.set_outputs([y])
    exe = _run(g, {"x": _int_values(dtype, np.random.default_rng(1))}, fuse=False)
    if hi < 0 <= np.iinfo(dtype.np).min:
        return  # every unsigned element becomes hi < 0: see the out-of-range test below
    assert _implementation(exe, "clamp").startswith(f"C clamp ({dtype.name}")


def test_int_clamp_whose_selected_bound_is_out_of_range_runs_the_reference():
    """Every int8 lies below 1e3 (every uint8 above -2.2): the reference converts the bound
    to the integer type by Cast's out-of-range rule (float_to_int); no kernel computes that."""
    for dtype, lo, hi in ((bz.i8, 1e3, 2e3), (bz.u8, -3.7, -2.2)):
        g = bz.Graph("clamp")
        g.set_outputs([g.clamp(g.input("x", bz.Shape((4,), dtype)), lo, hi)])
        exe = bz.compile(g, "cpu", fuse=False)
        exe({"x": np.arange(4, dtype=dtype.np)})
        assert [d for _, k, d, _ in exe.dispatch_report().rows if k == "clamp"] == [
            Dispatch.REFERENCE]


def test_int_clamp_in_parallel():
    g = bz.Graph("clamp")
    g.set_outputs([g.clamp(g.input("x", bz.Shape((1 << 22,), bz.i32)), -5.5, 9.5)])
    x = np.random.default_rng(2).integers(-20, 20, 1 << 22, dtype=np.int32)
    _run(g, {"x": x}, threads=2, fuse=False)


@pytest.mark.parametrize("dtype", [bz.f32, bz.f16, bz.bf16, bz.f64], ids=str)
@pytest.mark.parametrize("pos, neg", [(True, True), (True, False), (False, True),
                                      (False, False)])
def test_isnan_isinf_match_reference(dtype, pos, neg):
    g = bz.Graph("tests")
    x = g.input("x", bz.Shape((4, 77), dtype))
    g.set_outputs([g.isnan(x), g.isinf(x, detect_positive=pos, detect_negative=neg)])
    exe = _run(g, {"x": _half_values((4, 77), dtype, np.random.default_rng(3))}, fuse=False)
    _implementation(exe, "isnan")
    _implementation(exe, "isinf")
