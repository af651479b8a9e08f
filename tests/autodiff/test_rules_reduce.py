"""Gradient checks of the reduction rules (sum, mean, max, min, prod over axes, with and without
keepdims), softmax, log_softmax and cumsum: reverse and forward mode against finite differences,
order 2 where the function is smooth; softmax and log_softmax against torch.autograd."""
from __future__ import annotations

import numpy as np
import pytest
from check_grads import build, check_grads, random_feeds, weighted_loss

import braze as bz
from braze.autodiff import grad_with_loss

S = (2, 3, 4)
ROWS = [
    ("sum_axes", lambda g, x: g.sum(x, (0, 2)), 2),
    ("sum_keepdims", lambda g, x: g.sum(x, 1, keepdims=True), 2),
    ("sum_all", lambda g, x: g.sum(x), 2),
    ("mean", lambda g, x: g.mean(x, (1, 2)), 2),
    ("mean_keepdims", lambda g, x: g.mean(x, 0, keepdims=True), 2),
    ("max", lambda g, x: g.reduce_max(x, 2), 1),
    ("min_keepdims", lambda g, x: g.reduce_min(x, (0, 1), keepdims=True), 1),
    ("prod", lambda g, x: g.prod(x, 1), 2),
    ("softmax_last", lambda g, x: g.softmax(x, -1), 2),
    ("softmax_mid", lambda g, x: g.softmax(x, 1), 2),
    ("log_softmax", lambda g, x: g.log_softmax(x, 2), 2),
    ("cumsum", lambda g, x: g.cumsum(x, 2), 1),
    ("cumsum_exclusive_reverse", lambda g, x: g.cumsum(x, 1, exclusive=True, reverse=True), 1),
    ("softmax_of_square", lambda g, x: g.softmax(g.square(x), 0), 2),
]


@pytest.mark.parametrize("name,fn,order", ROWS, ids=[r[0] for r in ROWS])
def test_reduce_rule(name, fn, order):
    check_grads(fn, [S], order=order, name=name)


def test_max_ties_share_the_cotangent():
    feeds = {"x0": np.array([[1.0, 3.0, 3.0], [2.0, 0.0, -1.0]])}
    loss = bz.Graph("l")
    x = loss.input("x0", bz.Shape((2, 3), bz.f64))
    loss.set_outputs([loss.sum(loss.reduce_max(x, 1))])
    got = bz.interpret(grad_with_loss(loss, ["x0"]), feeds, float64=True)[1]
    np.testing.assert_array_equal(got, [[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
def test_softmax_gradient_matches_torch(kind):
    torch = pytest.importorskip("torch")
    g = build(lambda g, x: getattr(g, kind)(x, 1), [S])
    feeds = random_feeds([S], 4)
    loss, (r,) = weighted_loss(g, 4)
    got = bz.interpret(grad_with_loss(loss, ["x0"]), feeds, float64=True)[1]
    x = torch.tensor(feeds["x0"], requires_grad=True)
    (getattr(torch, kind)(x, 1) * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(got, x.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_softmax_uses_its_rule_not_its_decomposition():
    g = build(lambda g, x: g.softmax(x, -1), [S])
    gg = grad_with_loss(weighted_loss(g, 0)[0], ["x0"])
    assert gg.count("reduce_max") == 0 and gg.count("softmax") == 1


def test_prod_gradient_at_zeros_matches_torch():
    """d prod / d x_i is the product of the other elements, also where the slice holds zeros
    (one zero: nonzero at the zero only; two zeros: all zero), in both modes; not 0 / 0."""
    torch = pytest.importorskip("torch")
    xv = np.array([[1.0, 0.0, 3.0, 2.0], [2.0, 0.0, 0.0, 1.0], [1.5, -2.0, 0.5, 1.0]])
    g = build(lambda g, x: g.prod(x, 1, keepdims=True), [(3, 4)])
    loss, (r,) = weighted_loss(g, 0)
    (got,) = bz.interpret(grad_with_loss(loss, ["x0"]), {"x0": xv})[1:]
    t = torch.tensor(xv, requires_grad=True)
    (torch.prod(t, 1, keepdim=True) * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-12, atol=1e-12)
    tan = np.random.default_rng(3).normal(size=xv.shape)
    from braze.autodiff import jvp
    _, tout = bz.interpret(jvp(g, ["x0"]), {"x0": xv, "tangent_x0": tan})
    want = [[sum(tan[i, j] * np.prod(np.delete(xv[i], j)) for j in range(4))] for i in range(3)]
    np.testing.assert_allclose(tout, np.array(want), rtol=1e-12, atol=1e-12)
