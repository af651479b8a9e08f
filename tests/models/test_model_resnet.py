"""ResNet basic block builder (braze.models.resnet) against an independent NumPy block written
here: convolution as a sum over kernel taps, inference batch norm, identity or 1x1 shortcut."""
import numpy as np
import pytest

import braze as bz
from braze.models import resnet_basic_block


def _conv(x, w, stride, pad):
    """NCHW convolution, weights [O, C, kh, kw], as a sum of per-tap channel contractions."""
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    _, _, H, W = x.shape
    _, _, kh, kw = w.shape
    ho, wo = (H - kh) // stride + 1, (W - kw) // stride + 1
    out = 0.0
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i:i + stride * ho:stride, j:j + stride * wo:stride]
            out = out + np.einsum("bchw,oc->bohw", patch, w[:, :, i, j])
    return out


def _bn(x, p, prefix, eps=1e-5):
    c = lambda name: p[f"{prefix}.{name}"][None, :, None, None]
    return (x - c("mean")) / np.sqrt(c("var") + eps) * c("gamma") + c("beta")


def reference_block(p, x, downsample):
    p = {k: np.asarray(v, np.float64) for k, v in p.items()}
    x = np.asarray(x, np.float64)
    stride = 2 if downsample else 1
    h = np.maximum(_bn(_conv(x, p["conv1.weight"], stride, 1), p, "bn1"), 0.0)
    h = _bn(_conv(h, p["conv2.weight"], 1, 1), p, "bn2")
    if downsample:
        x = _bn(_conv(x, p["downsample.conv.weight"], 2, 0), p, "downsample.bn")
    return np.maximum(h + x, 0.0)


def _compare(g, x, params, ref):
    (out,) = bz.interpret(g, {"x": x}, params)
    assert out.dtype == np.float32 and out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    (out64,) = bz.interpret(g, {"x": x}, params, float64=True)
    np.testing.assert_allclose(out64, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("downsample", [False, True])
def test_resnet_basic_block_matches_numpy(downsample):
    g = resnet_basic_block(channels=8, hw=8, batch=2, downsample=downsample)
    params = bz.init_params(g, seed=0)
    assert all((params[n] > 0).all() for n in params if n.endswith(".var"))
    x = np.random.default_rng(1).standard_normal((2, 8, 8, 8)).astype(np.float32)
    ref = reference_block(params, x, downsample)
    assert ref.shape == ((2, 16, 4, 4) if downsample else (2, 8, 8, 8))
    _compare(g, x, params, ref)


def test_resnet_op_counts():
    assert resnet_basic_block(channels=4, hw=4).op_counts() == {
        "conv2d": 2, "batch_norm": 2, "relu": 2, "add": 1}
    assert resnet_basic_block(channels=4, hw=4, downsample=True).op_counts() == {
        "conv2d": 3, "batch_norm": 3, "relu": 2, "add": 1}


def test_resnet_param_names_and_default_shapes():
    g = resnet_basic_block(downsample=True)
    assert g.inputs[0].op.shape.dims == (1, 64, 56, 56)
    assert g.shape_of(g.outputs[0]).dims == (1, 128, 28, 28)
    shapes = {n.op.name: n.op.shape.dims for n in g.params}
    assert shapes["conv1.weight"] == (128, 64, 3, 3)
    assert shapes["conv2.weight"] == (128, 128, 3, 3)
    assert shapes["downsample.conv.weight"] == (128, 64, 1, 1)
    stats = {f"{bn}.{s}" for bn in ("bn1", "bn2", "downsample.bn")
             for s in ("gamma", "beta", "mean", "var")}
    assert set(shapes) == stats | {"conv1.weight", "conv2.weight", "downsample.conv.weight"}


def test_resnet_seeded_weights_run_without_params():
    g = resnet_basic_block(channels=4, hw=6, batch=1, seed=4)
    expected = bz.init_params(resnet_basic_block(channels=4, hw=6, batch=1), seed=4)
    assert set(g.weights) == set(expected)
    x = np.random.default_rng(2).standard_normal((1, 4, 6, 6)).astype(np.float32)
    (out,) = bz.interpret(g, {"x": x})
    np.testing.assert_allclose(out, reference_block(expected, x, False), rtol=1e-5, atol=1e-5)
