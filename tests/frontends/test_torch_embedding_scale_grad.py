"""nn.Embedding / F.embedding with scale_grad_by_freq: the forward is a plain gather, and the
weight gradient of each row is divided by how often that row is read in the batch, matching
torch.autograd (padding_idx's row still gets none)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import braze as bz  # noqa: E402


class _Scaled(torch.nn.Module):
    def __init__(self, padding_idx=None, functional=False):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(7, 3, padding_idx=padding_idx, scale_grad_by_freq=True)
        self.functional = functional

    def forward(self, x, ids):
        if self.functional:
            rows = torch.nn.functional.embedding(ids, self.emb.weight, scale_grad_by_freq=True,
                                                 padding_idx=self.emb.padding_idx)
        else:
            rows = self.emb(ids)
        return (rows * x).square().sum()


@pytest.mark.parametrize("padding_idx, functional", [(None, False), (1, False), (None, True)])
def test_scale_grad_by_freq_matches_torch_autograd(padding_idx, functional):
    model = _Scaled(padding_idx, functional)
    x = torch.randn(2, 5, 3)
    ids = torch.tensor([[0, 1, 1, 3, 3], [3, 6, 1, 0, 3]])  # rows read 1 to 4 times
    g = bz.import_torch(model, (x, ids))
    (name,) = [n.op.name for n in g.params]
    feeds = {"x": x.numpy(), "ids": ids.numpy()}
    tx = x.clone().requires_grad_()
    loss = model(tx, ids)
    loss.backward()
    weight_grad = dict(model.named_parameters())[name].grad.numpy()
    gg = bz.grad_with_loss(g, [name, "x"])
    for got in (bz.interpret(gg, feeds), bz.compile(gg)(feeds)):
        np.testing.assert_allclose(got[0], loss.item(), rtol=1e-5)
        np.testing.assert_allclose(got[1], weight_grad, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[2], tx.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bz.compile(g)(feeds)[0], loss.item(), rtol=1e-5)


def test_scale_grad_by_freq_trains_as_torch_sgd():
    model = _Scaled()
    x, ids = torch.randn(2, 5, 3), torch.tensor([[0, 1, 1, 3, 3], [3, 6, 1, 0, 3]])
    g = bz.import_torch(model, (x, ids))
    step = bz.compile_training(g, ["emb.weight"], bz.SGD(lr=0.1))
    step.step({"x": x.numpy(), "ids": ids.numpy()})
    w0 = model.emb.weight.detach().clone()
    model(x, ids).backward()
    np.testing.assert_allclose(step.params["emb.weight"],
                               (w0 - 0.1 * model.emb.weight.grad).numpy(), rtol=1e-5, atol=1e-6)
