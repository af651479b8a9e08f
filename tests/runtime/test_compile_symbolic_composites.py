"""A composite op without a kernel whose decomposition needs static dims (gather_backward)
stays in the compiled graph over symbolic dims and runs its NumPy reference, instead of
making bz.compile raise: every op runs, never an error."""
import numpy as np
import pytest

import braze as bz


@pytest.mark.parametrize("dims", [("b", 3, 8), (2, 3, "d")])
def test_gather_backward_over_symbolic_dims_compiles(dims):
    g = bz.Graph("gb")
    dy = g.input("dy", bz.Shape(dims))
    g.set_outputs([g.gather_backward(dy, g.constant(np.array([2, 0, -1], np.int64)), 1, 5)])
    exe = bz.compile(g, "cpu")
    rng = np.random.default_rng(0)
    for n in (2, 1, 4):
        shape = tuple(n if isinstance(d, str) else d for d in dims)
        feeds = {"dy": rng.standard_normal(shape).astype(np.float32)}
        (got,), (want,) = exe(feeds), bz.interpret(g, feeds)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    report = exe.dispatch_report()
    assert [r[1] for r in report.by_dispatch("reference")] == ["gather_backward"]


def test_gather_backward_with_static_dims_still_decomposes():
    g = bz.Graph("gb")
    dy = g.input("dy", bz.Shape((2, 3, 8)))
    g.set_outputs([g.gather_backward(dy, g.constant(np.array([2, 0, -1], np.int64)), 1, 5)])
    exe = bz.compile(g, "cpu")
    assert exe.decomposed == {"gather_backward": 1}
    feeds = bz.random_feeds(g, 0)
    np.testing.assert_allclose(exe(feeds)[0], bz.interpret(g, feeds)[0], rtol=1e-5, atol=1e-6)
