"""LayerNorm and RMSNorm written in primitives become the norm ops, in every common form; a
norm-shaped expression over the wrong axes is a reported miss, and nothing else is touched."""
import numpy as np
import pytest
from helpers import canonicalize, check_same

import braze as bz

E = 8


def _ln(g, x, form, gamma=None, beta=None, eps=1e-5):
    mean = g.mean(x, -1, keepdims=True)
    d = g.sub(x, mean)
    sq = g.pow(d, 2.0) if form != "mul" else g.mul(d, d)
    var = g.mean(sq, -1, keepdims=True)
    var = g.add(var, eps) if eps is not None else var
    if form == "rsqrt":
        y = g.mul(d, g.rsqrt(var))
    elif form == "recip":
        y = g.mul(g.reciprocal(g.sqrt(var)), d)
    else:
        y = g.div(d, g.sqrt(var))
    if gamma is not None:
        y = g.mul(gamma, y)
    if beta is not None:
        y = g.add(y, beta)
    return y


@pytest.mark.parametrize("form", ["div", "rsqrt", "recip", "mul"])
@pytest.mark.parametrize("affine", ["none", "gamma", "both"])
def test_layer_norm_forms(form, affine):
    g = bz.Graph("ln")
    x = g.input("x", bz.Shape(("b", "s", E)))
    gamma = g.param("g", bz.Shape((E,))) if affine != "none" else None
    beta = g.param("bb", bz.Shape((E,))) if affine == "both" else None
    g.set_outputs([_ln(g, x, form, gamma, beta, eps=1e-6)])
    out, _ = canonicalize(g)
    (n,) = [n for n in out.nodes if n.op.kind == "layer_norm"]
    assert n.op.eps == pytest.approx(1e-6) and n.op.has_gamma == (gamma is not None)
    assert n.op.has_beta == (beta is not None)
    assert out.count("reduce_mean") == 0
    check_same(g, out)


@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("inv", ["rsqrt", "div", "pow"])
def test_rms_norm_forms(square, inv):
    g = bz.Graph("rms")
    x = g.input("x", bz.Shape(("b", "s", E)))
    w = g.param("w", bz.Shape((E,)))
    sq = g.pow(x, 2.0) if square == "pow" else g.mul(x, x)
    ms = g.add(g.mean(sq, -1, keepdims=True), 1e-6)
    if inv == "rsqrt":
        y = g.mul(x, g.rsqrt(ms))
    elif inv == "pow":
        y = g.mul(x, g.pow(ms, -0.5))
    else:
        y = g.div(x, g.sqrt(ms))
    g.set_outputs([g.mul(y, w)])
    out, _ = canonicalize(g)
    (n,) = [n for n in out.nodes if n.op.kind == "rms_norm"]
    assert n.op.has_gamma and not n.op.has_beta
    check_same(g, out)


def test_gemma_one_plus_w_gamma_and_f32_casts():
    g = bz.Graph("gemma")
    x = g.input("x", bz.Shape(("b", "s", E)))
    w = g.param("w", bz.Shape((E,)))
    x32 = g.cast(x, bz.f32)
    y = g.mul(x32, g.rsqrt(g.add(g.mean(g.pow(x32, 2.0), -1, keepdims=True), 1e-6)))
    g.set_outputs([g.cast(g.mul(y, g.add(w, 1.0)), bz.f32)])
    out, _ = canonicalize(g)
    assert out.count("rms_norm") == 1 and out.count("reduce_mean") == 0
    check_same(g, out)


def test_a_norm_over_a_leading_axis_is_a_reported_miss():
    g = bz.Graph("axis")
    x = g.input("x", bz.Shape((4, E)))
    ms = g.add(g.mean(g.mul(x, x), 0, keepdims=True), 1e-6)   # over rows: not a norm axis
    g.set_outputs([g.mul(x, g.rsqrt(ms))])
    out, misses = canonicalize(g)
    assert out.count("rms_norm") == 0
    (miss,) = [m for m in misses if m.pattern == "CanonicalizeNorm"]
    assert miss.reason is bz.MissReason.AXIS_MISMATCH and "axes (0,)" in miss.detail
    check_same(g, out)


def test_statistics_used_elsewhere_keep_the_expression():
    g = bz.Graph("shared")
    x = g.input("x", bz.Shape((4, E)))
    mean = g.mean(x, -1, keepdims=True)
    d = g.sub(x, mean)
    y = g.div(d, g.sqrt(g.add(g.mean(g.mul(d, d), -1, keepdims=True), 1e-5)))
    g.set_outputs([y, mean])                          # the mean is an output too
    out, misses = canonicalize(g)
    assert out.count("layer_norm") == 0
    assert any(m.reason is bz.MissReason.GRAPH_OUTPUT for m in misses)
    a = np.random.default_rng(0).standard_normal((4, E)).astype(np.float32)
    np.testing.assert_allclose(bz.interpret(out, {"x": a})[0], bz.interpret(g, {"x": a})[0])


@pytest.mark.parametrize("same", [True, False])
def test_layer_norm_with_an_unmerged_copy_of_x_minus_mean(same):
    """torch.export writes x - mean(x) twice (Cohere's LayerNorm: once squared for the
    variance, once normalized); the copies are one LayerNorm, a different difference is not."""
    g = bz.Graph("copies")
    x = g.input("x", bz.Shape(("b", "s", E)))
    w = g.param("w", bz.Shape((E,)))
    mean = g.mean(x, -1, keepdims=True)
    other = mean if same else g.mean(g.mul(x, 2.0), -1, keepdims=True)
    var = g.add(g.mean(g.pow(g.sub(x, mean), 2.0), -1, keepdims=True), 1e-5)
    g.set_outputs([g.mul(w, g.mul(g.sub(x, other), g.rsqrt(var)))])
    assert g.count("sub") == 2
    out, _ = canonicalize(g)
    assert out.count("layer_norm") == int(same) and out.count("rms_norm") == 0
    assert out.count("reduce_mean") == (0 if same else 3)
    check_same(g, out)


@pytest.mark.parametrize("form", ["div", "rsqrt"])
def test_a_layer_norm_without_eps_is_eps_zero(form):
    """IBert's dynamo export drops its `1e-12 + var` (float32 cannot hold it): d / sqrt(var)."""
    g = bz.Graph("ln0")
    x = g.input("x", bz.Shape(("b", "s", E)))
    gamma, beta = g.param("g", bz.Shape((E,))), g.param("bb", bz.Shape((E,)))
    g.set_outputs([_ln(g, x, form, gamma, beta, eps=None)])
    out, _ = canonicalize(g)
    (n,) = [n for n in out.nodes if n.op.kind == "layer_norm"]
    assert n.op.eps == 0.0 and out.count("reduce_mean") == 0
    check_same(g, out)


def test_a_bf16_norm_reads_its_bf16_eps():
    """A bf16 model's constants are bfloat16 arrays (NumPy kind "V", not "f"): the eps is read
    all the same."""
    g = bz.Graph("ln_bf16")
    x = g.input("x", bz.Shape(("b", "s", E), bz.bf16))
    g.set_outputs([_ln(g, x, "rsqrt", eps=2.0 ** -10)])
    out, _ = canonicalize(g)
    (n,) = [n for n in out.nodes if n.op.kind == "layer_norm"]
    assert n.op.eps == 2.0 ** -10 and out.count("reduce_mean") == 0
