"""softmax_cross_entropy's VJP against torch.autograd (class indices and probability rows that
need not sum to 1, every reduction), its hvp against differences of gradients, and the label
check the gradient graph keeps."""
from __future__ import annotations

import numpy as np
import pytest

import braze as bz
from braze.autodiff import grad_with_loss, hvp
from braze.errors import InterpretError

torch = pytest.importorskip("torch")
RNG = np.random.default_rng(0)
LOGITS = RNG.normal(size=(2, 3, 5))
INDICES = np.array([[1, 0, 4], [2, 2, 3]])
PROBS = np.abs(RNG.normal(size=(2, 3, 5)))


def _loss_graph(labels: np.ndarray, reduction: str) -> bz.Graph:
    g = bz.Graph("xent")
    x = g.input("x", bz.Shape(LOGITS.shape, bz.f64))
    dt = bz.f64 if labels.dtype.kind == "f" else bz.i64
    lab = g.input("labels", bz.Shape(labels.shape, dt))
    loss = g.softmax_cross_entropy(x, lab, reduction)
    w = RNG.normal(size=LOGITS.shape[:-1]) if reduction == "none" else np.ones(())
    g.set_outputs([g.sum(g.mul(loss, g.constant(w, bz.f64)))])
    return g, w


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("labels", [INDICES, PROBS], ids=["indices", "probabilities"])
def test_gradients_match_torch(labels, reduction):
    g, w = _loss_graph(labels, reduction)
    soft = labels.dtype.kind == "f"
    wrt = ["x", "labels"] if soft else ["x"]
    got = bz.interpret(grad_with_loss(g, wrt), {"x": LOGITS, "labels": labels})[1:]
    x = torch.tensor(LOGITS, requires_grad=True)
    lab = torch.tensor(labels, requires_grad=soft)
    per = torch.nn.functional.cross_entropy(x.permute(0, 2, 1), lab.permute(0, 2, 1) if soft
                                            else lab, reduction=reduction)
    (per * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(got[0], x.grad.numpy(), rtol=1e-10, atol=1e-12)
    if soft:
        np.testing.assert_allclose(got[1], lab.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_hvp_matches_differences_of_gradients():
    g, _ = _loss_graph(INDICES, "mean")
    v = RNG.normal(size=LOGITS.shape)
    got = bz.interpret(hvp(g, ["x"]), {"x": LOGITS, "labels": INDICES, "tangent_x": v})[0]
    grads = grad_with_loss(g, ["x"])
    ends = [bz.interpret(grads, {"x": LOGITS + s * 1e-6 * v, "labels": INDICES})[1]
            for s in (1, -1)]
    np.testing.assert_allclose(got, (ends[0] - ends[1]) / 2e-6, rtol=1e-6, atol=1e-8)


def test_a_label_outside_the_classes_is_an_error_in_the_gradient_graph_too():
    """The gradient graph differentiated the one-hot decomposition, which reads a label
    outside [0, C) (torch's ignore_index -100) as no class: a loss and gradients came back
    where the forward graph raises."""
    g, _ = _loss_graph(INDICES, "mean")
    bad = INDICES.copy()
    bad[0, 1] = -100
    with pytest.raises(InterpretError, match=r"class labels must lie in \[0, 5\)"):
        bz.interpret(grad_with_loss(g, ["x"]), {"x": LOGITS, "labels": bad})
