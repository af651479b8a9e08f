"""Scalar constants of generated element-wise regions are kernel arguments (codegen.scalars):
regions that differ only by a constant share one source and one compiled kernel, regions that
differ by structure do not, the constants that let the compiler drop work stay literals, and
every kind of argument (body constants of each dtype, clamp bounds, leaky slopes; NaN,
denormals, values float32 cannot hold) gives the bits the literal gave: the reference
interpreter's."""
import ml_dtypes
import numpy as np
import pytest

import braze as bz
from braze.runtime.codegen import cc, elementwise
from braze.runtime.codegen.elementwise import region_scalars, region_source
from braze.runtime.codegen.scalars import ScalarArgs
from braze.runtime.kernels import Dispatch

pytestmark = pytest.mark.skipif(not cc.available(), reason="no C compiler on this machine")


def _region(dtype, shape, build, n_inputs=1):
    """A graph of one ElementwiseRegion whose body is `build(body, *inputs)`."""
    body = bz.Graph("body")
    ins = [body.input(f"in{i}", bz.Shape(shape, dtype)) for i in range(n_inputs)]
    body.set_outputs([build(body, *ins)])
    g = bz.Graph("r")
    gins = [g.input(f"x{i}", bz.Shape(shape, dtype)) for i in range(n_inputs)]
    g.set_outputs([g.elementwise_region(body, gins)])
    return g


def _op(g):
    (node,) = [n for n in g.nodes if n.op.kind == "elementwise_region"]
    return node.op


def _source(g):
    op = _op(g)
    shape = g.shape_of(g.outputs[0])
    return region_source(op, [shape] * len(op.body.input_ids), shape, "f")


def _scaled(n, shape=(23, 41)):
    """n regions `h * s_i + b_i`, a softmax between each: n regions differing by constants."""
    g = bz.Graph(f"scaled_{n}")
    h = g.input("x", bz.Shape(shape))
    for i in range(n):
        h = g.sm(g.add(g.mul(h, 0.5 + i / 1024), 3.0 + i))
    g.set_outputs([h])
    return g


def test_regions_differing_only_by_constants_build_one_kernel(monkeypatch, tmp_path):
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path))
    g = _scaled(12)
    exe = bz.compile(g)
    feeds = bz.random_feeds(g, 0)
    np.testing.assert_array_equal(exe(feeds)[0], bz.interpret(g, feeds)[0])
    assert len(exe.dispatch_report().by_dispatch(Dispatch.GENERATED)) == 12
    assert len(list(tmp_path.glob("region_*.so"))) == 1


def test_one_source_per_structure():
    mul = [_source(_region(bz.f32, (8, 8), lambda b, x, c=c: b.add(b.mul(x, c), 0.25)))
           for c in (0.5, 0.3, 7.0, np.nan)]
    assert len(set(mul)) == 1
    div = _source(_region(bz.f32, (8, 8), lambda b, x: b.add(b.div(x, 0.3), 0.25)))
    sub = _source(_region(bz.f32, (8, 8), lambda b, x: b.sub(b.mul(x, 0.3), 0.25)))
    other_dtype = _source(_region(bz.f64, (8, 8), lambda b, x: b.add(b.mul(x, 0.3), 0.25)))
    assert len({mul[0], div, sub, other_dtype}) == 4


@pytest.mark.parametrize("build, literal", [
    (lambda b, x: b.pow(x, 2.0), "2.0"),                   # x * x
    (lambda b, x: b.div(x, 8.0), "8.0"),                   # a multiply by 0.125
    (lambda b, x: b.mul(x, 1.0), "1.0"),
    (lambda b, x: b.add(x, 0.0), "0.0"),
    (lambda b, x: b.clamp(x, -np.inf, 6.0), "INFINITY"),   # one compare fewer
], ids=["pow", "div_pow2", "mul_one", "add_zero", "clamp_inf"])
def test_constants_that_remove_work_stay_literals(build, literal):
    src = _source(_region(bz.f32, (8, 8), build))
    assert literal in src
    if literal == "INFINITY":  # the finite bound is an argument
        assert "6.0" not in src and "memcpy(&s0_" in src


def test_integer_divisors_stay_literals():
    src = _source(_region(bz.i32, (8, 8), lambda b, x: b.add(b.div(x, b.constant(7, bz.i32)),
                                                             b.constant(5, bz.i32))))
    assert "((int32_t)7)" in src and "((int32_t)5)" not in src


def _f32(shape, rng):
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x.reshape(-1)[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40]
    return x


def _half(npt):
    def make(shape, rng):
        with np.errstate(over="ignore"):
            return _f32(shape, rng).astype(npt)
    return make


def _ints(npt):
    def make(shape, rng):
        info = np.iinfo(npt)
        lo, hi = max(info.min, -1000), min(info.max, 1000)
        return rng.integers(lo, hi, shape).astype(npt)
    return make


CASES = {  # name: (dtype, inputs, body)
    "f32_scale_bias": (bz.f32, _f32, lambda b, x: b.add(b.mul(x, 0.1), 3.7)),
    "f32_nan_denormal": (bz.f32, _f32, lambda b, x: b.add(b.mul(x, 1e-40), b.maximum(x, np.nan))),
    "f32_div_where": (bz.f32, _f32, lambda b, x: b.where(b.lt(x, 0.3), b.div(x, 0.7), -2.5)),
    "f32_clamp": (bz.f32, _f32, lambda b, x: b.clamp(x, -0.1, 6.3)),
    "f32_leaky": (bz.f32, _f32, lambda b, x: b.leaky_relu(b.add(x, 0.2), 0.013)),
    "f64_not_f32": (bz.f64, lambda s, r: _f32(s, r).astype(np.float64),
                    lambda b, x: b.add(b.mul(x, b.constant(0.1, bz.f64)),
                                       b.constant(1e-310, bz.f64))),
    "f64_clamp_leaky": (bz.f64, lambda s, r: _f32(s, r).astype(np.float64),
                        lambda b, x: b.leaky_relu(b.clamp(x, -0.1, 2.3), 0.013)),
    "f16_affine": (bz.f16, _half(np.float16),
                   lambda b, x: b.add(b.mul(x, b.constant(0.1, bz.f16)),
                                      b.constant(3.7, bz.f16))),
    "f16_clamp_leaky": (bz.f16, _half(np.float16),
                        lambda b, x: b.leaky_relu(b.clamp(x, -0.1, 70000.0), 0.013)),
    "bf16_affine": (bz.bf16, _half(ml_dtypes.bfloat16),
                    lambda b, x: b.sub(b.mul(x, b.constant(0.1, bz.bf16)),
                                       b.constant(3.7, bz.bf16))),
    "bf16_clamp_leaky": (bz.bf16, _half(ml_dtypes.bfloat16),
                         lambda b, x: b.leaky_relu(b.clamp(x, -0.1, 6.3), 0.013)),
    "bf16_policy_casts": (bz.f32, _f32,  # the precision policy's roundings around math
                          lambda b, x: b.add(b.cast(b.mul(b.cast(x, bz.bf16),
                                                          b.constant(0.1, bz.bf16)), bz.f32),
                                             0.3)),
    "i32": (bz.i32, _ints(np.int32),
            lambda b, x: b.add(b.mul(x, b.constant(-3, bz.i32)), b.constant(123457, bz.i32))),
    "i64_beyond_f64": (bz.i64, _ints(np.int64),
                       lambda b, x: b.add(x, b.constant(2 ** 62 + 1, bz.i64))),
    "u8_wraps": (bz.u8, _ints(np.uint8), lambda b, x: b.add(b.mul(x, b.constant(3, bz.u8)),
                                                         b.constant(200, bz.u8))),
}


FUSED_MULTIPLY_ADD = {"f32_scale_bias", "f64_not_f32"}
"""Cases whose float32 / float64 product and sum the kernel contracts into one FMA (as it
did with literals: cc.PRECISE_FLAGS): the literal kernel's bits, not the reference's."""


def _compiled(g, feeds):
    exe = bz.compile(g)
    with np.errstate(all="ignore"):
        got = exe(feeds)[0]
    (row,) = [r for r in exe.dispatch_report().rows if r[1] == "elementwise_region"]
    assert row[2] == Dispatch.GENERATED
    return got


def _assert_bits(got, want):
    assert got.dtype == want.dtype
    if got.dtype.kind == "f" or got.dtype == ml_dtypes.bfloat16:
        nan = np.isnan(want.astype(np.float64))
        np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), nan)
        bits = f"u{got.dtype.itemsize}"
        np.testing.assert_array_equal(got.view(bits)[~nan], want.view(bits)[~nan])
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", sorted(CASES))
def test_arguments_give_the_bits_literals_gave(name, monkeypatch):
    """The kernel reading its scalars gives the literal kernel's bits, which are the
    reference's (but where both contract a product and a sum into an FMA)."""
    dtype, make, build = CASES[name]
    g = _region(dtype, (37, 53), build)
    assert region_scalars(_op(g)) is not None, "the case passes no argument"
    feeds = {"x0": make((37, 53), np.random.default_rng(len(name)))}
    got = _compiled(g, feeds)
    with monkeypatch.context() as m:
        m.setattr(elementwise, "scalar_args", lambda body, value_type: ScalarArgs({}, ()))
        assert region_scalars(_op(g)) is None
        literal = _compiled(g, feeds)
    _assert_bits(got, literal)
    if name not in FUSED_MULTIPLY_ADD:
        with np.errstate(all="ignore"):
            _assert_bits(got, bz.interpret(g, feeds)[0])


def test_symbolic_and_streaming_regions_read_their_scalars(monkeypatch):
    """The scalars' argument sits before the run-time geometry of a symbolic region and
    beside the tiles of streaming stores: both read the right values, at every binding."""
    g = bz.Graph("dyn")
    x = g.input("x", bz.Shape(("batch", 24)))
    bias = g.input("bias", bz.Shape((24,)))
    h = g.clamp(g.add(g.mul(x, 0.3), bias), -2.5, 2.75)
    g.set_outputs([g.sm(g.leaky_relu(g.sub(h, 0.7), 0.07))])
    rng = np.random.default_rng(0)
    sources = []
    real = cc.compile_c
    monkeypatch.setattr(cc, "compile_c", lambda src, *a, **k: sources.append(src) or
                        real(src, *a, **k))
    for stream in ("", "0"):
        monkeypatch.setenv("BRAZE_STREAM_MIN_MB", stream)
        exe = bz.compile(g)
        for b in (3, 50, 7):
            feeds = {"x": rng.standard_normal((b, 24), dtype=np.float32) * 4,
                     "bias": rng.standard_normal(24, dtype=np.float32)}
            np.testing.assert_allclose(exe(feeds)[0], bz.interpret(g, feeds)[0], rtol=1e-5,
                                       atol=1e-7)
            rows = [r for r in exe.dispatch_report().rows if r[1] == "elementwise_region"]
            assert rows and all(r[2] == Dispatch.GENERATED for r in rows)
            assert all(("streaming" in r[3]) == (stream == "0") for r in rows)
    regions = {src for src in sources if "void region_" in src}
    assert len(regions) == 2  # plain and streaming stores, each serving every binding
    assert all("G[" in src and "memcpy(&s3_" in src for src in regions)
