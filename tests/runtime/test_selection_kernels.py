"""argmax and top_k kernels (runtime/kernels/selection.py) give the reference interpreter's
bits on fresh random inputs: every numeric dtype, any axis (negative included), keepdims, ties
(first index first), NaN (argmax: the first NaN; top_k: above +inf, as torch), integer
extremes, k = 0 and k = n, empty rows, and rows long enough for
OpenMP; the dispatch report names the C kernel, never the reference."""
import numpy as np
import pytest

import braze as bz
from braze.ir.dtypes import dtype_from_numpy
from braze.runtime.kernels import Dispatch, selection

pytestmark = pytest.mark.skipif(selection.lib() is None, reason="no C compiler on this machine")

DTYPES = [bz.f32, bz.f64, bz.f16, bz.bf16, bz.i8, bz.i16, bz.i32, bz.i64, bz.u8, bz.u32]


def _values(shape, dtype, seed, nan=False):
    """Few distinct values (many ties); floats with signed zeros, infinities and, if asked,
    NaN; integers over their whole range, extremes included."""
    rng = np.random.default_rng(seed)
    if dtype == bz.bool_:
        return rng.random(shape) < 0.3
    if dtype.is_float:
        a = rng.integers(-4, 5, shape).astype(np.float32)
        pick = rng.random(shape)
        a[pick < 0.05] = -0.0
        a[(pick > 0.05) & (pick < 0.08)] = np.inf
        a[(pick > 0.08) & (pick < 0.1)] = -np.inf
        if nan:
            a[pick > 0.95] = np.nan
        return a.astype(dtype.np)
    info = np.iinfo(dtype.np)
    a = rng.integers(info.min, info.max, shape, endpoint=True, dtype=dtype.np)
    flat = a.reshape(-1)
    flat[: flat.size // 4] = rng.choice([info.min, info.max, 0, 1], flat.size // 4)
    return rng.permuted(flat).reshape(shape)


def _assert_same_bits(want, got):
    assert want.dtype == got.dtype and want.shape == got.shape
    np.testing.assert_array_equal(np.atleast_1d(got).view(np.uint8),
                                  np.atleast_1d(want).view(np.uint8))


def _check(build, x, threads=None):
    """Compile `build(g, x)` for x's type, run it against the interpreter; the executable."""
    g = bz.Graph("sel")
    xv = g.input("x", bz.Shape(x.shape, dtype_from_numpy(x.dtype)))
    out = build(g, xv)
    g.set_outputs(list(out) if isinstance(out, tuple) else [out])
    exe = bz.compile(g, "cpu", threads=threads)
    for want, got in zip(bz.interpret(g, {"x": x}), exe({"x": x}), strict=True):
        _assert_same_bits(want, got)
    return exe


def _kernel(exe, kind, empty=False):
    """The kind's implementation, native; the reference for an empty tensor (has_empty)."""
    rows = [(d, impl) for _, k, d, impl in exe.dispatch_report().rows if k == kind]
    want = Dispatch.REFERENCE if empty else Dispatch.NATIVE
    assert rows and all(d == want for d, _ in rows), rows
    return rows[0][1]


ARGMAX_CASES = [((7, 37), 1), ((7, 37), 0), ((3, 5, 300), 1), ((2, 100, 3), -2),
                ((1000,), 0), ((5,), -1), ((4, 33), -1), ((2, 3, 129), -1), ((0, 5), 1)]


@pytest.mark.parametrize("dtype", [*DTYPES, bz.bool_], ids=str)
@pytest.mark.parametrize("shape, axis", ARGMAX_CASES)
def test_argmax_matches_reference(dtype, shape, axis):
    for seed in (0, 1):
        for keep in (False, True):
            x = _values(shape, dtype, seed, nan=dtype.is_float and seed == 1)
            exe = _check(lambda g, v, keep=keep: g.argmax(v, axis, keepdims=keep), x)
            assert "argmax" in _kernel(exe, "argmax", 0 in shape)


@pytest.mark.parametrize("dtype", [bz.f32, bz.f64, bz.f16, bz.bf16], ids=str)
def test_argmax_nan_rules(dtype):
    """The first NaN wins wherever it is; -0 and +0 tie (the first); -inf alone still counts."""
    x = np.array([[1, np.nan, 3, np.nan], [-0.0, 0.0, -1, -2], [-np.inf] * 4,
                  [np.nan, 5, 6, 7], [1, 2, 3, np.inf]], np.float32).astype(dtype.np)
    for axis in (0, 1):
        _check(lambda g, v, axis=axis: g.argmax(v, axis), x)
    long = np.zeros((2, 700), dtype.np)
    long[0, 650], long[1, 3], long[1, 699] = np.nan, 1, np.nan
    _check(lambda g, v: g.argmax(v, -1), long)


def test_argmax_kernels_by_layout():
    """Long float32 rows take NumPy's argmax into the buffer, other layouts the C kernel."""
    x = _values((8, 300), bz.f32, 0)
    assert "NumPy" in _kernel(_check(lambda g, v: g.argmax(v, 1), x), "argmax")
    assert "C argmax" in _kernel(_check(lambda g, v: g.argmax(v, 0), x), "argmax")
    x16 = _values((8, 300), bz.f16, 0)
    assert "C argmax" in _kernel(_check(lambda g, v: g.argmax(v, 1), x16), "argmax")


def test_argmax_in_parallel():
    """Past BRAZE_PAR_MIN elements the rows (or column blocks) split across threads."""
    rng = np.random.default_rng(3)
    x = rng.integers(-50, 50, (300, 2, 4000)).astype(np.float32)
    _check(lambda g, v: g.argmax(v, 0), x, threads=2)
    _check(lambda g, v: g.argmax(v, -1), x.astype(np.float16), threads=2)


def _top_k_ks(n):
    return sorted({0, 1, 3, n // 2, n - 1, n} - {-1})


TOP_K_CASES = [((7, 37), 1), ((7, 37), 0), ((3, 5, 30), 1), ((2, 300, 3), -2), ((1000,), 0),
               ((5,), 0), ((3, 257), -1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, axis", TOP_K_CASES)
def test_top_k_matches_reference(dtype, shape, axis):
    n = shape[axis]
    x = _values(shape, dtype, n, nan=dtype.is_float)
    for k in _top_k_ks(n):
        for largest in (True, False):
            exe = _check(lambda g, v, k=k, big=largest: g.top_k(v, k, axis, big), x)
            empty = 0 in shape or k == 0  # an empty tensor runs the reference
            assert ("reference" if empty else "C top_k") in _kernel(exe, "top_k", empty)


@pytest.mark.parametrize("k, how", [(4, "heap"), (200, "radix sort")])
def test_top_k_heap_and_radix_sort_paths(k, how):
    """Small k against the row keeps a heap of the best k; large k radix-sorts the row."""
    x = _values((9, 1000), bz.f32, 4, nan=True)
    for largest in (True, False):
        exe = _check(lambda g, v, big=largest: g.top_k(v, k, -1, big), x)
        assert how in _kernel(exe, "top_k")


def test_top_k_integer_extremes_follow_the_reference():
    """No wrap at the extremes: the largest two of int8 [-128, 5, 127] are 127 and 5, as in
    torch.topk; int64's and uint32's whole ranges order as values."""
    x8 = np.array([[-128, 5, 127, -128, 0]], np.int8)
    exe = _check(lambda g, v: g.top_k(v, 2), x8)
    assert exe({"x": x8})[0].tolist() == [[127, 5]]
    _check(lambda g, v: g.top_k(v, 5, largest=False), x8)
    x64 = np.array([[np.iinfo(np.int64).min, 3, np.iinfo(np.int64).max]], np.int64)
    _check(lambda g, v: g.top_k(v, 3), x64)
    u = np.array([[0, 2 ** 32 - 1, 7, 2 ** 32 - 1]], np.uint32)
    _check(lambda g, v: g.top_k(v, 4), u)
    _check(lambda g, v: g.top_k(v, 4, largest=False), u)


def test_top_k_empty_rows_and_parallel():
    _check(lambda g, v: g.top_k(v, 2, 1), np.zeros((0, 5), np.float32))
    x = _values((2100, 1000), bz.f32, 5, nan=True)
    _check(lambda g, v: g.top_k(v, 5, -1), x, threads=2)
    _check(lambda g, v: g.top_k(v, 300, -1, largest=False), x, threads=2)


@pytest.mark.parametrize("k, n", [(3, 1000), (200, 1000), (6, 6)])
@pytest.mark.parametrize("dtype", [bz.f32, bz.f16, bz.bf16, bz.f64], ids=str)
def test_top_k_nan_ranks_as_torch(k, n, dtype):
    """Both paths (heap, radix sort) rank NaN above +inf as torch.topk does: first when
    largest, last when smallest, ties by index."""
    torch = pytest.importorskip("torch")
    x = _values((4, n), dtype, 7, nan=True)
    x[:, :2] = np.nan
    for largest in (True, False):
        exe = _check(lambda g, v, big=largest: g.top_k(v, k, -1, big), x)
        vals, idx = exe({"x": x})
        t = torch.from_numpy(x.astype(np.float32)).topk(k, -1, largest=largest, sorted=True)
        np.testing.assert_array_equal(vals.astype(np.float32), t.values.numpy())
        got_nan = np.isnan(vals.astype(np.float32))
        np.testing.assert_array_equal(got_nan, np.isnan(t.values.numpy()))
