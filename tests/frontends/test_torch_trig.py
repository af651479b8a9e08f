"""import_torch of the trigonometric and hyperbolic functions braze has as unary functions
(tan, asin, acos, atan, sinh, cosh, asinh, acosh, atanh): each in its domain against PyTorch,
interpreted and compiled."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import braze as bz  # noqa: E402

_DOMAINS = {"tan": (-1.2, 1.2), "asin": (-0.99, 0.99), "acos": (-0.99, 0.99),
            "atan": (-50.0, 50.0), "sinh": (-8.0, 8.0), "cosh": (-8.0, 8.0),
            "asinh": (-1e3, 1e3), "acosh": (1.0, 1e3), "atanh": (-0.99, 0.99)}


class Fn(torch.nn.Module):
    def __init__(self, name):
        super().__init__()
        self.fn = getattr(torch, name)

    def forward(self, x):
        return self.fn(x), self.fn(x) * x + 1.0   # a lone op, and one inside a region


@pytest.mark.parametrize("name", sorted(_DOMAINS))
def test_trigonometric_and_hyperbolic_functions_match_torch(name):
    lo, hi = _DOMAINS[name]
    rng = np.random.default_rng(4)
    x = torch.from_numpy(rng.uniform(lo, hi, (3, 29)).astype(np.float32))
    m = Fn(name)
    g = bz.import_torch(m, (x,))
    assert name in {n.op.label for n in g.nodes}
    want = [t.numpy() for t in m(x)]
    feeds = {g.inputs[0].op.name: x.numpy()}
    for got in (bz.interpret(g, feeds), bz.compile(g, "cpu")(feeds)):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-6)
