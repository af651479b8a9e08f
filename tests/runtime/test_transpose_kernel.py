"""The tiled C transpose: permutations that reduce to [B, M, N] -> [B, N, M] (after size-1
axes are dropped and neighbouring axes merged) copy bit for bit against NumPy, every element
size and ragged tile edges included; other permutations keep the NumPy copy."""
import numpy as np
import pytest

import braze as bz
from braze.runtime.kernels.transpose import batched_2d


@pytest.mark.parametrize("dims, perm, want", [
    ((1, 96, 56, 56), (0, 2, 3, 1), (1, 96, 3136)),     # NCHW -> NHWC
    ((1, 56, 56, 96), (0, 3, 1, 2), (1, 3136, 96)),     # NHWC -> NCHW
    ((768, 3072), (1, 0), (1, 768, 3072)),
    ((4, 5, 6), (0, 2, 1), (4, 5, 6)),
    ((2, 1, 3, 4), (0, 3, 2, 1), (2, 3, 4)),            # a size-1 axis dropped
    ((8, 12, 128, 64), (0, 2, 1, 3), None),             # rows stay rows: NumPy's copy
    ((2, 3, 4, 5), (1, 0, 3, 2), None),                 # two swaps
    ((2, 3, 4), (0, 1, 2), None),
])
def test_permutations_that_are_a_batched_2d_transpose(dims, perm, want):
    assert batched_2d(dims, perm) == want


def _graph(dims, perm, dtype):
    g = bz.Graph("t")
    x = g.input("x", bz.Shape(dims, dtype))
    g.set_outputs([g.transpose(g.add(x, x), perm)])
    return g


@pytest.mark.parametrize("dims, perm", [
    ((1, 13, 9, 7), (0, 2, 3, 1)),
    ((3, 7, 5, 19), (0, 3, 1, 2)),
    ((37, 70), (1, 0)),
    ((2, 64, 40), (0, 2, 1)),
    ((5, 1, 33, 17), (1, 0, 3, 2)),
])
@pytest.mark.parametrize("dtype", [bz.f32, bz.f16, bz.f64, bz.i32, bz.i64, bz.u8])
def test_the_tiled_transpose_copies_bit_for_bit(dims, perm, dtype):
    g = _graph(dims, perm, dtype)
    exe = bz.compile(g, fuse=False)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(dims) * 50).astype(dtype.np)
    np.testing.assert_array_equal(exe({"x": x})[0], bz.interpret(g, {"x": x})[0])
    (how,) = [r[3] for r in exe.dispatch_report().rows if r[1] == "transpose"]
    assert how.startswith("C tiled transpose")


def test_a_permutation_that_keeps_rows_uses_numpys_copy():
    g = _graph((2, 3, 4, 5), (0, 2, 1, 3), bz.f32)
    exe = bz.compile(g, fuse=False)
    x = np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5)
    np.testing.assert_array_equal(exe({"x": x})[0], (x + x).transpose(0, 2, 1, 3))
    (how,) = [r[3] for r in exe.dispatch_report().rows if r[1] == "transpose"]
    assert how == "transpose copy"
