"""The compiled softmax_cross_entropy / _backward kernels against the interpreter: both label
forms, every reduction, ignore_index, rows of rank 2, f32 / f64 / bf16 logits, huge logits; the
kernels build no one-hot and run natively (no decomposition)."""
import ml_dtypes
import numpy as np
import pytest

import braze as bz

RNG = np.random.default_rng(7)


def _graph(soft, reduction, ignore_index, dtype, backward):
    g = bz.Graph("ce")
    x = g.input("x", bz.Shape((2, 3, 6), dtype))
    labels = (g.input("t", bz.Shape((2, 3, 6), dtype)) if soft
              else g.input("labels", bz.Shape((2, 3), bz.i64)))
    if backward:
        d = g.input("d", bz.Shape((2, 3) if reduction == "none" else (), dtype))
        out = g.softmax_cross_entropy_backward(x, labels, d, reduction, ignore_index)
    else:
        out = g.softmax_cross_entropy(x, labels, reduction, ignore_index)
    g.set_outputs([out])
    return g


CASES = [(soft, red, ign, bwd) for soft in (False, True) for red in ("mean", "sum", "none")
         for ign in (None, 4) for bwd in (False, True) if not (soft and ign is not None)]


@pytest.mark.parametrize("soft, reduction, ignore_index, backward", CASES)
@pytest.mark.parametrize("dtype", [bz.f32, bz.f64, bz.bf16], ids=["f32", "f64", "bf16"])
def test_kernel_matches_the_interpreter(soft, reduction, ignore_index, backward, dtype):
    g = _graph(soft, reduction, ignore_index, dtype, backward)
    np_dt = ml_dtypes.bfloat16 if dtype == bz.bf16 else dtype.np
    feeds = {"x": (RNG.normal(size=(2, 3, 6)) * 30).astype(np_dt)}
    if soft:
        feeds["t"] = np.abs(RNG.normal(size=(2, 3, 6))).astype(np_dt)
    else:
        feeds["labels"] = np.array([[1, 4, 0], [5, 4, 2]])
    if backward:
        feeds["d"] = RNG.normal(size=(2, 3) if reduction == "none" else ()).astype(np_dt)
    exe = bz.compile(g)
    (row,) = exe.dispatch_report().rows
    assert row[2] == "native" and "labels checked" in row[3]
    got, want = exe(feeds)[0], bz.interpret(g, feeds)[0]
    tol = 1e-2 if dtype == bz.bf16 else 1e-5 if dtype == bz.f32 else 1e-12
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=tol, atol=tol)
