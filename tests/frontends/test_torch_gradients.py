"""Imported PyTorch graphs differentiate like torch.autograd where torch's decompositions meet a
tie: logsigmoid at 0 (torch writes it with a minimum) and clamp with tensor bounds (x keeps the
gradient where it equals a bound)."""
import numpy as np
import pytest

import braze as bz

torch = pytest.importorskip("torch")


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _grads(fn, *arrays):
    """(braze grads, torch grads) of sum(fn(*arrays)) with respect to every input."""
    g = bz.import_torch(_Fn(fn).eval(), tuple(torch.tensor(a) for a in arrays))
    names = [n.op.name for n in g.inputs]
    loss = bz.Graph("loss")
    from braze.autodiff.reverse import clone_into

    loss.set_outputs([loss.sum(clone_into(loss, g)[g.outputs[0]])])
    got = bz.interpret(bz.grad_with_loss(loss, names), dict(zip(names, arrays)))[1:]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    fn(*ts).sum().backward()
    return got, [t.grad.numpy() for t in ts]


def test_logsigmoid_at_zero_has_torchs_gradient():
    got, want = _grads(torch.nn.functional.logsigmoid, np.array([0.0, -1.0, 3.0], np.float32))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    assert got[0][0] == pytest.approx(0.5)


def test_clamp_with_tensor_bounds_keeps_the_gradient_at_a_tie_in_x():
    x = np.array([1.0, 2.0, 3.0, 0.5], np.float32)
    lo = np.array([1.0, 0.0, 3.5, 0.5], np.float32)
    hi = np.array([4.0, 2.0, 4.0, 0.5], np.float32)
    got, want = _grads(lambda a, b, c: torch.clamp(a, min=b, max=c), x, lo, hi)
    for a, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, w)
    g = bz.import_torch(_Fn(lambda a, b: torch.clamp(a, min=b)).eval(),
                        (torch.tensor(x), torch.tensor(lo)))
    nan_lo = np.full(4, np.nan, np.float32)
    assert np.isnan(bz.interpret(g, {n.op.name: v for n, v in zip(g.inputs, (x, nan_lo))})[0]).all()


@pytest.mark.parametrize("fn", [
    lambda x: torch.nn.functional.normalize(x, dim=-1),
    lambda x: torch.linalg.vector_norm(x, dim=-1),
    lambda x: torch.linalg.vector_norm(x, ord=3, dim=-1),
], ids=["normalize", "norm2", "norm3"])
def test_the_norm_of_a_zero_vector_has_torchs_gradient_not_nan(fn):
    x = np.array([[0.0, 0.0, 0.0], [1.0, -2.0, 0.5]], np.float32)
    got, want = _grads(fn, x)
    assert np.isfinite(got[0]).all()
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
