"""dot_general as one batched matmul (runtime/kernels/dot_general.py) matches the reference
interpreter's einsum: float32 / float64 within the summation order's rounding, integers
exactly; batch dims anywhere, several contracting dims, no free dims; the dispatch report
names the kernel."""
import numpy as np
import pytest

import braze as bz
from braze.runtime.kernels import Dispatch

CASES = [  # lhs shape, rhs shape, lhs_contract, rhs_contract, lhs_batch, rhs_batch
    ((2, 3, 8), (2, 8, 5), (2,), (1,), (0,), (0,)),
    ((3, 8), (5, 8), (1,), (1,), (), ()),
    ((4, 2, 6, 3), (3, 7, 6, 2), (2, 3), (2, 0), (1,), (3,)),
    ((5, 9), (9,), (1,), (0,), (), ()),
    ((2, 4, 6), (6, 4, 2), (1, 2), (1, 0), (0,), (2,)),
    ((17, 33), (33, 1), (1,), (0,), (), ()),
]


@pytest.mark.parametrize("dtype", [bz.f32, bz.f64, bz.i32, bz.i64], ids=str)
@pytest.mark.parametrize("a_shape, b_shape, lc, rc, lb, rb", CASES)
def test_dot_general_matches_reference(dtype, a_shape, b_shape, lc, rc, lb, rb):
    g = bz.Graph("dg")
    a, b = g.input("a", bz.Shape(a_shape, dtype)), g.input("b", bz.Shape(b_shape, dtype))
    g.set_outputs([g.dot_general(a, b, lc, rc, lb, rb)])
    exe = bz.compile(g, "cpu", fuse=False)
    rng = np.random.default_rng(len(a_shape) + len(b_shape))
    for _ in range(2):
        if dtype.is_int:
            feeds = {n: rng.integers(-50, 50, s).astype(dtype.np)
                     for n, s in (("a", a_shape), ("b", b_shape))}
        else:
            feeds = {n: rng.standard_normal(s).astype(dtype.np)
                     for n, s in (("a", a_shape), ("b", b_shape))}
        want, got = bz.interpret(g, feeds)[0], exe(feeds)[0]
        assert want.dtype == got.dtype and want.shape == got.shape
        if dtype.is_int:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    rows = [(d, impl) for _, k, d, impl in exe.dispatch_report().rows if k == "dot_general"]
    assert rows == [(Dispatch.NATIVE, "dot_general (batched matmul)")]
