"""Generated ElementwiseRegion kernels: the vector math approximations (max error in ulps over
the whole float32 range, +-0 / +-inf / NaN / denormals included, against float64 NumPy /
SciPy), the loop nest (dims merged, chunks across threads, broadcasting, streaming stores on
aligned and misaligned outputs) against the reference interpreter, and the build (IEEE
semantics kept, no process-wide flush-to-zero, cache keyed by the machine)."""
import ctypes

import numpy as np
import pytest

import braze as bz
from braze.ir.dtypes import dtype_from_numpy
from braze.runtime.codegen import cc
from braze.runtime.codegen.elementwise import (
    STREAM_TILE,
    Unsupported,
    broadcast_strides,
    coalesce,
    region_source,
)
from braze.runtime.codegen.vecmath import CALLS, VECMATH_C
from braze.runtime.kernels import Dispatch

pytestmark = pytest.mark.skipif(not cc.available(), reason="no C compiler on this machine")
special = pytest.importorskip("scipy.special")


@pytest.fixture(scope="module")
def vec_lib():
    loops = "".join(f"""
void apply_{name}(const float* x, float* y, long n) {{
  #pragma omp simd
  for (long i = 0; i < n; i++) y[i] = {fn}(x[i]);
}}""" for name, fn in CALLS.items())
    return cc.compile_c("#include <math.h>\n" + VECMATH_C + loops, "vecmath_test",
                        cc.PRECISE_FLAGS)


def _apply(lib, name: str, x: np.ndarray) -> np.ndarray:
    y = np.empty_like(x)
    getattr(lib, "apply_" + name)(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(y.ctypes.data),
                                  ctypes.c_long(x.size))
    return y


def _all_floats(stride: int = 4099) -> np.ndarray:
    """Every `stride`-th float32 bit pattern (all signs, exponents, denormals and NaNs) plus
    the edges: +-0, +-inf, NaN, the smallest denormal, and each approximation's branch points
    and over/underflow thresholds."""
    bits = np.arange(0, 1 << 32, stride, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0.0, np.inf, np.nan, 1e-45, 1.1754944e-38, 1e-30, 88.72283, 88.72284,
                      -87.33654, -103.97208, -104.0, 0.625, 0.921875, 0.45 * 2 ** 0.5, 12.0,
                      17.5, 100.0, 9.0, 10.0, 4.5, 131.0, 1.0, 0.5], np.float32)
    near = np.concatenate([np.nextafter(edges, np.float32(np.inf)),
                           np.nextafter(edges, np.float32(-np.inf))])
    x = np.concatenate([bits.view(np.float32), edges, -edges, near, -near])
    dense = np.linspace(-20, 20, 200_001, dtype=np.float32)  # where the branches meet
    return np.concatenate([x, dense])


def _ulp_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of the float32 spacing at want (2^-149 in the denormals); 0 where
    both are NaN or both the same infinity (want rounded to float32 first)."""
    with np.errstate(all="ignore"):
        w32 = want.astype(np.float32)
        want = np.where(np.isinf(w32), w32.astype(np.float64), want)
        ulp = np.maximum(np.spacing(np.abs(w32)).astype(np.float64), 2.0 ** -149)
        err = np.abs(got.astype(np.float64) - want) / ulp
    same = (np.isnan(got) & np.isnan(want)) | (np.isinf(want) & (got == want))
    err[same] = 0.0
    err[np.isnan(err)] = np.inf
    return err


def _reference(name: str, d: np.ndarray) -> np.ndarray:
    f32 = lambda v: np.float64(np.float32(v))  # noqa: E731 - the constants the C code uses
    with np.errstate(all="ignore"):
        return {
            "exp": lambda: np.exp(d),
            "tanh": lambda: np.tanh(d),
            "erf": lambda: special.erf(d),
            "sigmoid": lambda: special.expit(d),
            "silu": lambda: d * special.expit(d),
            "gelu": lambda: d * special.ndtr(d),
            "quick_gelu": lambda: d * special.expit(f32(1.702) * d),
            "gelu_approx": lambda: d * special.expit(
                f32(1.59576912) * (d + f32(0.044715) * d ** 3)),
        }[name]()


# Max error in float32 ulps (documented in codegen/vecmath.py).
ULP_BOUNDS = {"exp": 1.5, "tanh": 1.5, "erf": 2.5, "sigmoid": 3.0, "silu": 3.0, "gelu": 6.0,
              "quick_gelu": 4.0, "gelu_approx": 4.0}


@pytest.mark.parametrize("name", sorted(ULP_BOUNDS))
def test_approximation_max_error_over_all_floats(vec_lib, name):
    x = _all_floats()
    with np.errstate(invalid="ignore"):
        d = x.astype(np.float64)
    got = _apply(vec_lib, name, x)
    want = _reference(name, d)
    err = _ulp_error(got, want)
    if name == "gelu_approx":
        # the float rounding of the cubic's argument 2u: relative error |2u| 2^-22 on top
        with np.errstate(all="ignore"):
            u2 = np.abs(1.59576912 * (d + 0.044715 * d ** 3))
            tol = np.abs(want) * np.minimum(u2, 1e30) * 2.0 ** -22
            err = np.where(np.abs(got - want) <= tol, 0.0, err)
    worst = int(np.argmax(err))
    assert err[worst] <= ULP_BOUNDS[name], (
        f"{name}({x[worst]!r}) = {got[worst]!r}, want {want[worst]!r}: {err[worst]:.2f} ulp")


@pytest.mark.parametrize("name", sorted(ULP_BOUNDS))
def test_approximation_special_values(vec_lib, name):
    x = np.array([np.nan, -np.nan, 0.0, -0.0, 1e-45, -1e-45], np.float32)
    got = _apply(vec_lib, name, x)
    assert np.isnan(got[:2]).all()
    if name in ("exp", "sigmoid"):
        assert got[2] == got[3] == (1.0 if name == "exp" else 0.5)
    else:  # odd or x-times functions keep the sign of zero
        assert got[2] == 0 and not np.signbit(got[2]) and np.signbit(got[3])
    limits = {"exp": (np.inf, 0.0), "tanh": (1.0, -1.0), "erf": (1.0, -1.0),
              "sigmoid": (1.0, 0.0), "gelu": (np.inf, np.nan), "silu": (np.inf, np.nan),
              "quick_gelu": (np.inf, np.nan), "gelu_approx": (np.inf, np.nan)}
    got_inf = _apply(vec_lib, name, np.array([np.inf, -np.inf], np.float32))
    # x-times forms give -inf * 0 = NaN at -inf, as the reference interpreter's formulas do
    np.testing.assert_array_equal(got_inf, np.array(limits[name], np.float32))


def _region_graph(shapes, build):
    body = bz.Graph("body")
    ins = [body.input(f"in{i}", bz.Shape(s)) for i, s in enumerate(shapes)]
    outs = build(body, *ins)
    body.set_outputs(list(outs) if isinstance(outs, tuple) else [outs])
    g = bz.Graph("r")
    gins = [g.input(f"x{i}", bz.Shape(s)) for i, s in enumerate(shapes)]
    outs = g.elementwise_region(body, gins)
    g.set_outputs(list(outs) if isinstance(outs, (tuple, list)) else [outs])
    return g


def _check_compiled(g, feeds, rtol=3e-6, atol=1e-7):
    exe = bz.compile(g, target="cpu")
    got = exe(feeds)
    rows = {kind: (d, impl) for _, kind, d, impl in exe.dispatch_report().rows}
    assert rows["elementwise_region"][0] == Dispatch.GENERATED
    want = bz.interpret(g, feeds)
    for a, w in zip(got, want, strict=True):
        np.testing.assert_allclose(a, w, rtol=rtol, atol=atol)
    return rows["elementwise_region"][1]


@pytest.mark.parametrize("shapes", [
    [(3, 1, 7), (1, 5, 1)],           # both broadcast: no dims merge
    [(2, 3, 4, 5), (4, 1)],           # a middle dim broadcast
    [(1,), (6, 1, 9)],                # a one-element input
    [(1000, 33), (33,)],              # bias over rows, odd width
])
def test_broadcasting_regions_match_the_interpreter(shapes):
    g = _region_graph(shapes, lambda b, x, y: (b.tanh(b.mul(b.gelu(b.add(x, y)), 0.7)),
                                               b.sigmoid(b.sub(x, y))))
    rng = np.random.default_rng(1)
    feeds = {f"x{i}": rng.standard_normal(s).astype(np.float32) * 3
             for i, s in enumerate(shapes)}
    _check_compiled(g, feeds)


@pytest.mark.parametrize("stream_mb", [None, "1"])
def test_large_flat_region_splits_across_threads(monkeypatch, stream_mb):
    """A 1-D tensor above the parallel threshold (chunks handed to the threads, the last one
    short), with plain stores (the default) and streaming ones ($BRAZE_STREAM_MIN_MB)."""
    if stream_mb is None:
        monkeypatch.delenv("BRAZE_STREAM_MIN_MB", raising=False)
    else:
        monkeypatch.setenv("BRAZE_STREAM_MIN_MB", stream_mb)
    n = cc.PARALLEL_MIN_ELEMENTS + 37
    g = _region_graph([(n,), (n,)], lambda b, x, y: b.mul(b.silu(x), y))
    rng = np.random.default_rng(2)
    feeds = {"x0": rng.standard_normal(n, dtype=np.float32),
             "x1": rng.standard_normal(n, dtype=np.float32)}
    impl = _check_compiled(g, feeds)
    assert ("streaming" in impl) == (stream_mb is not None)


def test_streaming_stores_on_misaligned_outputs():
    """bz_stream's unaligned head and short tail: outputs one element off alignment, sizes
    that end mid-vector and mid-tile, rows that end inside a tile."""
    shapes = [(5, STREAM_TILE + 3), (STREAM_TILE + 3,)]
    g = _region_graph(shapes, lambda b, x, y: (b.exp(b.neg(b.square(x))), b.add(x, y)))
    op = next(n.op for n in g.nodes if n.op.kind == "elementwise_region")
    src = region_source(op, [bz.Shape(s) for s in shapes], bz.Shape(shapes[0]), "f", True)
    fn = cc.compile_c(src, "stream_test", cc.PRECISE_FLAGS).f
    fn.argtypes = [ctypes.c_void_p]
    rng = np.random.default_rng(3)
    x, y = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    buf = np.zeros(2 * x.size + 2, np.float32)
    out0 = buf[1:1 + x.size].reshape(x.shape)
    out1 = buf[2 + x.size:].reshape(x.shape)
    fn((ctypes.c_void_p * 4)(*(a.ctypes.data for a in (x, y, out0, out1))))
    want = np.exp(-np.square(x.astype(np.float64)))
    # x^2's float rounding (if the compiler does not fuse it into the exp) and 2 ulp
    tol = want * (np.square(x) * 2.0 ** -24 + 2.0 ** -22)
    assert (np.abs(out0 - want) <= tol).all()
    np.testing.assert_array_equal(out1, x + y)
    assert buf[0] == 0 and buf[1 + x.size] == 0  # nothing written outside the outputs


def test_nan_and_inf_keep_their_ieee_meaning():
    """isnan / isinf / max see NaN and inf (the kernels are built without -ffinite-math-only,
    which folds x != x to false)."""
    g = _region_graph([(64,)], lambda b, x: (b.where(b.isnan(x), 1.0, 0.0),
                                             b.where(b.isinf(x), 1.0, 0.0),
                                             b.maximum(x, 0.0), b.exp(x)))
    x = np.linspace(-3, 3, 64).astype(np.float32)
    x[[3, 10]] = np.nan
    x[[5, 20]] = [np.inf, -np.inf]
    feeds = {"x0": x}
    exe = bz.compile(g, target="cpu")
    got = exe(feeds)
    want = bz.interpret(g, feeds)
    for a, w in zip(got, want, strict=True):
        np.testing.assert_allclose(a, w, rtol=3e-7, equal_nan=True)
    assert got[0][3] == 1 and got[1][5] == 1 and np.isnan(got[2][10])


def test_loading_kernels_leaves_denormals_alone():
    """GCC < 13 links crtfastmath.o into -ffast-math shared objects, whose constructor sets
    flush-to-zero for the whole process; braze links without it."""
    from braze.runtime.kernels import native

    native.lib()
    tiny = np.array([1e-40], np.float32)
    assert (tiny * np.float32(1.0))[0] != 0
    assert (tiny / np.float32(2.0))[0] != 0


def test_dims_merge_where_every_input_walks_them_as_one():
    out = (4, 5, 6)
    strides = [broadcast_strides(s, out) for s in [(4, 5, 6), (6,), (4, 1, 6)]]
    dims, merged = coalesce(out, strides)
    assert dims == (4, 5, 6)  # (4, 1, 6) breaks both merges
    dims, merged = coalesce(out, [broadcast_strides(s, out) for s in [(4, 5, 6), (6,)]])
    assert dims == (20, 6) and merged == [[6, 1], [0, 1]]
    dims, merged = coalesce((3, 1, 7), [broadcast_strides((3, 1, 7), (3, 1, 7))])
    assert dims == (21,) and merged == [[1]]


def test_what_the_generator_declines():
    """Integer powers have no C form here: the region falls back to its reference."""
    body = bz.Graph("body")
    shape = bz.Shape((4,), bz.i32)
    x = body.input("in0", shape)
    body.set_outputs([body.pow(x, body.add(x, 1))])
    g = bz.Graph("r")
    g.set_outputs([g.elementwise_region(body, [g.input("x", shape)])])
    op = next(n.op for n in g.nodes if n.op.kind == "elementwise_region")
    with pytest.raises(Unsupported, match="pow"):
        region_source(op, [shape], shape, "f")
    exe = bz.compile(g, target="cpu")
    feeds = {"x": np.array([2, 0, 3, 1], np.int32)}
    np.testing.assert_array_equal(exe(feeds)[0], bz.interpret(g, feeds)[0])
    kinds = {kind: d for _, kind, d, _ in exe.dispatch_report().rows}
    assert kinds["elementwise_region"] != Dispatch.GENERATED


@pytest.mark.parametrize("table_dims", [(3, 1, 6), (1, 3, 1, 6), (2, 3, 4, 6)])
def test_constant_tables_in_the_body_are_read_from_arrays(table_dims):
    """A body constant of many values (Swin's shifted-window mask folded into the region)
    is passed as an array with its own broadcast, not a reason to fall back."""
    rng = np.random.default_rng(5)
    table = rng.standard_normal(table_dims).astype(np.float32)
    flags = rng.random((3, 1, 6)) > 0.5
    shape = (2, 3, 4, 6)

    def build(b, x):
        masked = b.where(b.constant(flags), b.add(x, b.constant(table)), x)
        return b.mul(b.add(masked, b.constant(table)), 0.5)

    g = _region_graph([shape], build)
    feeds = {"x0": rng.standard_normal(shape).astype(np.float32)}
    impl = _check_compiled(g, feeds)
    assert impl.startswith("generated C region")


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8, np.uint8, np.float32])
def test_division_and_remainders_follow_numpy(dtype):
    """div (floor on integers), mod (the divisor's sign) and fmod (the dividend's) on every
    sign combination, a zero divisor (integers: 0; floats: inf / NaN) and, for signed
    integers, the smallest value divided by -1 (wraps, as NumPy does)."""
    info = np.iinfo(dtype) if dtype != np.float32 else None
    vals = [7, -7, 3, -3, 0, 1, -1, 5, 100, -100]
    if info is not None and info.min < 0:
        vals += [int(info.min), int(info.max)]
    if info is not None and info.min == 0:
        vals = [abs(v) % (int(info.max) + 1) for v in vals] + [int(info.max)]
    a = np.array([x for x in vals for _ in vals], dtype)
    b = np.array([y for _ in vals for y in vals], dtype)
    if dtype == np.float32:
        a, b = a * np.float32(0.75), b * np.float32(1.5)
    shape = bz.Shape((len(a),), dtype_from_numpy(np.dtype(dtype)))
    body = bz.Graph("body")
    x, y = body.input("in0", shape), body.input("in1", shape)
    body.set_outputs([body.div(x, y), body.mod(x, y), body.fmod(x, y)])
    g = bz.Graph("r")
    g.set_outputs(list(g.elementwise_region(body, [g.input("x0", shape),
                                                    g.input("x1", shape)])))
    with np.errstate(all="ignore"):
        exe = bz.compile(g, target="cpu")
        (got, want) = exe({"x0": a, "x1": b}), bz.interpret(g, {"x0": a, "x1": b})
    rows = {kind: d for _, kind, d, _ in exe.dispatch_report().rows}
    assert rows["elementwise_region"] == Dispatch.GENERATED
    for o, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(o, w)
        if dtype == np.float32:
            np.testing.assert_array_equal(np.signbit(o), np.signbit(w))


def test_cache_key_includes_the_machine(monkeypatch, tmp_path):
    """-march=native code must not be reused on another CPU through a shared cache."""
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path))
    src = "int braze_cache_probe(void) { return 7; }\n"
    cc.compile_c(src, "probe", cc.PRECISE_FLAGS)
    monkeypatch.setattr(cc, "machine_tag", lambda: "another-cpu")
    assert cc.compile_c(src, "probe", cc.PRECISE_FLAGS).braze_cache_probe() == 7
    assert len(list(tmp_path.glob("probe_*.so"))) == 2


def test_libm_functions_and_the_rest_of_the_unary_table():
    """log / sin / cos / pow (libmvec calls where glibc has them), and the plain C ones."""
    def build(b, x, y):
        pos = b.add(b.abs(x), 0.5)
        return (b.add(b.log(pos), b.mul(b.sin(x), b.cos(y))), b.pow(pos, y),
                b.add(b.rsqrt(pos), b.round(b.mul(x, 3.0))), b.sign(b.floor(x)),
                b.hard_swish(b.mul(x, 4.0)), b.erf(b.add(x, y)), b.sigmoid(b.sub(x, y)))
    g = _region_graph([(37, 29), (29,)], build)
    rng = np.random.default_rng(4)
    feeds = {"x0": rng.standard_normal((37, 29)).astype(np.float32) * 2,
             "x1": rng.standard_normal(29).astype(np.float32)}
    _check_compiled(g, feeds, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32, np.int64])
def test_integer_clamp_against_float_bounds_follows_numpy(dtype):
    """np.clip of an integer array against float bounds compares in float64 and truncates the
    bound it picks; infinite or huge bounds never apply. Types of up to 32 bits run in the
    generated region; 64-bit ones run the reference (float64 rounds their values)."""
    info = np.iinfo(dtype)
    x = np.linspace(info.min, info.max, 301).astype(dtype)
    g = bz.Graph("clamps")
    xv = g.input("x", bz.Shape((x.size,), dtype_from_numpy(np.dtype(dtype))))
    bounds = [(0.0, float("inf")), (-1e30, 1e30), (0.5, 10.5), (-3.7, 100.2),
              (-float("inf"), -2.5), (float(info.min) - 0.5, float(info.max) + 0.5)]
    g.set_outputs([g.add(g.clamp(xv, lo, hi), xv) for lo, hi in bounds])
    exe = bz.compile(g)
    for got, want in zip(exe({"x": x}), bz.interpret(g, {"x": x}), strict=True):
        np.testing.assert_array_equal(got, want)
    kinds = [d for _, kind, d, _ in exe.dispatch_report().rows if kind == "elementwise_region"]
    if np.dtype(dtype).itemsize == 8:
        assert set(kinds) == {Dispatch.REFERENCE}
    else:  # a bound the type cannot hold (-2.5 for uint8) leaves that region to the reference
        assert kinds.count(Dispatch.GENERATED) >= len(bounds) - 1


def test_a_symbolic_region_compiles_once_and_serves_every_binding(monkeypatch):
    """A region whose shape holds symbols reads its lengths and strides at run time: each new
    binding reuses the compiled kernel (no new source), broadcasts included, and matches the
    interpreter; a static region still bakes them in."""
    g = bz.Graph("dyn")
    x = g.input("x", bz.Shape(("batch", "seq", 24)))
    bias = g.input("bias", bz.Shape((24,)))
    gate = g.input("gate", bz.Shape(("batch", 1, 24)))
    y = g.mul(g.gelu(g.add(x, bias)), g.sigmoid(gate))
    g.set_outputs([g.add(y, g.tanh(x))])
    sources = []
    real = cc.compile_c
    monkeypatch.setattr(cc, "compile_c", lambda src, *a, **k: sources.append(src) or
                        real(src, *a, **k))
    exe = bz.compile(g)
    rng = np.random.default_rng(0)
    for b, s in ((2, 7), (3, 40), (2, 1000), (5, 3)):
        feeds = {"x": rng.standard_normal((b, s, 24), dtype=np.float32),
                 "bias": rng.standard_normal(24, dtype=np.float32),
                 "gate": rng.standard_normal((b, 1, 24), dtype=np.float32)}
        np.testing.assert_allclose(exe(feeds)[0], bz.interpret(g, feeds)[0], rtol=2e-6,
                                   atol=2e-6)
        (row,) = [r for r in exe.dispatch_report().rows if r[1] == "elementwise_region"]
        assert row[2] == Dispatch.GENERATED
    regions = [src for src in sources if "void region_" in src]
    assert len(set(regions)) == 1 and "G[" in regions[0]
    static = bz.compile(g.bind(batch=2, seq=7))
    feeds = {"x": rng.standard_normal((2, 7, 24), dtype=np.float32),
             "bias": rng.standard_normal(24, dtype=np.float32),
             "gate": rng.standard_normal((2, 1, 24), dtype=np.float32)}
    np.testing.assert_allclose(static(feeds)[0], exe(feeds)[0], rtol=1e-6, atol=1e-6)
    assert "G[" not in [src for src in sources if "void region_" in src][-1]


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8, np.int16])
def test_signed_integer_overflow_wraps_as_numpy(dtype):
    """x * -1 and x + max overflow at the type's ends; NumPy wraps, and a C kernel built
    without -fwrapv may assume no overflow: -x > 1 folded to x < -1 read INT_MIN * -1 as
    positive (the where below gave 7 instead of INT_MIN's wrapped self)."""
    info = np.iinfo(dtype)
    shape = bz.Shape((6,), dtype_from_numpy(np.dtype(dtype)))
    body = bz.Graph("body")
    x = body.input("in0", shape)
    neg = body.mul(x, body.constant(-1, shape.dtype))
    big = body.add(x, body.constant(int(info.max), shape.dtype))
    body.set_outputs([body.where(body.gt(neg, body.constant(1, shape.dtype)),
                                 body.constant(7, shape.dtype), neg),
                      body.where(body.lt(big, x), body.constant(3, shape.dtype), big)])
    g = bz.Graph("r")
    g.set_outputs(list(g.elementwise_region(body, [g.input("x0", shape)])))
    a = np.array([info.min, info.max, 0, -1, 5, info.min + 1], dtype)
    with np.errstate(all="ignore"):
        exe = bz.compile(g, target="cpu")
        got, want = exe({"x0": a}), bz.interpret(g, {"x0": a})
    rows = {kind: d for _, kind, d, _ in exe.dispatch_report().rows}
    assert rows["elementwise_region"] == Dispatch.GENERATED
    for o, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(o, w)
