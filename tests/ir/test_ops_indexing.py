"""slice (strided), gather_elements, top_k and trilu against NumPy, with their shape rules."""
import numpy as np
import pytest

import braze as bz


def run1(build, feeds, shape=(4, 5, 6)):
    g = bz.Graph("t")
    x = g.input("x", bz.Shape(shape))
    outs = build(g, x)
    g.set_outputs(list(outs) if isinstance(outs, tuple) else [outs])
    return g, bz.interpret(g, feeds)


@pytest.mark.parametrize("start, stop, step", [(0, 6, 2), (5, -7, -1), (-2, 1, -2), (1, 100, 3),
                                               (4, 2, 1)])
def test_slice_follows_python_semantics(start, stop, step):
    a = np.random.default_rng(0).standard_normal((4, 5, 6)).astype(np.float32)
    g, (out,) = run1(lambda g, x: g.slice(x, -1, start, stop, step), {"x": a})
    np.testing.assert_array_equal(out, a[:, :, start:stop:step])
    assert g.shape_of(g.outputs[0]).dims == a[:, :, start:stop:step].shape


def test_slice_rejects_zero_step_and_symbolic_axes():
    g = bz.Graph("t")
    x = g.input("x", bz.Shape(("b", 4)))
    with pytest.raises(bz.ShapeError, match="step must not be 0"):
        g.slice(x, 1, 0, 4, 0)
    with pytest.raises(bz.ShapeError, match="static axis 0"):
        g.slice(x, 0, 0, 2, 2)


def test_gather_elements_matches_onnx_semantics():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([[0, 3], [-1, 1]], np.int64)               # smaller than data off-axis
    g = bz.Graph("t")
    x = g.input("x", bz.Shape((3, 4)))
    i = g.input("i", bz.Shape((2, 2), bz.i64))
    g.set_outputs([g.gather_elements(x, i, 1)])
    (out,) = bz.interpret(g, {"x": a, "i": idx})
    np.testing.assert_array_equal(out, [[0, 3], [7, 5]])
    with pytest.raises(bz.ShapeError, match="rank"):
        g.gather_elements(x, g.input("j", bz.Shape((2,), bz.i64)), 0)


@pytest.mark.parametrize("largest", [True, False])
def test_top_k_values_and_indices(largest):
    a = np.array([[3, 1, 3, 2], [0, 5, 5, 4]], np.float32)
    g, (vals, idx) = run1(lambda g, x: g.top_k(x, 2, -1, largest), {"x": a}, (2, 4))
    if largest:
        np.testing.assert_array_equal(vals, [[3, 3], [5, 5]])
        np.testing.assert_array_equal(idx, [[0, 2], [1, 2]])   # ties: lower index first
    else:
        np.testing.assert_array_equal(vals, [[1, 2], [0, 4]])
        np.testing.assert_array_equal(idx, [[1, 3], [0, 3]])
    assert idx.dtype == np.int64
    with pytest.raises(bz.ShapeError, match="exceeds"):
        g.top_k(g.inputs[0].value, 5)


@pytest.mark.parametrize("upper, k", [(True, 0), (False, 0), (True, 1), (False, -1)])
def test_trilu_matches_numpy(upper, k):
    a = np.random.default_rng(1).standard_normal((2, 4, 5)).astype(np.float32)
    _, (out,) = run1(lambda g, x: g.trilu(x, upper, k), {"x": a}, (2, 4, 5))
    np.testing.assert_array_equal(out, (np.triu if upper else np.tril)(a, k))


@pytest.mark.parametrize("dtype", [bz.f32, bz.f64, bz.f16, bz.bf16])
@pytest.mark.parametrize("largest", [True, False])
def test_top_k_ranks_nan_above_inf(dtype, largest):
    """NaN is the largest value, as in torch.topk / torch.sort and ONNX TopK: first when
    largest, last when smallest; several NaN keep their index order."""
    a = np.array([[1.0, np.nan, np.inf, -1.0, np.nan, -np.inf]], np.float32).astype(dtype.np)
    g = bz.Graph("t")
    x = g.input("x", bz.Shape((1, 6), dtype))
    g.set_outputs(list(g.top_k(x, 6, -1, largest)))
    vals, idx = bz.interpret(g, {"x": a})
    want = [1, 4, 2, 0, 3, 5] if largest else [5, 3, 0, 2, 1, 4]
    np.testing.assert_array_equal(idx, [want])
    np.testing.assert_array_equal(vals.astype(np.float32), a.astype(np.float32)[:, want])


def test_top_k_of_signed_integers_does_not_wrap():
    """The largest of int8 [-128, 5, 127] is 127 (torch.topk, ONNX TopK), not -128."""
    g = bz.Graph("t")
    x = g.input("x", bz.Shape((1, 5), bz.i8))
    g.set_outputs(list(g.top_k(x, 3)))
    a = np.array([[-128, 5, 127, -128, 0]], np.int8)
    vals, idx = bz.interpret(g, {"x": a})
    assert vals.tolist() == [[127, 5, 0]] and idx.tolist() == [[2, 1, 4]]
    info = np.iinfo(np.int64)
    g = bz.Graph("t")
    x = g.input("x", bz.Shape((1, 3), bz.i64))
    g.set_outputs(list(g.top_k(x, 3)))
    vals, _ = bz.interpret(g, {"x": np.array([[info.min, 3, info.max]], np.int64)})
    assert vals.tolist() == [[info.max, 3, info.min]]
