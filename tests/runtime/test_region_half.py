"""Generated ElementwiseRegion kernels over float16 / bfloat16 values (codegen/half.py): each
op computed in float32 and rounded to its type, as the reference interpreter's NumPy ops are.
Exactly rounded chains give the reference's bits (NaN where it has NaN); the transcendental
functions and activations are measured on every half-precision input against the bounds that
codegen/half.py documents; every region here runs generated C, not its reference."""
import zlib

import ml_dtypes
import numpy as np
import pytest

import braze as bz
from braze.runtime.codegen import cc
from braze.runtime.kernels import Dispatch

pytestmark = pytest.mark.skipif(not cc.available(), reason="no C compiler on this machine")

HALF = {"f16": (bz.f16, np.float16), "bf16": (bz.bf16, ml_dtypes.bfloat16)}

# Max ulps against the reference on all 65536 inputs, and on how many inputs it may exceed 1.
UNARY_BOUNDS = {
    **{fn: (0, 0) for fn in ("sqrt", "rsqrt", "abs", "neg", "square", "reciprocal", "floor",
                             "ceil", "round", "relu", "sign", "hard_swish")},
    **{fn: (1, 0) for fn in ("exp", "tanh", "erf", "log", "sin", "cos", "gelu", "gelu_approx")},
    **{fn: (2, 1) for fn in ("sigmoid", "silu", "quick_gelu")},  # f16: an exp one ulp off near 1
}


def _region_graph(dtypes, shapes, build):
    body = bz.Graph("body")
    ins = [body.input(f"in{i}", bz.Shape(s, d)) for i, (d, s) in enumerate(zip(dtypes, shapes))]
    outs = build(body, *ins)
    body.set_outputs(list(outs) if isinstance(outs, tuple) else [outs])
    g = bz.Graph("r")
    gins = [g.input(f"x{i}", bz.Shape(s, d)) for i, (d, s) in enumerate(zip(dtypes, shapes))]
    outs = g.elementwise_region(body, gins)
    g.set_outputs(list(outs) if isinstance(outs, (tuple, list)) else [outs])
    return g


def _run(g, feeds):
    """(compiled outputs, reference outputs), asserting the region ran generated C."""
    exe = bz.compile(g, target="cpu")
    with np.errstate(all="ignore"):
        got, want = exe(feeds), bz.interpret(g, feeds)
    rows = [(d, impl) for _, kind, d, impl in exe.dispatch_report().rows
            if kind == "elementwise_region"]
    assert rows and all(d == Dispatch.GENERATED for d, _ in rows), rows
    assert all(impl.startswith("generated C region") for _, impl in rows)
    return got, want


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Distance in representable half values (+0 and -0 one apart); 0 where both are NaN,
    a huge number where only one is."""
    def key(a):
        b = a.view(np.uint16).astype(np.int64)
        m = b & 0x7FFF
        return np.where(b & 0x8000, -m - 1, m)
    gn, wn = (np.isnan(a.astype(np.float32)) for a in (got, want))
    d = np.abs(key(got) - key(want))
    d[gn & wn] = 0
    d[gn != wn] = 1 << 20
    return d


def _assert_bits(got: np.ndarray, want: np.ndarray):
    """Identical bits, NaN where the reference has NaN (its sign and payload may differ)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype.kind == "b" or got.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want)
        return
    d = _ulps(got, want)
    assert d.max() == 0, (got[d > 0][:5], want[d > 0][:5])


def _inputs(rng, npt, shape, scale=3.0):
    """Random values with NaN, +-inf, +-0, large and tiny magnitudes mixed in."""
    x = rng.standard_normal(shape) * scale
    flat = x.reshape(-1)
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 6e4, -6e4, 3e38, 1e-7, -2e-5, 1e4]
    k = min(flat.size, len(specials))
    flat[rng.choice(flat.size, k, replace=False)] = specials[:k]
    with np.errstate(over="ignore"):
        return x.astype(npt)


@pytest.mark.parametrize("dt", sorted(HALF))
@pytest.mark.parametrize("fn", sorted(UNARY_BOUNDS))
def test_unary_functions_on_every_half_value(dt, fn):
    """All 65536 bit patterns (every finite value, subnormals, +-0, +-inf, NaNs)."""
    bzt, npt = HALF[dt]
    x = np.arange(1 << 16, dtype=np.uint16).view(npt)
    g = _region_graph([bzt], [x.shape],  # the cast sees the value as the body holds it
                      lambda b, v: (getattr(b, fn)(v), b.cast(getattr(b, fn)(v), bz.f32)))
    (got, wide), (want, _) = _run(g, {"x0": x})
    np.testing.assert_array_equal(wide, got.astype(np.float32))
    max_ulp, beyond_one = UNARY_BOUNDS[fn]
    d = _ulps(got, want)
    assert d.max() <= max_ulp, (x[d == d.max()][:5], got[d == d.max()][:5])
    assert (d > 1).sum() <= beyond_one
    # bit-identical but near rounding boundaries (and erf(-0): -0 here, +0 in the reference)
    assert (d > 0).sum() <= 5


@pytest.mark.parametrize("dt", sorted(HALF))
def test_loads_and_rounding_are_the_conversions(dt):
    """half -> float32 of every half value, and float32 -> half of float32 values across the
    whole range (every 65537th bit pattern, the half overflow and subnormal edges and their
    neighbours), bit for bit against NumPy / ml_dtypes."""
    bzt, npt = HALF[dt]
    h = np.arange(1 << 16, dtype=np.uint16).view(npt)
    edges = np.array([65504, 65519.996, 65520, 65536, 2.0 ** -14, 2.0 ** -24, 2.0 ** -25,
                      3 * 2.0 ** -26, 2.0 ** -15 * 1.5, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11,
                      3.3895314e38, 3.4028235e38, 1e-40], np.float32)
    with np.errstate(over="ignore"):
        near = np.concatenate([np.nextafter(edges, np.float32(np.inf)),
                               np.nextafter(edges, np.float32(-np.inf)), edges])
    bits = np.arange(0, 1 << 32, 65537, dtype=np.uint64).astype(np.uint32).view(np.float32)
    f = np.concatenate([bits, near, -near])
    g = _region_graph([bzt], [h.shape], lambda b, v: b.cast(v, bz.f32))
    (got,), _ = _run(g, {"x0": h})
    np.testing.assert_array_equal(got.view(np.uint32), h.astype(np.float32).view(np.uint32))
    g = _region_graph([bz.f32], [f.shape], lambda b, v: b.cast(v, bzt))
    (got,), (want,) = _run(g, {"x0": f})
    _assert_bits(got, want)


def _chain_affine(b, x, y):      # x * y + 0.5, broadcast over rows
    return b.add(b.mul(x, y), 0.5)


def _chain_compare(b, x, y):     # where(x < y, x - y, max(x, y) / y), relu, min
    d = b.where(b.lt(x, y), b.sub(x, y), b.div(b.maximum(x, y), y))
    return b.minimum(b.relu(d), b.neg(b.abs(y))), b.ge(d, x)


def _chain_clamp(b, x, y):       # clamp, leaky_relu, square, sign, and an f16 table
    t = b.clamp(b.add(x, y), -1.7, 2.3)
    return (b.mul(b.leaky_relu(b.square(t), 0.1), b.sign(y)),
            b.clamp(b.sub(x, y), 0.0, float("inf")))


def _chain_gelu(b, x, y):        # gelu(x * y + bias) then a sigmoid-gated product
    h = b.gelu(b.add(b.mul(x, y), 0.25))
    return b.mul(h, b.sigmoid(y)), b.tanh(b.sub(x, y))


def _chain_silu_exp(b, x, y):    # silu, exp, erf, rsqrt, quick_gelu, gelu_approx
    s = b.add(x, y)
    return (b.mul(b.silu(x), b.exp(b.neg(b.abs(y)))), b.erf(b.mul(s, 0.3)),
            b.rsqrt(b.add(b.abs(s), 1.0)), b.quick_gelu(s), b.gelu_approx(b.sub(y, x)))


EXACT_CHAINS = {"affine": _chain_affine, "compare": _chain_compare, "clamp": _chain_clamp}
TRANSCENDENTAL_CHAINS = {"gelu": _chain_gelu, "silu_exp": _chain_silu_exp}
SHAPES = [[(37, 29), (29,)], [(3, 1, 7), (1, 5, 1)], [(1000, 33), (1000, 33)], [(1,), (257,)]]


@pytest.mark.parametrize("dt", sorted(HALF))
@pytest.mark.parametrize("chain", sorted(EXACT_CHAINS))
@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: "x".join(map(str, s[0])))
def test_exactly_rounded_chains_give_the_reference_bits(dt, chain, shapes):
    bzt, npt = HALF[dt]
    rng = np.random.default_rng(zlib.crc32(f"{dt} {chain} {shapes}".encode()))
    g = _region_graph([bzt, bzt], shapes, EXACT_CHAINS[chain])
    feeds = {f"x{i}": _inputs(rng, npt, s) for i, s in enumerate(shapes)}
    got, want = _run(g, feeds)
    for a, w in zip(got, want, strict=True):
        _assert_bits(a, w)


@pytest.mark.parametrize("dt", sorted(HALF))
@pytest.mark.parametrize("chain", sorted(TRANSCENDENTAL_CHAINS))
@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: "x".join(map(str, s[0])))
def test_transcendental_chains_within_the_documented_ulps(dt, chain, shapes):
    """Each function within its bound; a chain of them stays within 1 ulp on all but a
    few elements in ten thousand (a value one ulp off feeds the next op), never NaN where
    the reference is a number."""
    bzt, npt = HALF[dt]
    rng = np.random.default_rng(zlib.crc32(f"{dt} {chain} {shapes}".encode()))
    g = _region_graph([bzt, bzt], shapes, TRANSCENDENTAL_CHAINS[chain])
    feeds = {f"x{i}": _inputs(rng, npt, s) for i, s in enumerate(shapes)}
    got, want = _run(g, feeds)
    for a, w in zip(got, want, strict=True):
        d = _ulps(a, w)
        assert d.max() <= 2, (a[d == d.max()][:5], w[d == d.max()][:5])
        assert (d > 1).sum() <= max(1, d.size // 5000)
        assert (d > 0).sum() <= max(2, d.size // 100)  # under 1% (2 of a small output)


@pytest.mark.parametrize("dt", sorted(HALF))
def test_mixed_regions_cast_to_float32_and_back(dt):
    """half inputs, a cast to float32, float32 math (products not contracted into FMAs: the
    reference rounds each), a cast back; float32 and float64 inputs cast to half (float64 to
    float16 in one rounding, to bfloat16 through float32, as NumPy and ml_dtypes cast); a
    cast between the half types; compares on halves feeding a float32 where."""
    bzt, npt = HALF[dt]
    other = bz.bf16 if dt == "f16" else bz.f16
    shapes = [(61, 17), (17,), (61, 17), (61, 17)]

    def build(b, x, y, f, d):
        xf = b.cast(x, bz.f32)
        m = b.add(b.mul(xf, f), b.div(b.cast(y, bz.f32), 3.0))
        back = b.cast(m, bzt)
        return (b.add(back, y), b.cast(d, bzt), b.cast(b.cast(x, other), bzt),
                b.where(b.gt(x, y), f, b.cast(y, bz.f32)), b.cast(b.mul(x, y), bz.f64),
                b.cast(b.cast(x, bz.i32), bzt))

    g = _region_graph([bzt, bzt, bz.f32, bz.f64], shapes, build)
    rng = np.random.default_rng(7)
    d = rng.standard_normal(shapes[3]) * 100
    d.reshape(-1)[:4] = [1 + 2.0 ** -11 + 2.0 ** -40, 1 + 2.0 ** -8 + 2.0 ** -30, np.nan, 7e4]
    feeds = {"x0": _inputs(rng, npt, shapes[0], 100), "x1": _inputs(rng, npt, shapes[1]),
             "x2": rng.standard_normal(shapes[2]).astype(np.float32) * 50, "x3": d}
    x0 = feeds["x0"]  # finite: C leaves float -> int of NaN / inf undefined (NumPy: INT_MIN)
    x0[~np.isfinite(x0.astype(np.float32))] = 7
    x0.reshape(-1)[:8] = np.array([1.5, -2.5, 300, -70, 0.0, -0.0, -0.5, 1e3], npt)
    got, want = _run(g, feeds)
    for a, w in zip(got, want, strict=True):
        if a.dtype.kind == "f" and a.dtype.itemsize >= 4:
            np.testing.assert_array_equal(a, w)  # NaN in both where either is
        else:
            _assert_bits(a, w)


@pytest.mark.parametrize("dt", sorted(HALF))
def test_max_min_ties_and_nans_follow_each_type(dt):
    """NumPy's float16 maximum / minimum keep the first operand on ties (+0 vs -0),
    ml_dtypes' bfloat16 the second; a NaN operand wins."""
    bzt, npt = HALF[dt]
    vals = np.array([0.0, -0.0, 1.0, -1.0, np.nan, np.inf, -np.inf, 2.5], npt)
    x, y = np.repeat(vals, vals.size), np.tile(vals, vals.size)
    g = _region_graph([bzt, bzt], [x.shape, y.shape],
                      lambda b, u, v: (b.maximum(u, v), b.minimum(u, v), b.relu(u)))
    got, want = _run(g, {"x0": x, "x1": y})
    for a, w in zip(got, want, strict=True):
        _assert_bits(a, w)


@pytest.mark.parametrize("dt", sorted(HALF))
def test_half_constant_tables_and_large_parallel_regions(dt):
    """A half-precision table folded into the body, read from its array; a region above the
    parallel threshold (chunks across threads, a short last one)."""
    bzt, npt = HALF[dt]
    rng = np.random.default_rng(11)
    table = rng.standard_normal((3, 1, 6)).astype(npt)
    g = _region_graph([bzt], [(2, 3, 4, 6)],
                      lambda b, x: b.mul(b.add(x, b.constant(table)), 0.1))
    got, want = _run(g, {"x0": _inputs(rng, npt, (2, 3, 4, 6))})
    _assert_bits(got[0], want[0])
    n = cc.PARALLEL_MIN_ELEMENTS + 37
    g = _region_graph([bzt, bzt], [(n,), (n,)], lambda b, x, y: b.sub(b.mul(x, y), x))
    got, want = _run(g, {"x0": _inputs(rng, npt, (n,)), "x1": _inputs(rng, npt, (n,))})
    _assert_bits(got[0], want[0])
