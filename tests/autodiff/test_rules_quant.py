"""Autodiff of quantization: fake_quantize's straight-through gradient equals torch's
fake_quantize_per_tensor_affine / fake_quantize_per_channel_affine gradient (reverse and forward
mode), dequantize's scale gradient matches finite differences, and quantize has none."""
from __future__ import annotations

import numpy as np
import pytest
from check_grads import check_grads

import braze as bz
from braze.autodiff import grad_with_loss, jvp

torch = pytest.importorskip("torch")


def _inputs(rng, shape, scale):
    """Values inside, outside and at the edge of the int8 range of `scale`."""
    return (rng.normal(size=shape) * 100 * scale).astype(np.float32)


@pytest.mark.parametrize("qdt, zp", [(bz.i8, 3), (bz.u8, 128)])
def test_fake_quantize_per_tensor_gradient_is_torchs(qdt, zp):
    rng = np.random.default_rng(0)
    x = _inputs(rng, (4, 16), 0.02)
    ct = rng.normal(size=x.shape).astype(np.float32)
    g = bz.Graph("fq")
    v = g.input("x", bz.Shape(x.shape, bz.f32))
    y = g.fake_quantize(v, 0.02, zp, dtype=qdt)
    g.set_outputs([g.sum(g.mul(y, g.constant(ct)))])
    got = bz.interpret(grad_with_loss(g, ["x"]), {"x": x})[1]
    lo, hi = (-128, 127) if qdt == bz.i8 else (0, 255)
    t = torch.tensor(x, requires_grad=True)
    torch.fake_quantize_per_tensor_affine(t, 0.02, zp, lo, hi).backward(torch.tensor(ct))
    assert 0 < (got == 0).sum() < got.size  # both sides of the range are exercised
    np.testing.assert_array_equal(got, t.grad.numpy())


def test_fake_quantize_per_channel_gradient_is_torchs_in_both_modes():
    rng = np.random.default_rng(1)
    x = _inputs(rng, (3, 5, 4), 0.03)
    scale = (rng.random(5) * 0.04 + 0.01).astype(np.float32)
    zp = rng.integers(-20, 20, size=5).astype(np.int8)
    ct = rng.normal(size=x.shape).astype(np.float32)
    g = bz.Graph("fq")
    v = g.input("x", bz.Shape(x.shape, bz.f32))
    y = g.fake_quantize(v, scale, zp, axis=1)
    g.set_outputs([g.sum(g.mul(y, g.constant(ct)))])
    got = bz.interpret(grad_with_loss(g, ["x"]), {"x": x})[1]
    t = torch.tensor(x, requires_grad=True)
    zp_t = torch.tensor(zp, dtype=torch.int32)
    torch.fake_quantize_per_channel_affine(t, torch.tensor(scale), zp_t, 1, -128, 127).backward(
        torch.tensor(ct))
    np.testing.assert_array_equal(got, t.grad.numpy())
    # forward mode: the tangent of sum(ct * y) along direction d is sum(ct * mask * d)
    d = rng.normal(size=x.shape).astype(np.float32)
    tangent = bz.interpret(jvp(g, ["x"]), {"x": x, "tangent_x": d})[1]
    np.testing.assert_allclose(tangent, (t.grad.numpy() * d).sum(), rtol=1e-5)


def test_dequantize_gradient_reaches_the_scale():
    q = np.arange(-12, 12, dtype=np.int8).reshape(4, 6) * 7
    zp = np.arange(6, dtype=np.int8) - 2

    def per_axis(g, s):
        return g.dequantize(g.constant(q), s, g.constant(zp), axis=1)

    def per_tensor(g, s):
        return g.dequantize(g.constant(q), g.sum(s), g.constant(np.int8(3)))

    for fn in (per_axis, per_tensor):
        check_grads(fn, [(6,)], seed=2)


def test_quantize_passes_no_gradient():
    g = bz.Graph("q")
    v = g.input("x", bz.Shape((5,), bz.f32))
    y = g.dequantize(g.quantize(v, 0.1), 0.1)
    g.set_outputs([g.sum(y)])
    grads = bz.interpret(grad_with_loss(g, ["x"]), {"x": np.ones(5, np.float32)})[1]
    np.testing.assert_array_equal(grads, np.zeros(5, np.float32))
