"""torch.gather raises on a negative index where ONNX GatherElements counts it from the end:
an imported aten.gather (and so F.cross_entropy / nll_loss, whose labels it gathers) refuses a
negative index at run time, in the interpreter and the compiled kernel, naming the node; a
braze / ONNX gather_elements still wraps it."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import braze as bz  # noqa: E402

F = torch.nn.functional


class _Gather(torch.nn.Module):
    def forward(self, x, i):
        return torch.gather(x, 1, i)


class _CrossEntropy(torch.nn.Module):
    def forward(self, x, y):
        return F.cross_entropy(x, y)


def _runners(g):
    return {"interpret": lambda f: bz.interpret(g, f), "compiled": bz.compile(g, fuse=False),
            "fused": bz.compile(g)}


def test_imported_gather_refuses_a_negative_index():
    x = torch.randn(4, 5)
    g = bz.import_torch(_Gather().eval(), (x, torch.zeros(4, 2, dtype=torch.long)))
    ok = np.array([[0, 4], [1, 3], [2, 2], [3, 1]])
    bad = ok.copy()
    bad[3, 1] = -1
    with pytest.raises(RuntimeError):
        torch.gather(x, 1, torch.from_numpy(bad))
    for run in _runners(g).values():
        got = run({"x": x.numpy(), "i": ok})[0]
        np.testing.assert_array_equal(got, torch.gather(x, 1, torch.from_numpy(ok)).numpy())
        with pytest.raises(bz.InterpretError, match=r"node %\d+ \(gather_elements\).*got "
                           r"index -1.*\[0, 5\)"):
            run({"x": x.numpy(), "i": bad})


def test_imported_cross_entropy_refuses_a_negative_label():
    """A label in [-C, 0) that is not the ignore_index picked a class from the end."""
    x = torch.randn(4, 5)
    g = bz.import_torch(_CrossEntropy().eval(), (x, torch.tensor([0, 1, 2, 3])))
    y = np.array([0, 1, 2, 3])
    for run in _runners(g).values():
        np.testing.assert_allclose(run({"x": x.numpy(), "y": y})[0],
                                   F.cross_entropy(x, torch.from_numpy(y)).numpy(), rtol=1e-5)
        with pytest.raises(bz.InterpretError, match="gather_elements.*got index -2"):
            run({"x": x.numpy(), "y": np.array([0, -2, 2, 3])})


def test_onnx_gather_elements_still_counts_negatives_from_the_end():
    g = bz.Graph("g")
    x, i = g.input("x", bz.Shape((2, 3))), g.input("i", bz.Shape((2, 1), bz.i64))
    g.set_outputs([g.gather_elements(x, i, 1)])
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "i": np.array([[-1], [-3]])}
    want = np.array([[2.0], [3.0]], np.float32)
    np.testing.assert_array_equal(bz.interpret(g, feeds)[0], want)
    np.testing.assert_array_equal(bz.compile(g, fuse=False)(feeds)[0], want)
