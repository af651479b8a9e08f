"""Norm family specification: layer_norm, rms_norm, group_norm and inference batch_norm. Each
direct reference is checked against NumPy written here and against its own decomposition into
primitives; inference, errors naming the op, init hints and float64 mode are covered too."""
import numpy as np
import pytest

import braze as bz
from braze.interpret import decomposition_graph
from braze.ir.ops.norm import BatchNorm, GroupNorm, LayerNorm, RmsNorm

RNG = np.random.default_rng(3)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def run(g, outs, feeds, **kw):
    g.set_outputs(list(outs))
    return bz.interpret(g, feeds, **kw)


def check_decomposition(g, v, feeds_by_input):
    """The node's decomposition, interpreted on the same arrays, matches its direct reference;
    the decomposition uses no composite op."""
    node = g.node(v)
    arrays = [feeds_by_input[i] for i in node.inputs]
    dec = decomposition_graph(node.op, [g.shape_of(i) for i in node.inputs])
    assert not any(n.op.composite for n in dec.nodes)
    (via_dec,) = bz.interpret(dec, {f"x{i}": a for i, a in enumerate(arrays)})
    np.testing.assert_allclose(via_dec, node.op.reference(*arrays), rtol=1e-5, atol=1e-5)
    return dec


# -- layer_norm / rms_norm -----------------------------------------------------------------------
def np_layer_norm(a, axis, gamma, beta, eps):
    a = a.astype(np.float64)
    axes = tuple(range(axis % a.ndim, a.ndim))
    mu = a.mean(axis=axes, keepdims=True)
    var = ((a - mu) ** 2).mean(axis=axes, keepdims=True)
    y = (a - mu) / np.sqrt(var + eps)
    return y * (1.0 if gamma is None else gamma) + (0.0 if beta is None else beta)


@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("affine", ["none", "gamma", "beta", "both"])
def test_layer_norm_matches_numpy_and_its_decomposition(axis, affine):
    g = bz.Graph("ln")
    x = g.input("x", bz.Shape((2, 3, 4)))
    trailing = (3, 4) if axis == 1 else (4,)
    gamma = g.input("g", bz.Shape(trailing)) if affine in ("gamma", "both") else None
    beta = g.input("b", bz.Shape(trailing)) if affine in ("beta", "both") else None
    y = g.layer_norm(x, gamma, beta, eps=1e-3, axis=axis)
    assert g.node(y).op == LayerNorm(1e-3, axis % 3, gamma is not None, beta is not None)
    a, ga, ba = rand(2, 3, 4) * 3 + 1, rand(*trailing), rand(*trailing)
    ga = ga if gamma is not None else None
    ba = ba if beta is not None else None
    by_name = {k: v for k, v in (("x", a), ("g", ga), ("b", ba)) if v is not None}
    (out,) = run(g, [y], by_name)
    want = np_layer_norm(a, axis, ga, ba, 1e-3)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    by_input = {g.input_value(k): v for k, v in by_name.items()}
    dec = check_decomposition(g, y, by_input)
    assert dec.count("reduce_mean") == 2 and dec.count("rsqrt") == 1


def test_rms_norm_matches_numpy_and_its_decomposition():
    g = bz.Graph("rms")
    x = g.input("x", bz.Shape(("b", 8)))
    w = g.input("w", bz.Shape((8,)))
    b = g.input("bias", bz.Shape((8,)))
    y = g.rms_norm(x, w)
    yb = g.rms_norm(x, w, b, eps=1e-2)
    assert g.node(y).op == RmsNorm(1e-6, 1, True, False)
    a, wa, ba = rand(5, 8), rand(8), rand(8)
    oy, oyb = run(g, [y, yb], {"x": a, "w": wa, "bias": ba})
    a64 = a.astype(np.float64)
    ms = (a64 ** 2).mean(-1, keepdims=True)
    np.testing.assert_allclose(oy, a64 / np.sqrt(ms + 1e-6) * wa, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(oyb, a64 / np.sqrt(ms + 1e-2) * wa + ba, rtol=1e-5, atol=1e-6)
    dec = check_decomposition(g, yb, {x: a, w: wa, b: ba})
    assert dec.count("reduce_mean") == 1 and dec.count("sub") == 0


def test_layer_norm_inference_keeps_symbols_and_names_the_op_on_errors():
    g = bz.Graph("ln")
    x = g.input("x", bz.Shape(("batch", "seq", 16)))
    gamma = g.input("g", bz.Shape((16,)))
    assert g.shape_of(g.layer_norm(x, gamma)).dims == ("batch", "seq", 16)
    bad = g.input("bad", bz.Shape((8,)))
    with pytest.raises(bz.ShapeError, match=r"layer_norm gamma must have dims \(16,\)"):
        g.layer_norm(x, bad)
    with pytest.raises(bz.ShapeError, match=r"rms_norm beta must have dims \('seq', 16\)"):
        g.rms_norm(x, None, g.input("b2", bz.Shape((4, 16))), axis=1)
    with pytest.raises(bz.ShapeError, match="layer_norm: axis 3 is out of range"):
        g.layer_norm(x, axis=3)
    ints = g.input("i", bz.Shape((2, 4), bz.i32))
    with pytest.raises(bz.ShapeError, match="layer_norm needs a float input"):
        g.layer_norm(ints)


# -- group_norm / batch_norm ---------------------------------------------------------------------
def np_group_norm(a, groups, gamma, beta, eps):
    n, c = a.shape[:2]
    a = a.astype(np.float64)
    out = np.empty_like(a)
    per = c // groups
    for i in range(n):
        for k in range(groups):
            block = a[i, k * per:(k + 1) * per]
            out[i, k * per:(k + 1) * per] = (block - block.mean()) / np.sqrt(block.var() + eps)
    col = (c,) + (1,) * (a.ndim - 2)
    return out * gamma.reshape(col) + beta.reshape(col)


@pytest.mark.parametrize("shape", [(2, 6), (2, 6, 5), (2, 6, 3, 4)])
def test_group_norm_matches_numpy_and_its_decomposition(shape):
    g = bz.Graph("gn")
    x = g.input("x", bz.Shape(shape))
    gamma = g.input("g", bz.Shape((6,)))
    beta = g.input("b", bz.Shape((6,)))
    y = g.group_norm(x, 3, gamma, beta)
    assert g.node(y).op == GroupNorm(3, 1e-5, True, True)
    a, ga, ba = rand(*shape) * 2 + 0.5, rand(6), rand(6)
    (out,) = run(g, [y], {"x": a, "g": ga, "b": ba})
    np.testing.assert_allclose(out, np_group_norm(a, 3, ga, ba, 1e-5), rtol=1e-5, atol=1e-5)
    check_decomposition(g, y, {x: a, gamma: ga, beta: ba})


def test_group_norm_without_affine_and_with_symbolic_batch():
    g = bz.Graph("gn")
    x = g.input("x", bz.Shape(("n", 4, "h", "w")))
    y = g.group_norm(x, 2)
    assert g.shape_of(y).dims == ("n", 4, "h", "w")
    a = rand(2, 4, 3, 5)
    (out,) = run(g, [y], {"x": a})
    np.testing.assert_allclose(out, np_group_norm(a, 2, np.ones(4), np.zeros(4), 1e-5),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(bz.ShapeError, match="group_norm: 4 channels do not split into 3"):
        g.group_norm(x, 3)


def test_batch_norm_matches_numpy_and_its_decomposition():
    g = bz.Graph("bn")
    x = g.input("x", bz.Shape(("n", 3, 4, 4)))
    names = ("gamma", "beta", "mean", "var")
    stats = [g.input(n, bz.Shape((3,))) for n in names]
    y = g.batch_norm(x, *stats, eps=1e-3)
    assert g.node(y).op == BatchNorm(1e-3)
    a = rand(2, 3, 4, 4)
    gm, bt, mu, var = rand(3), rand(3), rand(3), np.abs(rand(3)) + 0.5
    (out,) = run(g, [y], {"x": a, "gamma": gm, "beta": bt, "mean": mu, "var": var})
    col = lambda v: v.astype(np.float64).reshape(1, 3, 1, 1)
    want = (a - col(mu)) / np.sqrt(col(var) + 1e-3) * col(gm) + col(bt)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    by_input = dict(zip((x, *stats), (a, gm, bt, mu, var)))
    check_decomposition(g, y, by_input)
    with pytest.raises(bz.ShapeError, match=r"batch_norm var must have dims \(3,\)"):
        g.batch_norm(x, *stats[:3], g.input("v4", bz.Shape((4,))))


# -- params, float64 -----------------------------------------------------------------------------
def test_init_params_draws_gamma_near_one_and_positive_variance():
    g = bz.Graph("hints")
    x = g.input("x", bz.Shape((2, 64, 3)))
    p = {n: g.param(n, bz.Shape((64,))) for n in ("gamma", "beta", "mean", "var")}
    y = g.batch_norm(x, p["gamma"], p["beta"], p["mean"], p["var"])
    lw = g.param("ln_w", bz.Shape((3,)))
    z = g.layer_norm(y, lw)
    g.set_outputs([z])
    params = bz.init_params(g, seed=0)
    assert abs(params["gamma"].mean() - 1.0) < 0.1 and abs(params["beta"].mean()) < 0.1
    assert (params["var"] > 0).all() and abs(params["mean"].mean()) < 0.1
    assert abs(params["ln_w"].mean() - 1.0) < 0.3
    assert LayerNorm(1e-5, 1, False, True).param_init_hint(1) is None


def test_float64_interpret_of_the_family():
    g = bz.Graph("f64")
    x = g.input("x", bz.Shape((2, 4, 3)))
    gamma = g.input("g", bz.Shape((3,)))
    y = g.rms_norm(g.group_norm(g.layer_norm(x, gamma), 2), gamma)
    a, ga = rand(2, 4, 3), rand(3)
    (o64,) = run(g, [y], {"x": a, "g": ga}, float64=True)
    (o32,) = run(g, [y], {"x": a, "g": ga})
    assert o64.dtype == np.float64
    ga64 = ga.astype(np.float64)
    ln = np_layer_norm(a, -1, ga64, None, 1e-5)
    gn = np_group_norm(ln, 2, np.ones(4), np.zeros(4), 1e-5)
    want = gn / np.sqrt((gn ** 2).mean(-1, keepdims=True) + 1e-6) * ga64
    np.testing.assert_allclose(o64, want, rtol=1e-10)
    np.testing.assert_allclose(o32, want, rtol=1e-4, atol=1e-5)
