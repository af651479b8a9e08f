"""Gradient checks of the matrix-product and data-movement rules: one row per op variant
(order 2 where the op is bilinear or linear), reverse and forward mode against finite
differences, hvp at order 2."""
from __future__ import annotations

import numpy as np
import pytest
from check_grads import build, check_grads, random_feeds, weighted_loss

import braze as bz
from braze.autodiff import grad_with_loss

ROWS = [
    ("matmul", lambda g, a, b: g.mm(a, b), [(3, 4), (4, 2)], 2),
    ("matmul_batched_broadcast", lambda g, a, b: g.mm(a, b), [(2, 3, 4), (4, 5)], 2),
    ("matmul_batch_bcast_both", lambda g, a, b: g.mm(a, b), [(2, 1, 3, 4), (3, 4, 2)], 2),
    ("matmul_vec_mat", lambda g, a, b: g.mm(a, b), [(4,), (2, 4, 3)], 2),
    ("matmul_mat_vec", lambda g, a, b: g.mm(a, b), [(3, 4), (4,)], 2),
    ("matmul_vec_vec", lambda g, a, b: g.mm(a, b), [(4,), (4,)], 2),
    ("dot_general_batch", lambda g, a, b: g.dot_general(a, b, (2,), (1,), (0,), (0,)),
     [(2, 3, 4), (2, 4, 5)], 2),
    ("dot_general_odd_layout", lambda g, a, b: g.dot_general(a, b, (0, 3), (2, 0), (1,), (1,)),
     [(3, 2, 5, 4), (4, 2, 3)], 2),
    ("reshape", lambda g, x: g.reshape(x, (3, -1)), [(2, 3, 2)], 1),
    ("transpose", lambda g, x: g.transpose(x, (2, 0, 1)), [(2, 3, 4)], 1),
    ("narrow", lambda g, x: g.narrow(x, 1, 1, 2), [(2, 4)], 1),
    ("slice_step", lambda g, x: g.slice(x, 1, 1, 7, 2), [(2, 8)], 1),
    ("slice_negative_step", lambda g, x: g.slice(x, 1, 6, 0, -2), [(2, 8)], 1),
    ("slice_reverse", lambda g, x: g.slice(x, 0, -1, -6, -1), [(5, 2)], 1),
    ("concat", lambda g, a, b: g.concat([a, b, a], 1), [(2, 3), (2, 1)], 1),
    ("split", lambda g, x: g.split(x, 1, (1, 3, 2))[::2], [(2, 6)], 1),
    ("expand", lambda g, x: g.expand(x, (4, 2, 3)), [(2, 1)], 1),
    ("pad_constant", lambda g, x: g.pad(x, ((1, 0), (2, 1)), 0.5), [(2, 3)], 1),
    ("pad_edge", lambda g, x: g.pad(x, ((2, 1), (0, 3)), mode="edge"), [(3, 4)], 1),
    ("pad_reflect", lambda g, x: g.pad(x, ((2, 1), (3, 2)), mode="reflect"), [(3, 5)], 1),
    ("trilu", lambda g, x: g.trilu(x, upper=False, k=1), [(2, 3, 4)], 1),
    ("squeeze_unsqueeze", lambda g, x: g.unsqueeze(g.squeeze(x, 1), 0), [(2, 1, 3)], 1),
    ("mlp_like_chain", lambda g, x, w: g.tanh(g.mm(g.transpose(x, (1, 0)), w)),
     [(4, 3), (4, 2)], 2),
]


@pytest.mark.parametrize("name,fn,shapes,order", ROWS, ids=[r[0] for r in ROWS])
def test_linalg_and_shape_rule(name, fn, shapes, order):
    check_grads(fn, shapes, order=order, name=name)


def test_symbolic_dims_survive_reverse_mode():
    g = bz.Graph("sym")
    x = g.input("x", bz.Shape(("batch", 3), bz.f64))
    w = g.param("w", bz.Shape((3, 2), bz.f64))
    y = g.narrow(g.concat([g.mm(x, w), g.mm(x, w)], 1), 1, 1, 2)
    g.set_outputs([g.mean(g.mul(y, g.expand(g.reshape(g.sum(w, 0), (1, 2)), ("batch", 2))))])
    gg = grad_with_loss(g, ["x", "w"])
    assert gg.shape_of(gg.outputs[1]).dims == ("batch", 3)
    bz.verify(gg)
    rng = np.random.default_rng(0)
    w_val = rng.normal(size=(3, 2))
    for batch in (2, 5):
        xv = rng.normal(size=(batch, 3))
        got = bz.interpret(gg, {"x": xv}, {"w": w_val}, float64=True)
        eps = 1e-6
        want = np.zeros_like(xv)
        for idx in np.ndindex(xv.shape):
            d = np.zeros_like(xv)
            d[idx] = eps
            f = lambda v: bz.interpret(g, {"x": v}, {"w": w_val}, float64=True)[0]  # noqa
            want[idx] = (f(xv + d) - f(xv - d)) / (2 * eps)
        np.testing.assert_allclose(got[1], want, rtol=1e-6, atol=1e-8)


def test_matmul_gradient_matches_torch():
    torch = pytest.importorskip("torch")
    shapes = [(2, 1, 3, 4), (3, 4, 2)]
    g = build(lambda g, a, b: g.mm(a, b), shapes)
    feeds = random_feeds(shapes, 5)
    loss, (r,) = weighted_loss(g, 5)
    got = bz.interpret(grad_with_loss(loss, ["x0", "x1"]), feeds, float64=True)[1:]
    a = torch.tensor(feeds["x0"], requires_grad=True)
    b = torch.tensor(feeds["x1"], requires_grad=True)
    ((a @ b) * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(got[0], a.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(got[1], b.grad.numpy(), rtol=1e-12)
