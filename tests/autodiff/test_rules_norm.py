"""Gradient checks of the norm rules (closed-form backward ops in reverse mode, the
decomposition in forward mode): layer_norm, rms_norm, group_norm, inference batch_norm, each
against finite differences at order 1 and 2, and against torch.autograd."""
from __future__ import annotations

import numpy as np
import pytest
from check_grads import build, check_grads, random_feeds, weighted_loss

from braze.autodiff import grad_with_loss

ROWS = [
    ("layer_norm", lambda g, x, w, b: g.layer_norm(x, w, b, eps=1e-3), [(2, 3, 5), (5,), (5,)]),
    ("layer_norm_axis1", lambda g, x, w: g.layer_norm(x, w, axis=1, eps=1e-3),
     [(2, 3, 5), (3, 5)]),
    ("layer_norm_plain", lambda g, x: g.layer_norm(x), [(3, 7)]),
    ("rms_norm", lambda g, x, w, b: g.rms_norm(x, w, b, eps=1e-4), [(2, 3, 5), (5,), (5,)]),
    ("rms_norm_gamma", lambda g, x, w: g.rms_norm(x, w), [(3, 6), (6,)]),
    ("group_norm", lambda g, x, w, b: g.group_norm(x, 2, w, b, eps=1e-3),
     [(2, 4, 3, 3), (4,), (4,)]),
    ("group_norm_2d", lambda g, x: g.group_norm(x, 3), [(2, 6)]),
    ("batch_norm", lambda g, x, w, b, m, v: g.batch_norm(g.mul(x, 1.0), w, b, m, g.abs(v)),
     [(2, 3, 4, 3), (3,), (3,), (3,), (3,)]),
]


@pytest.mark.parametrize("name, fn, shapes", ROWS, ids=[r[0] for r in ROWS])
def test_norm_gradients_match_finite_differences(name, fn, shapes):
    check_grads(fn, shapes, order=2, rtol=1e-5, atol=1e-6, name=name)


def test_norm_reverse_mode_uses_the_backward_ops():
    g = build(lambda g, x, w, b: g.layer_norm(x, w, b), [(2, 5), (5,), (5,)])
    loss, _ = weighted_loss(g, 0)
    kinds = {n.op.kind for n in grad_with_loss(loss, ["x0", "x1", "x2"]).nodes}
    assert {"layer_norm_backward_input", "layer_norm_backward_gamma",
            "rms_norm_backward_beta"} <= kinds


def test_norm_gradients_match_torch():
    torch = pytest.importorskip("torch")
    shapes = [(2, 6, 5), (6,), (6,)]
    g = build(lambda g, x, w, b: g.group_norm(x, 3, w, b), shapes)
    loss, (r,) = weighted_loss(g, 0)
    feeds = random_feeds(shapes, 0)
    import braze as bz

    got = bz.interpret(grad_with_loss(loss, ["x0", "x1", "x2"]), feeds, float64=True)[1:]
    ts = [torch.tensor(feeds[f"x{i}"], requires_grad=True) for i in range(3)]
    (torch.nn.functional.group_norm(ts[0], 3, ts[1], ts[2]) * torch.tensor(r)).sum().backward()
    for a, t in zip(got, ts):
        np.testing.assert_allclose(a, t.grad.numpy(), rtol=1e-9, atol=1e-10)
