"""Gradient checks of the elementwise rules: one row per function (arity, order, domain,
tolerance), reverse and forward mode against finite differences, order 2 through hvp; unary
activations also against torch.autograd."""
from __future__ import annotations

import numpy as np
import pytest
from check_grads import build, check_grads, random_feeds, weighted_loss

import braze as bz
from braze.autodiff import grad_with_loss

S = (2, 3)
# (name, builder, shapes, order, domain)
ROWS = [
    ("gelu", lambda g, x: g.gelu(x), [S], 2, "real"),
    ("gelu_approx", lambda g, x: g.gelu_approx(x), [S], 2, "real"),
    ("silu", lambda g, x: g.silu(x), [S], 2, "real"),
    ("quick_gelu", lambda g, x: g.quick_gelu(x), [S], 2, "real"),
    ("hard_swish", lambda g, x: g.hard_swish(x), [S], 1, "real"),
    ("relu", lambda g, x: g.relu(x), [S], 1, "real"),
    ("sigmoid", lambda g, x: g.sigmoid(x), [S], 2, "real"),
    ("tanh", lambda g, x: g.tanh(x), [S], 2, "real"),
    ("exp", lambda g, x: g.exp(x), [S], 2, "real"),
    ("log", lambda g, x: g.log(x), [S], 2, "positive"),
    ("sqrt", lambda g, x: g.sqrt(x), [S], 2, "positive"),
    ("rsqrt", lambda g, x: g.rsqrt(x), [S], 2, "positive"),
    ("neg", lambda g, x: g.neg(x), [S], 2, "real"),
    ("abs", lambda g, x: g.abs(x), [S], 1, "real"),
    ("sin", lambda g, x: g.sin(x), [S], 2, "real"),
    ("cos", lambda g, x: g.cos(x), [S], 2, "real"),
    ("erf", lambda g, x: g.erf(x), [S], 2, "real"),
    ("square", lambda g, x: g.square(x), [S], 2, "real"),
    ("reciprocal", lambda g, x: g.reciprocal(x), [S], 2, "positive"),
    ("tan", lambda g, x: g.tan(x), [S], 2, "unit"),
    ("asin", lambda g, x: g.asin(x), [S], 2, "unit"),
    ("acos", lambda g, x: g.acos(x), [S], 2, "unit"),
    ("atan", lambda g, x: g.atan(x), [S], 2, "real"),
    ("sinh", lambda g, x: g.sinh(x), [S], 2, "real"),
    ("cosh", lambda g, x: g.cosh(x), [S], 2, "real"),
    ("asinh", lambda g, x: g.asinh(x), [S], 2, "real"),
    ("acosh", lambda g, x: g.acosh(x), [S], 2, "above_one"),
    ("atanh", lambda g, x: g.atanh(x), [S], 2, "unit"),
    ("add_broadcast", lambda g, a, b: g.add(a, b), [(2, 3), (3,)], 2, "real"),
    ("sub_broadcast", lambda g, a, b: g.sub(a, b), [(2, 1), (1, 3)], 2, "real"),
    ("mul_broadcast", lambda g, a, b: g.mul(a, b), [(4, 2, 3), (2, 1)], 2, "real"),
    ("div", lambda g, a, b: g.div(a, b), [S, S], 2, "positive"),
    ("max", lambda g, a, b: g.maximum(a, b), [S, S], 1, "real"),
    ("min", lambda g, a, b: g.minimum(a, b), [S, (3,)], 1, "real"),
    ("pow", lambda g, a, b: g.pow(a, b), [S, S], 2, "positive"),
    ("pow_const", lambda g, a: g.pow(a, 3.0), [S], 2, "real"),
    ("mod", lambda g, a, b: g.mod(a, b), [S, S], 1, "positive"),
    ("fmod", lambda g, a, b: g.fmod(a, b), [S, S], 1, "positive"),
    ("where", lambda g, a, b: g.where(g.gt(a, 0.0), a, b), [S, (3,)], 2, "real"),
    ("leaky_relu", lambda g, x: g.leaky_relu(x, 0.2), [S], 1, "real"),
    ("clamp", lambda g, x: g.clamp(x, -0.5, 0.7), [S], 1, "real"),
    ("cast_f32_roundtrip", lambda g, x: g.cast(g.cast(x, bz.f32), bz.f64), [S], 1, "real"),
    ("floor_zero_grad", lambda g, x: g.add(g.floor(x), x), [S], 1, "real"),
]


@pytest.mark.parametrize("name,fn,shapes,order,domain", ROWS, ids=[r[0] for r in ROWS])
def test_elementwise_rule(name, fn, shapes, order, domain):
    tol = 1e-3 if name == "cast_f32_roundtrip" else 1e-5
    check_grads(fn, shapes, order=order, domain=domain, rtol=tol, atol=tol, name=name)


TORCH_UNARY = ["gelu", "silu", "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "abs",
               "sin", "cos", "erf", "square", "reciprocal", "hard_swish", "gelu_approx"]


@pytest.mark.parametrize("fn", TORCH_UNARY)
def test_unary_gradient_matches_torch(fn):
    torch = pytest.importorskip("torch")
    funcs = {"gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
             "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
             "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
             "abs": torch.abs, "sin": torch.sin, "cos": torch.cos, "erf": torch.erf,
             "square": torch.square, "reciprocal": torch.reciprocal,
             "hard_swish": torch.nn.functional.hardswish,
             "gelu_approx": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}
    positive = fn in ("log", "sqrt", "rsqrt", "reciprocal")
    g = build(lambda g, x: g.activation(x, fn), [(3, 4)], fn)
    feeds = random_feeds([(3, 4)], 3, "positive" if positive else "real")
    feeds["x0"][0, 0] = 4.0  # hard_swish's upper branch
    loss, (r,) = weighted_loss(g, 3)
    got = bz.interpret(grad_with_loss(loss, ["x0"]), feeds, float64=True)[1]
    x = torch.tensor(feeds["x0"], requires_grad=True)
    (funcs[fn](x) * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(got, x.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_compare_and_integer_paths_carry_no_gradient():
    g = build(lambda g, x: g.mul(x, g.cast(g.gt(x, 0.0), bz.f64)), [S])
    gg = grad_with_loss(weighted_loss(g, 0)[0], ["x0"])
    feeds = random_feeds([S], 0)
    _, r = weighted_loss(g, 0)
    got = bz.interpret(gg, feeds, float64=True)[1]
    np.testing.assert_allclose(got, r[0] * (feeds["x0"] > 0))


def test_pow_gradient_at_a_zero_base_is_torchs_not_nan():
    # d/da is 0 where the exponent is 0; d/dc is 0 where the base is 0 and the exponent >= 0
    torch = pytest.importorskip("torch")
    a = np.array([0.0, 0.0, 0.0, 2.0, -1.5, 3.0])
    c = np.array([0.0, 2.0, 0.5, 0.5, 3.0, -1.0])
    g = build(lambda g, x, e: g.pow(x, e), [a.shape, c.shape])
    loss, (r,) = weighted_loss(g, 0)
    got = bz.interpret(grad_with_loss(loss, ["x0", "x1"]), {"x0": a, "x1": c})[1:]
    at, ct = (torch.tensor(v, requires_grad=True) for v in (a, c))
    (at.pow(ct) * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(got[0], at.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(got[1], ct.grad.numpy(), rtol=1e-12)
    zero_exp = build(lambda g, x: g.pow(x, g.constant(np.array([0.0, 2.0]), bz.f64)), [(2,)])
    grads = grad_with_loss(weighted_loss(zero_exp, 0)[0], ["x0"])
    assert np.all(np.isfinite(bz.interpret(grads, {"x0": np.zeros(2)})[1]))


def test_leaky_relu_slope_at_zero_is_alpha_like_relu_and_torch():
    g = build(lambda g, x: g.sum(g.leaky_relu(x, 0.1)), [(3,)])
    got = bz.interpret(grad_with_loss(g, ["x0"]), {"x0": np.array([0.0, 2.0, -2.0])})[1]
    np.testing.assert_allclose(got, [0.1, 1.0, 0.1])


def test_maximum_and_minimum_share_a_tie_evenly_like_torch():
    """Ties gave the whole cotangent to the first operand, so min(0, x) - log1p(exp(-|x|))
    (torch's own decomposition of logsigmoid) had derivative 0 at x = 0 instead of 0.5."""
    torch = pytest.importorskip("torch")
    a = np.array([0.0, 1.0, -2.0, 2.0, 0.0])
    c = np.array([0.0, 1.0, -2.0, 3.0, -1.0])
    for fn, tfn in (("max", torch.maximum), ("min", torch.minimum)):
        g = build(lambda g, x, y, fn=fn: g.binary(x, y, fn), [a.shape, c.shape])
        loss, (r,) = weighted_loss(g, 0)
        got = bz.interpret(grad_with_loss(loss, ["x0", "x1"]), {"x0": a, "x1": c})[1:]
        at, ct = (torch.tensor(v, requires_grad=True) for v in (a, c))
        (tfn(at, ct) * torch.tensor(r)).sum().backward()
        np.testing.assert_allclose(got[0], at.grad.numpy(), err_msg=fn)
        np.testing.assert_allclose(got[1], ct.grad.numpy(), err_msg=fn)
    log_sigmoid = build(lambda g, x: g.sum(g.sub(g.minimum(g.constant(np.array(0.0), bz.f64), x),
                                                 g.log(g.add(g.exp(g.neg(g.abs(x))), 1.0)))),
                        [(1,)])
    got = bz.interpret(grad_with_loss(log_sigmoid, ["x0"]), {"x0": np.zeros(1)})[1]
    np.testing.assert_allclose(got, 0.5)
