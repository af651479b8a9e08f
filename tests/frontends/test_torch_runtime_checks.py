"""torch.export keeps a model's data-dependent assertions (XLM: `assert lengths.max().item()
<= slen`) as `.item()` -> comparison -> `_assert_scalar`. braze drops run-time assertions, so
the ops that only feed them are dead and must not block the import; a `.item()` whose number
the model computes with is still refused, naming the op."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import braze as bz  # noqa: E402
from braze.errors import UnsupportedOpsError  # noqa: E402


class _Checked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)

    def forward(self, ids):
        lengths = (ids != 0).sum(dim=1)
        torch._check(lengths.max().item() <= ids.shape[1])  # what XLM's assert exports as
        return self.emb(ids) * 2.0


class _UsesItem(_Checked):
    def forward(self, ids):
        return self.emb(ids) * (ids != 0).sum().item()


def _ids(batch, seq, seed):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 10, (batch, seq)))


def test_ops_that_only_feed_an_assertion_are_skipped():
    m = _Checked().eval()
    g = bz.import_torch(m, (_ids(2, 5, 0),), dynamic_shapes={"ids": ("batch", "seq")})
    assert g.count("reduce_max") == 0  # the checked lengths are gone with the check
    ids = _ids(3, 7, 1)
    (got,) = bz.interpret(g, {"ids": ids.numpy()})
    np.testing.assert_allclose(got, m(ids).detach().numpy(), rtol=1e-6)


def test_an_item_the_model_computes_with_is_still_refused():
    with pytest.raises(UnsupportedOpsError, match="_local_scalar_dense"):
        bz.import_torch(_UsesItem().eval(), (_ids(2, 5, 0),))
