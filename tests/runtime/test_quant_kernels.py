"""Quantize / dequantize in the compiled executor (runtime/kernels/quant.py) give the reference
interpreter's bits for every float x / scale dtype and integer dtype, per tensor and per axis,
on ties, huge values, infinities and NaN, on one thread and several; the dispatch report names
the C kernels; a dequantized int8 weight is computed once (static); fusion leaves the ops out of
elementwise regions and keeps the graph's meaning."""
from __future__ import annotations

import numpy as np
import pytest

import braze as bz
from braze.runtime.kernels import Dispatch, quant

pytestmark = [
    pytest.mark.skipif(quant.lib() is None, reason="no C compiler on this machine"),
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),  # inf / NaN inputs on purpose
]


def _hard(rng, shape, scale, dtype) -> np.ndarray:
    """Exact ties (k + 0.5 quanta), values beyond the range, infinities and NaN."""
    x = rng.normal(size=shape) * 80 * scale
    ties = (rng.integers(-300, 300, size=shape) + 0.5) * scale
    x = np.where(rng.random(shape) < 0.3, ties, x)
    pick = rng.random(shape)
    x[pick < 0.02] = np.nan
    x[(pick > 0.02) & (pick < 0.03)] = np.inf
    x[(pick > 0.03) & (pick < 0.04)] = -1e30
    return x.astype(dtype.np)


def _same(g, feeds, params=None, threads=None):
    exe = bz.compile(g, "cpu", params=params, threads=threads)
    for want, got in zip(bz.interpret(g, feeds, params), exe(feeds), strict=True):
        assert want.dtype == got.dtype and want.shape == got.shape
        if want.dtype.kind in "iu":
            np.testing.assert_array_equal(got, want)
        else:
            bits = np.dtype(f"u{want.dtype.itemsize}")
            nan = np.isnan(want.astype(np.float32))
            np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
            np.testing.assert_array_equal(np.where(nan, 0, got.view(bits)),
                                          np.where(nan, 0, want.view(bits)))
    return exe


@pytest.mark.parametrize("xdt", [bz.f32, bz.f16, bz.bf16, bz.f64])
@pytest.mark.parametrize("qdt", [bz.i8, bz.u8])
@pytest.mark.parametrize("axis", [None, 0, 1, 2])
@pytest.mark.parametrize("threads", [1, 2])
def test_quantize_and_dequantize_kernels_give_the_reference_bits(xdt, qdt, axis, threads):
    rng = np.random.default_rng(0)
    shape = (3, 5, 2000) if threads == 1 else (4, 3, 30000)
    n = 1 if axis is None else shape[axis]
    scale = (rng.random(n) * 0.1 + 0.005).astype(xdt.np)
    zp = rng.integers(0, 40, n) if qdt == bz.u8 else rng.integers(-20, 20, n)
    if axis is None:
        scale, zp = scale[0], zp[0]
    g = bz.Graph("q")
    x = g.input("x", bz.Shape(shape, xdt))
    q = g.quantize(x, scale, np.asarray(zp, qdt.np), axis=axis, dtype=qdt)
    g.set_outputs([q, g.dequantize(q, scale, np.asarray(zp, qdt.np), axis=axis)])
    exe = _same(g, {"x": _hard(rng, shape, 0.05, xdt)}, threads=threads)
    report = str(exe.dispatch_report())
    assert "C quantize" in report and "C dequantize" in report
    assert "reference fallback" not in report


def test_int32_dequantize_gives_the_reference_bits():
    rng = np.random.default_rng(1)
    g = bz.Graph("q")
    q = g.input("q", bz.Shape((7, 300), bz.i32))
    g.set_outputs([g.dequantize(q, np.float32(3e-4), np.int32(-5))])
    _same(g, {"q": rng.integers(-2**31, 2**31 - 1, (7, 300)).astype(np.int32)})


def _quantized_mlp():
    g = bz.Graph("qmlp")
    x = g.input("x", bz.Shape((6, 32), bz.f32))
    w = g.param("w_q", bz.Shape((32, 16), bz.i8))
    w_scale = np.linspace(0.002, 0.01, 16).astype(np.float32)
    wf = g.dequantize(w, w_scale, 0, axis=1)
    h = g.dequantize(g.quantize(x, 0.02, 3), 0.02, 3)
    y = g.gelu(g.add(g.mul(g.mm(h, wf), 1.5), g.param("b", bz.Shape((16,), bz.f32))))
    y = g.fake_quantize(g.tanh(y), 1 / 127, 0)
    g.set_outputs([g.add(g.mul(y, 2.0), 1.0)])
    rng = np.random.default_rng(2)
    params = {"w_q": rng.integers(-128, 128, (32, 16)).astype(np.int8),
              "b": rng.normal(size=16).astype(np.float32)}
    return g, params, {"x": rng.normal(size=(6, 32)).astype(np.float32)}


def test_a_dequantized_weight_is_computed_once_and_the_rest_runs_c_kernels():
    g, params, feeds = _quantized_mlp()
    exe = _same(g, feeds, params)
    rows = {(r[1], r[2]) for r in exe.dispatch_report().rows}
    assert ("dequantize", Dispatch.STATIC) in rows
    assert ("quantize", Dispatch.NATIVE) in rows and ("dequantize", Dispatch.NATIVE) in rows
    assert not any(d == Dispatch.REFERENCE for _, d in rows)


def test_fusion_keeps_quantize_out_of_regions_and_the_meaning():
    g, params, feeds = _quantized_mlp()
    fused, _ = bz.fuse(g, "cpu")
    bz.verify(fused)
    for n in fused.nodes:
        body = getattr(n.op, "body", None)
        if body is not None:
            assert not {m.op.kind for m in body.nodes} & {"quantize", "dequantize",
                                                           "fake_quantize"}
    kinds = {n.op.kind for n in fused.nodes}
    assert {"quantize", "dequantize"} <= kinds | {"fake_quantize"}
    for want, got in zip(bz.interpret(g, feeds, params), bz.interpret(fused, feeds, params)):
        np.testing.assert_array_equal(got, want)
