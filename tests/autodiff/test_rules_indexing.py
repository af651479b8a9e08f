"""Gradient checks of the indexing rules: gather (repeated and negative indices, a matrix of
indices, an embedding-style lookup, against torch), gather_elements (indices shorter than the
data off the axis) and top_k values. Reverse and forward mode against finite differences."""
from __future__ import annotations

import numpy as np
import pytest
from check_grads import build, check_grads, random_feeds, weighted_loss

import braze as bz
from braze.autodiff import grad_with_loss


def _idx(g, a):
    return g.constant(np.array(a, np.int64))


ROWS = [
    ("gather_axis0", lambda g, x: g.gather(x, _idx(g, [3, 0, 3, -1]), 0), [(5, 3)], 2),
    ("gather_matrix_axis1", lambda g, x: g.gather(x, _idx(g, [[1, 1], [0, -3]]), 1),
     [(2, 4, 3)], 2),
    ("gather_elements", lambda g, x: g.gather_elements(x, _idx(g, [[0, 2], [1, -1], [2, 2]]), 1),
     [(4, 3)], 2),
    ("gather_elements_axis0",
     lambda g, x: g.gather_elements(x, _idx(g, [[[1], [0]], [[1], [1]]]), 0), [(2, 3, 2)], 2),
    ("top_k_values", lambda g, x: g.top_k(x, 2, axis=1)[0], [(3, 5)], 1),
    ("top_k_smallest_axis0", lambda g, x: g.top_k(x, 2, axis=0, largest=False)[0], [(4, 3)], 1),
]


@pytest.mark.parametrize("name, fn, shapes, order", ROWS, ids=[r[0] for r in ROWS])
def test_indexing_gradients_match_finite_differences(name, fn, shapes, order):
    check_grads(fn, shapes, order=order, rtol=1e-5, atol=1e-6, name=name)


def test_embedding_gradient_uses_gather_backward_and_matches_torch():
    torch = pytest.importorskip("torch")
    ids = np.array([[1, 4, 1], [0, 2, 4]])
    g = build(lambda g, table: g.gather(table, _idx(g, ids), 0), [(5, 3)])
    loss, (r,) = weighted_loss(g, 0)
    grads = grad_with_loss(loss, ["x0"])
    assert any(n.op.kind == "gather_backward" for n in grads.nodes)
    feeds = random_feeds([(5, 3)], 0)
    (got,) = bz.interpret(grads, feeds, float64=True)[1:]
    t = torch.tensor(feeds["x0"], requires_grad=True)
    (torch.nn.functional.embedding(torch.tensor(ids), t) * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("kind", ["gather_elements", "top_k"])
def test_scatter_back_with_symbolic_batch(kind):
    """gather_elements / top_k cotangents over a symbolic batch dim (a cross-entropy imported
    with a dynamic batch): the dims compare by name instead of being subtracted."""
    g = bz.Graph("sym")
    x = g.input("x", bz.Shape(("batch", 5), bz.f64))
    if kind == "gather_elements":
        idx = g.input("idx", bz.Shape(("batch", 2), bz.i64))
        y = g.gather_elements(x, idx, 1)
    else:
        y = g.top_k(x, 2, axis=1)[0]
    g.set_outputs([g.sum(g.mul(y, y))])
    xv = np.random.default_rng(0).normal(size=(3, 5))
    iv = np.array([[1, 4], [0, 0], [3, 2]])
    feeds = {"x": xv, **({"idx": iv} if kind == "gather_elements" else {})}
    _, dx = bz.interpret(grad_with_loss(g, ["x"]), feeds)
    picked = iv if kind == "gather_elements" else np.argsort(-xv, 1)[:, :2]
    want = np.zeros_like(xv)
    for i in range(3):
        for j in picked[i]:
            want[i, j] += 2 * xv[i, j]
    np.testing.assert_allclose(dx, want, rtol=1e-12)
