"""Custom functions: the reference is fwd_body; grad_with_loss uses a vjp_body that differs from
the true derivative (straight-through, clipped gradient); jvp uses jvp_body; without overrides
the op is inlined and differentiates like the plain function; multi-output form; bad bodies are
rejected by name; printing and save/load keep the bodies."""
from __future__ import annotations

import numpy as np
import pytest

import braze as bz
from braze.autodiff import grad_with_loss, jvp, prepare_graph_for_ad, vmap
from braze.errors import GraphError, ShapeError
from tests.autodiff.check_grads import check_grads

S = (4,)


def body(name, n_in, fn, shape=S, dtype=bz.f64):
    g = bz.Graph(name)
    ins = [g.input(f"in{i}", bz.Shape(shape, dtype)) for i in range(n_in)]
    out = fn(g, *ins)
    g.set_outputs(list(out) if isinstance(out, tuple) else [out])
    return g


ROUND = body("round", 1, lambda b, x: b.floor(b.add(x, 0.5)))
STRAIGHT_THROUGH = body("st", 3, lambda b, x, y, ct: ct)
TANH = body("tanh", 1, lambda b, x: b.tanh(x))
CLIPPED = body("clip", 3, lambda b, x, y, ct: b.clamp(b.mul(ct, b.sub(1.0, b.mul(y, y))),
                                                         -0.1, 0.1))


def loss_of(fn):
    g = bz.Graph("loss")
    x = g.input("x", bz.Shape(S, bz.f64))
    w = g.param("w", bz.Shape(S, bz.f64))
    g.set_outputs([g.sum(g.mul(fn(g, g.mul(x, w)), w))])
    return g


def _grads(g, wrt=("x",), seed=0):
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.normal(size=S) * 2}
    params = {"w": rng.normal(size=S)}
    return feeds, params, bz.interpret(grad_with_loss(g, list(wrt)), feeds, params)


def test_straight_through_estimator_is_the_gradient():
    g = loss_of(lambda g, v: g.custom_fn([v], ROUND, vjp_body=STRAIGHT_THROUGH))
    feeds, params, (loss, dx) = _grads(g)
    w = params["w"]
    np.testing.assert_allclose(loss, np.sum(np.floor(feeds["x"] * w + 0.5) * w))
    np.testing.assert_allclose(dx, w * w)  # identity VJP through the rounding
    plain = loss_of(lambda g, v: g.floor(g.add(v, 0.5)))
    assert np.all(_grads(plain)[2][1] == 0)  # the true derivative is zero


def test_clipped_gradient_is_used_and_differs_from_the_true_one():
    g = loss_of(lambda g, v: g.custom_fn([v], TANH, vjp_body=CLIPPED))
    feeds, params, (_, dx) = _grads(g)
    w, x = params["w"], feeds["x"]
    true_ct = w * (1 - np.tanh(x * w) ** 2)
    np.testing.assert_allclose(dx, np.clip(true_ct, -0.1, 0.1) * w)
    assert not np.allclose(dx, true_ct * w)


def test_without_overrides_it_is_inlined_and_matches_the_plain_function():
    custom = loss_of(lambda g, v: g.custom_fn(v, TANH))
    assert prepare_graph_for_ad(custom).count("custom_fn") == 0
    plain = loss_of(lambda g, v: g.tanh(v))
    for a, b in zip(_grads(custom, ("x", "w"))[2], _grads(plain, ("x", "w"))[2]):
        np.testing.assert_allclose(a, b)
    check_grads(lambda g, x: g.custom_fn([x], TANH), [S], order=2)


def test_jvp_body_drives_forward_mode_and_is_transposed_for_reverse_mode():
    # tangent rule 3 * t: deliberately not tanh's derivative, so its use is visible
    scaled = body("jvp", 2, lambda b, x, t: b.mul(t, 3.0))
    g = bz.Graph("f")
    x = g.input("x", bz.Shape(S, bz.f64))
    g.set_outputs([g.custom_fn([x], TANH, jvp_body=scaled)])
    v = np.arange(4.0)
    t = np.ones(4)
    out = bz.interpret(jvp(g, ["x"]), {"x": v, "tangent_x": t})
    np.testing.assert_allclose(out[0], np.tanh(v))
    np.testing.assert_allclose(out[1], 3 * t)
    loss = bz.Graph("l")
    lx = loss.input("x", bz.Shape(S, bz.f64))
    loss.set_outputs([loss.sum(loss.custom_fn([lx], TANH, jvp_body=scaled))])
    np.testing.assert_allclose(bz.interpret(grad_with_loss(loss, ["x"]), {"x": v})[1],
                               np.full(4, 3.0))


def test_multi_output_custom_fn_with_a_vjp():
    fwd = body("sincos", 2, lambda b, x, y: (b.mul(x, y), b.add(x, y)))
    # the true VJP of (x*y, x+y): (ct0*y + ct1, ct0*x + ct1), halved to show it is used
    vjp_b = body("sincos_vjp", 6, lambda b, x, y, o0, o1, c0, c1: (
        b.mul(b.add(b.mul(c0, y), c1), 0.5), b.mul(b.add(b.mul(c0, x), c1), 0.5)))
    g = bz.Graph("m")
    x = g.input("x", bz.Shape(S, bz.f64))
    y = g.input("y", bz.Shape(S, bz.f64))
    p, s = g.custom_fn([x, y], fwd, vjp_body=vjp_b)
    g.set_outputs([g.sum(g.add(g.mul(p, 2.0), s))])
    rng = np.random.default_rng(1)
    feeds = {"x": rng.normal(size=S), "y": rng.normal(size=S)}
    loss, dx, dy = bz.interpret(grad_with_loss(g, ["x", "y"]), feeds)
    np.testing.assert_allclose(loss, np.sum(2 * feeds["x"] * feeds["y"] + feeds["x"]
                                            + feeds["y"]))
    np.testing.assert_allclose(dx, 0.5 * (2 * feeds["y"] + 1))
    np.testing.assert_allclose(dy, 0.5 * (2 * feeds["x"] + 1))


def test_a_transposed_jvp_body_whose_output_ignores_an_input():
    """Reverse mode through a jvp_body only: when the used output's tangent does not read an
    input's tangent, that input's cotangent is zero; it crashed building the gradient graph
    ("None is not a value of graph")."""
    fwd = body("f", 2, lambda b, x, y: (b.mul(b.sin(x), y), b.exp(x)))
    jvp_b = body("j", 4, lambda b, x, y, tx, ty: (
        b.add(b.mul(tx, b.mul(b.cos(x), y)), b.mul(ty, b.sin(x))), b.mul(tx, b.exp(x))))
    g = bz.Graph("second_only")
    x = g.input("x", bz.Shape(S, bz.f64))
    y = g.input("y", bz.Shape(S, bz.f64))
    g.set_outputs([g.sum(g.custom_fn([x, y], fwd, jvp_body=jvp_b)[1])])
    v = np.arange(4.0) / 4
    _, dx, dy = bz.interpret(grad_with_loss(g, ["x", "y"]), {"x": v, "y": np.ones(4)})
    np.testing.assert_allclose(dx, np.exp(v))
    np.testing.assert_array_equal(dy, 0.0)


def test_bad_bodies_are_rejected_by_name():
    g = bz.Graph("bad")
    x = g.input("x", bz.Shape(S, bz.f64))
    with pytest.raises(ShapeError, match="vjp_body 'st' takes 3 inputs"):
        g.custom_fn([x], body("two", 2, lambda b, a, c: b.add(a, c)), vjp_body=STRAIGHT_THROUGH)
    with pytest.raises(ShapeError, match="fwd_body 'tanh' input 0 'in0' is f64\\[4\\]"):
        g.custom_fn([g.input("y", bz.Shape((5,), bz.f64))], TANH)
    wrong = body("wrong", 3, lambda b, x, y, ct: b.sum(ct))
    with pytest.raises(ShapeError, match="one cotangent per input"):
        g.custom_fn([x], TANH, vjp_body=wrong)
    with_param = bz.Graph("p")
    with_param.set_outputs([with_param.add(with_param.input("in0", bz.Shape(S, bz.f64)),
                                           with_param.param("w", bz.Shape(S, bz.f64)))])
    with pytest.raises(GraphError, match="pass weights in as inputs"):
        g.custom_fn([x], with_param)


def test_custom_fn_prints_parses_saves_and_vmaps(tmp_path):
    g = loss_of(lambda g, v: g.custom_fn([v], TANH, vjp_body=CLIPPED))
    assert bz.Graph.parse(str(g)) == g
    bz.save(g, tmp_path / "c.json")
    assert bz.load(tmp_path / "c.json") == g
    f = bz.Graph("f")
    f.set_outputs([f.custom_fn([f.input("x", bz.Shape(S, bz.f64))], TANH, vjp_body=CLIPPED)])
    xs = np.random.default_rng(2).normal(size=(3, 4))
    np.testing.assert_allclose(bz.interpret(vmap(f), {"x": xs})[0], np.tanh(xs))
