"""import_torch of torch.fmax / torch.fmin: a NaN operand gives the other operand (NaN only where
both are), unlike torch.maximum / minimum, which propagate it; interpreted and compiled, with
broadcasting and integer operands."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import braze as bz  # noqa: E402


class Fn(torch.nn.Module):
    def forward(self, x, y):
        return (torch.fmax(x, y), torch.fmin(x, y), torch.fmax(x, y[0]) * 2.0 + 1.0,
                torch.maximum(x, y), torch.minimum(x, y))


def _inputs(batch):
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((batch, 13)).astype(np.float32)
    y = rng.standard_normal((batch, 13)).astype(np.float32)
    x[:, [1, 4]] = np.nan
    y[:, [2, 4]] = np.nan
    x[:, 5], y[:, 6] = np.inf, -np.inf
    return torch.from_numpy(x), torch.from_numpy(y)


def test_fmax_fmin_ignore_a_nan_operand():
    m = Fn()
    g = bz.import_torch(m, _inputs(2), dynamic_shapes={"x": {0: "batch"}, "y": {0: "batch"}})
    exe = bz.compile(g, "cpu")
    for batch in (2, 3):
        x, y = _inputs(batch)
        want = [t.numpy() for t in m(x, y)]
        feeds = {"x": x.numpy(), "y": y.numpy()}
        for got in (bz.interpret(g, feeds), exe(feeds)):
            for a, b in zip(got, want, strict=True):
                np.testing.assert_array_equal(a, b)


class IntFn(torch.nn.Module):
    def forward(self, a, b):
        return torch.fmax(a, b), torch.fmin(a, b)


def test_fmax_fmin_of_integers():
    a = torch.tensor([[3, -7, 0, 12]])
    b = torch.tensor([[-1, -2, 5, 12]])
    m = IntFn()
    g = bz.import_torch(m, (a, b))
    feeds = {"a": a.numpy(), "b": b.numpy()}
    want = [t.numpy() for t in m(a, b)]
    for got in (bz.interpret(g, feeds), bz.compile(g, "cpu")(feeds)):
        for x, y in zip(got, want, strict=True):
            np.testing.assert_array_equal(x, y)
