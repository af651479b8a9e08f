"""CanonicalizeNorm peels only casts that keep every value: a LayerNorm / RMSNorm whose
statistics pass through a narrower float type (f32 -> f16) rounds there and is not the f32 norm
(the fused graph had overflowed nowhere where the original gave inf, or differed by f16
rounding); widening casts (f16 -> f32 statistics, HF's mixed precision) still canonicalize."""
import numpy as np

import braze as bz


def _c(g, v, dt=np.float32):
    return g.constant(dt(v))


def _ln_f16_variance():
    g = bz.Graph("ln_f16_var")
    x = g.mul(g.input("x", bz.Shape((2, 8, 32))), _c(g, 100.0))
    d = g.sub(x, g.mean(x, (2,), keepdims=True))
    d16 = g.cast(d, bz.f16)
    v = g.cast(g.mean(g.mul(d16, d16), (2,), keepdims=True), bz.f32)
    g.set_outputs([g.div(d, g.sqrt(g.add(v, _c(g, 1e-5))))])
    return g


def _rms_f16_square():
    g = bz.Graph("rms_f16_square")
    x = g.mul(g.input("x", bz.Shape((2, 8, 32))), _c(g, 300.0))
    h = g.cast(x, bz.f16)
    v = g.cast(g.mean(g.mul(h, h), (2,), keepdims=True), bz.f32)
    y = g.mul(x, g.rsqrt(g.add(v, _c(g, 1e-6))))
    w = g.param("w", bz.Shape((32,)), value=np.linspace(0.5, 1.5, 32).astype(np.float32))
    g.set_outputs([g.mul(y, w)])
    return g


def _rms_f16_model():
    g = bz.Graph("rms_f16_model")
    x = g.cast(g.input("x", bz.Shape((2, 8, 32))), bz.f16)
    h = g.cast(x, bz.f32)
    v = g.mean(g.mul(h, h), (2,), keepdims=True)
    y = g.cast(g.mul(h, g.rsqrt(g.add(v, _c(g, 1e-6)))), bz.f16)
    w = g.param("w", bz.Shape((32,), bz.f16), value=np.linspace(0.5, 1.5, 32).astype(np.float16))
    g.set_outputs([g.cast(g.mul(w, y), bz.f32)])
    return g


def _feeds():
    return {"x": np.random.default_rng(0).standard_normal((2, 8, 32)).astype(np.float32)}


def test_narrowing_cast_in_statistics_is_not_peeled():
    for g in (_ln_f16_variance(), _rms_f16_square()):
        fused, _ = bz.fuse(g, "cpu")
        bz.verify(fused)
        assert fused.count("layer_norm") == fused.count("rms_norm") == 0, g.name
        with np.errstate(all="ignore"):
            ref, out = bz.interpret(g, _feeds())[0], bz.interpret(fused, _feeds())[0]
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6, err_msg=g.name)


def test_widening_casts_still_canonicalize():
    g = _rms_f16_model()
    fused, _ = bz.fuse(g, "cpu")
    assert fused.count("rms_norm") + fused.count("fused_residual_rms_norm") == 1
    ref, out = bz.interpret(g, _feeds())[0], bz.interpret(fused, _feeds())[0]
    np.testing.assert_allclose(out, ref, rtol=2e-3, atol=2e-3)
