"""Where torch stops gradients, imported graphs do too: `x.detach()`, `torch.no_grad()`
regions and `nn.Embedding(padding_idx=...)` (the padding row gets no gradient), checked against
torch.autograd through the interpreter and the compiled backward."""
import numpy as np
import pytest

import braze as bz

torch = pytest.importorskip("torch")


class _Detaching(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(6, 4, padding_idx=2)
        self.w = torch.nn.Parameter(torch.randn(4))

    def forward(self, x, ids):
        a = x * x.detach() * self.w.detach()
        with torch.no_grad():
            b = (x * 2).sin()
        rows = self.emb(ids) * self.w
        return (a * self.w).sum() + (b * x).sum() + rows.square().sum()


def test_detach_no_grad_and_padding_idx_match_torch_autograd():
    model = _Detaching()
    x, ids = torch.randn(4), torch.tensor([[0, 2, 5], [2, 1, 2]])
    g = bz.import_torch(model, (x, ids))
    kinds = [n.op.kind for n in g.nodes]
    assert kinds.count("stop_gradient") == 4  # detach twice, no_grad, the padding rows
    names = [n.op.name for n in g.params]
    feeds = {"x": x.numpy(), "ids": ids.numpy()}
    gg = bz.grad_with_loss(g, [*names, "x"])
    tx = x.clone().requires_grad_()
    loss = model(tx, ids)
    loss.backward()
    leaves = dict(model.named_parameters())
    for got in (bz.interpret(gg, feeds), bz.compile(gg)(feeds)):
        np.testing.assert_allclose(got[0], loss.item(), rtol=1e-5)
        for name, grad in zip(names, got[1:]):
            np.testing.assert_allclose(grad, leaves[name].grad.numpy(), rtol=1e-5, atol=1e-6,
                                       err_msg=name)
        np.testing.assert_allclose(got[-1], tx.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert not got[names.index("emb.weight") + 1][2].any()


def test_the_exported_program_is_not_changed():
    model = _Detaching()
    ep = torch.export.export(model, (torch.randn(4), torch.tensor([[0, 2, 5]])))
    before = str(ep.graph)
    bz.import_torch(ep)
    assert str(ep.graph) == before


def test_a_compiled_forward_drops_the_stops():
    """An executable runs forward only, where stop_gradient is the identity: the stops and the
    where(padding, stopped rows, rows) an Embedding(padding_idx) imports as are gone
    (passes.forward_only), so the embedding runs as a plain gather, with the same numbers."""
    emb = torch.nn.Embedding(10, 8, padding_idx=0)
    ids = torch.tensor([[0, 3, 9, 0], [5, 0, 1, 2]])
    g = bz.import_torch(emb, (ids,))
    assert "stop_gradient" in [n.op.kind for n in g.nodes]
    exe = bz.compile(g)
    kinds = [n.op.kind for n in exe.graph.nodes]
    assert "stop_gradient" not in kinds and "where" not in kinds
    assert "elementwise_region" not in kinds
    (got,) = exe({g.inputs[0].op.name: ids.numpy()})
    np.testing.assert_array_equal(got, emb(ids).detach().numpy())
