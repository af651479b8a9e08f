"""softmax_cross_entropy with `ignore_index` against torch's `F.cross_entropy(ignore_index=)`
(the loss, every reduction, the gradient, an ignore_index inside and outside the classes, every
row ignored), through the interpreter, the decomposition and the compiled executor; and labels
outside [0, C) are an error in the compiled loss and gradient, never a silent number."""
from __future__ import annotations

import numpy as np
import pytest

import braze as bz
from braze.autodiff import grad_with_loss
from braze.errors import InterpretError

torch = pytest.importorskip("torch")
RNG = np.random.default_rng(1)
LOGITS = RNG.normal(size=(2, 4, 5))
LABELS = np.array([[1, -100, 4, 0], [-100, 2, 2, 3]])


def _graph(reduction: str, ignore_index, dtype=bz.f64) -> bz.Graph:
    g = bz.Graph("xent")
    x = g.input("x", bz.Shape(LOGITS.shape, dtype))
    lab = g.input("labels", bz.Shape(LABELS.shape, bz.i64))
    loss = g.softmax_cross_entropy(x, lab, reduction, ignore_index=ignore_index)
    g.set_outputs([g.sum(g.mul(loss, g.constant(np.linspace(0.5, 2, 8).reshape(2, 4), dtype)))
                   if reduction == "none" else loss])
    return g


def _torch(labels, reduction, ignore_index):
    x = torch.tensor(LOGITS, requires_grad=True)
    per = torch.nn.functional.cross_entropy(x.permute(0, 2, 1), torch.tensor(labels),
                                            reduction=reduction, ignore_index=ignore_index)
    if reduction == "none":
        per = (per * torch.tensor(np.linspace(0.5, 2, 8).reshape(2, 4))).sum()
    per.backward()
    return per.item(), x.grad.numpy()


CASES = [(red, ign) for red in ("mean", "sum", "none") for ign in (-100, 2)]


@pytest.mark.parametrize("reduction, ignore_index", CASES)
def test_loss_and_gradient_match_torch(reduction, ignore_index):
    labels = LABELS if ignore_index == -100 else np.where(LABELS < 0, 1, LABELS)
    want_loss, want_grad = _torch(labels, reduction, ignore_index)
    g = _graph(reduction, ignore_index)
    gg = grad_with_loss(g, ["x"])
    feeds = {"x": LOGITS, "labels": labels}
    lowered = bz.LowerSoftmaxCrossEntropy.run(gg).graph  # the decomposition
    assert "softmax_cross_entropy" not in lowered.op_counts()
    for loss, grad in (bz.interpret(gg, feeds), bz.interpret(lowered, feeds),
                       bz.compile(gg)(feeds)):
        np.testing.assert_allclose(loss, want_loss, rtol=1e-10)
        np.testing.assert_allclose(grad, want_grad, rtol=1e-10, atol=1e-12)


def test_every_row_ignored_is_nan_as_in_torch():
    labels = np.full(LABELS.shape, -100)
    want, _ = _torch(labels, "mean", -100)
    assert np.isnan(want)
    got = bz.compile(_graph("mean", -100))({"x": LOGITS, "labels": labels})[0]
    assert np.isnan(got)


def test_labels_outside_the_classes_are_an_error_when_compiled():
    """The executor ran the one-hot decomposition, which read -100 (or 5) as no class and
    returned a loss and gradients where the interpreter raises."""
    g = _graph("mean", None)
    exe, grad_exe = bz.compile(g), bz.compile(grad_with_loss(g, ["x"]))
    for bad in (LABELS, np.where(LABELS < 0, 5, LABELS)):
        feeds = {"x": LOGITS, "labels": bad}
        for run in (exe, grad_exe):
            with pytest.raises(InterpretError, match=r"softmax_cross_entropy.*class labels "
                                                     r"must lie in \[0, 5\)"):
                run(feeds)
    with pytest.raises(InterpretError, match=r"or be ignore_index -100; got 1 outside, e.g. 7"):
        bz.compile(_graph("sum", -100))({"x": LOGITS, "labels": np.where(LABELS == 0, 7,
                                                                         LABELS)})


def test_ignore_index_round_trips_and_needs_class_indices(tmp_path):
    g = _graph("mean", -100)
    assert "ignore_index=-100" in str(g)
    feeds = {"x": LOGITS, "labels": LABELS}
    for h in (bz.Graph.parse(str(g)), bz.load(bz.save(g, tmp_path / "g.json") or
                                              tmp_path / "g.json")):
        np.testing.assert_allclose(bz.interpret(h, feeds)[0], bz.interpret(g, feeds)[0])
    p = bz.Graph("probs")
    x = p.input("x", bz.Shape((2, 3)))
    with pytest.raises(bz.ShapeError, match="ignore_index applies to class-index labels"):
        p.softmax_cross_entropy(x, p.softmax(x), ignore_index=-100)


def test_imported_torch_cross_entropy_and_nll_loss_with_ignore_index_match_torch():
    class Losses(torch.nn.Module):
        def forward(self, x, y):
            f = torch.nn.functional
            return (f.cross_entropy(x, y, ignore_index=-100)
                    + f.nll_loss(f.log_softmax(x, 1), y.clamp(min=0), ignore_index=1,
                                 reduction="sum"))

    x, y = torch.tensor(LOGITS[0], dtype=torch.float32), torch.tensor(LABELS[0])
    g = bz.import_torch(Losses(), (x, y))
    got = bz.compile(grad_with_loss(g, ["x"]))({"x": x.numpy(), "y": y.numpy()})
    tx = x.clone().requires_grad_()
    loss = Losses()(tx, y)
    loss.backward()
    np.testing.assert_allclose(got[0], loss.item(), rtol=1e-5)
    np.testing.assert_allclose(got[1], tx.grad.numpy(), rtol=1e-5, atol=1e-6)
