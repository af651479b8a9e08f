"""ScatterElements, ScatterND (ops/scatter.py) and EyeLike (ops/shape.py) against ONNX Runtime,
through the reference interpreter and the compiled CPU executable: every reduction on every
axis with negative and repeated indices, updates smaller than the data, integer data, symbolic
dims, ScatterND on run-time values; malformed nodes are refused naming the node."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

import braze as bz  # noqa: E402
from braze.errors import FrontendError  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64
REDUCTIONS = ["none", "add", "mul", "max", "min"]


def scatter_model(make_model, op, dims, idims, udims, dtype=F, **attrs):
    if attrs.get("reduction") == "none":
        del attrs["reduction"]
    node = helper.make_node(op, ["data", "indices", "updates"], ["y"], name="sc0", **attrs)
    return make_model([node], [("data", dtype, dims), ("indices", I64, idims),
                               ("updates", dtype, udims)], [("y", dtype, None)], opset=18)


def element_indices(rng, reduction, n, idims, axis):
    """Indices into an axis of size n, negative half the time; distinct along the axis for
    "none" (ONNX leaves repeated writes unspecified there), repeated otherwise."""
    if reduction == "none":
        lead, tail = idims[:axis], idims[axis + 1:]
        order = np.argsort(rng.random(tuple(lead) + (n,) + tuple(tail)), axis=axis)
        idx = np.take(order, np.arange(idims[axis]), axis=axis)
    else:
        idx = rng.integers(0, n, idims)
    return np.where(rng.random(idims) < 0.5, idx - n, idx).astype(np.int64)


# -- ScatterElements ----------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dims, idims, axis", [
    ((5, 7), (3, 7), 0),          # fewer updates than rows
    ((5, 7), (5, 4), 1),
    ((3, 6, 5), (2, 6, 3), 1),    # smaller than the data off the axis too
    ((3, 6, 5), (3, 4, 5), -1),
    ((9,), (4,), 0),
])
def test_scatter_elements(make_model, matches_ort, reduction, dims, idims, axis):
    rng = np.random.default_rng(len(dims) * 10 + axis)
    ax = axis % len(dims)
    m = scatter_model(make_model, "ScatterElements", list(dims), list(idims), list(idims),
                      axis=axis, reduction=reduction)
    feeds = {"data": rng.standard_normal(dims).astype(np.float32),
             "indices": element_indices(rng, reduction, dims[ax], idims, ax),
             "updates": rng.standard_normal(idims).astype(np.float32)}
    g = matches_ort(m, feeds)
    bz.verify(g)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_scatter_elements_of_integers(make_model, matches_ort, reduction):
    rng = np.random.default_rng(3)
    m = scatter_model(make_model, "ScatterElements", [4, 6], [4, 5], [4, 5], dtype=I64, axis=1,
                      reduction=reduction)
    matches_ort(m, {"data": rng.integers(-9, 9, (4, 6)),
                    "indices": element_indices(rng, reduction, 6, (4, 5), 1),
                    "updates": rng.integers(-9, 9, (4, 5))})


def test_repeated_writes_without_reduction_keep_the_last_as_ort_does(make_model, matches_ort):
    rng = np.random.default_rng(4)
    m = scatter_model(make_model, "ScatterElements", [3, 5], [3, 8], [3, 8], axis=1)
    matches_ort(m, {"data": rng.standard_normal((3, 5)).astype(np.float32),
                    "indices": rng.integers(-5, 5, (3, 8)),
                    "updates": rng.standard_normal((3, 8)).astype(np.float32)})


def test_scatter_elements_keeps_symbolic_dims(make_model, matches_ort):
    rng = np.random.default_rng(5)
    m = scatter_model(make_model, "ScatterElements", ["batch", "n"], ["batch", 2],
                      ["batch", 2], axis=1, reduction="add")
    g = matches_ort(m, {"data": rng.standard_normal((3, 7)).astype(np.float32),
                        "indices": rng.integers(-7, 7, (3, 2)),
                        "updates": rng.standard_normal((3, 2)).astype(np.float32)})
    assert g.shape_of(g.outputs[0]).dims == ("batch", "n")


@pytest.mark.parametrize("op", ["ScatterElements", "ScatterND"])
def test_stored_negative_indices_follow_every_binding_of_a_symbolic_axis(make_model, ort_run,
                                                                         op):
    """One compiled graph run at two sizes of the axis: `-1` is a different row each time."""
    idx = np.array([[-1, 0, -2]], np.int64) if op == "ScatterElements" else \
        np.array([[-1], [0]], np.int64)
    udims = [1, 3] if op == "ScatterElements" else [2, 3]
    node = helper.make_node(op, ["data", "idx", "updates"], ["y"], name="sc0",
                            **({"axis": 0} if op == "ScatterElements" else {}))
    m = make_model([node], [("data", F, ["n", 3]), ("updates", F, udims)], [("y", F, None)],
                   initializers=[onnx.numpy_helper.from_array(idx, "idx")], opset=18)
    g = bz.import_onnx(m)
    exe = bz.compile(g, "cpu")
    rng = np.random.default_rng(6)
    for n in (4, 6, 4):
        feeds = {"data": rng.standard_normal((n, 3)).astype(np.float32),
                 "updates": rng.standard_normal(udims).astype(np.float32)}
        (want,) = ort_run(m, feeds)
        for got in (bz.interpret(g, feeds)[0], exe(feeds)[0]):
            np.testing.assert_allclose(got, want, rtol=1e-6)


def test_index_copy_into_a_cache_folds_its_shape_scatter(make_model, matches_ort):
    """TorchScript's `cache.index_copy(2, pos, new)` (a static KV cache) writes len(pos) into
    the cache's shape with a ScatterElements of Shape values to size the index Expand: that
    folds at import (it had left Expand's target to run time, a FrontendError)."""
    nodes = [
        helper.make_node("Shape", ["cache"], ["sc"], name="shape_cache"),
        helper.make_node("Shape", ["pos"], ["sp"], name="shape_pos"),
        helper.make_node("ScatterElements", ["sc", "two", "sp"], ["tgt"], name="shape_sc",
                         axis=0),
        helper.make_node("Unsqueeze", ["pos", "axes"], ["p4"], name="unsq"),
        helper.make_node("Expand", ["p4", "tgt"], ["idx"], name="expand"),
        helper.make_node("ScatterElements", ["cache", "idx", "new"], ["y"], name="copy", axis=2),
    ]
    inits = [onnx.numpy_helper.from_array(np.array([2], np.int64), "two"),
             onnx.numpy_helper.from_array(np.array([0, 1, 3], np.int64), "axes")]
    m = make_model(nodes, [("cache", F, ["batch", 2, 16, 4]), ("new", F, ["batch", 2, "seq", 4]),
                           ("pos", I64, ["seq"])], [("y", F, None)], inits, opset=18)
    rng = np.random.default_rng(7)
    for b, s, start in ((2, 3, 5), (1, 1, 15)):
        g = matches_ort(m, {"cache": rng.standard_normal((b, 2, 16, 4)).astype(np.float32),
                            "new": rng.standard_normal((b, 2, s, 4)).astype(np.float32),
                            "pos": np.arange(start, start + s, dtype=np.int64)})
    assert g.shape_of(g.outputs[0]).dims == ("batch", 2, 16, 4)


def test_scatter_elements_with_mismatched_updates_is_refused(make_model):
    m = scatter_model(make_model, "ScatterElements", [4, 5], [4, 2], [4, 3], axis=1)
    with pytest.raises(FrontendError, match=r"sc0 \(ScatterElements\).*indices \(4, 2\) and "
                                            r"updates \(4, 3\)"):
        bz.import_onnx(m)


def test_scatter_elements_with_an_unknown_reduction_is_refused(make_model):
    m = scatter_model(make_model, "ScatterElements", [4, 5], [4, 2], [4, 2], axis=1,
                      reduction="mean")
    with pytest.raises(FrontendError, match=r"sc0.*reduction='mean' is not defined"):
        bz.import_onnx(m)


# -- ScatterND on run-time values ---------------------------------------------------------------
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dims, k, lead", [((4, 5, 3), 1, (2,)), ((4, 5, 3), 2, (3,)),
                                           ((4, 5, 3), 3, (2, 2)), ((6,), 1, (4,))])
def test_scatter_nd_of_run_time_values(make_model, matches_ort, reduction, dims, k, lead):
    rng = np.random.default_rng(k * 7 + len(lead))
    if reduction == "none":  # distinct targets
        flat = rng.permutation(int(np.prod(dims[:k])))[:int(np.prod(lead))]
        idx = np.stack(np.unravel_index(flat, dims[:k]), -1).reshape(lead + (k,))
    else:
        idx = np.stack([rng.integers(0, dims[j], lead) for j in range(k)], -1)
    idx = np.where(rng.random(idx.shape) < 0.5, idx - np.array(dims[:k]), idx).astype(np.int64)
    udims = lead + dims[k:]
    m = scatter_model(make_model, "ScatterND", list(dims), list(idx.shape), list(udims),
                      reduction=reduction)
    matches_ort(m, {"data": rng.standard_normal(dims).astype(np.float32), "indices": idx,
                    "updates": rng.standard_normal(udims).astype(np.float32)})


def test_scatter_nd_into_a_symbolic_batch(make_model, matches_ort):
    rng = np.random.default_rng(8)
    m = scatter_model(make_model, "ScatterND", ["batch", 5, 3], [2, 2], [2, 3])
    matches_ort(m, {"data": rng.standard_normal((4, 5, 3)).astype(np.float32),
                    "indices": np.array([[1, 2], [-1, 0]], np.int64),
                    "updates": rng.standard_normal((2, 3)).astype(np.float32)})


def test_scatter_nd_with_misshaped_updates_is_refused(make_model):
    m = scatter_model(make_model, "ScatterND", [4, 5], [2, 1], [2, 4])
    with pytest.raises(FrontendError, match=r"sc0 \(ScatterND\).*updates \(2, 4\) must have "
                                            r"dims \(2, 5\)"):
        bz.import_onnx(m)


# -- EyeLike ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dims, k, dtype", [((3, 5), 0, None), ((5, 3), 2, TensorProto.INT32),
                                            ((4, 4), 7, TensorProto.DOUBLE),
                                            ((4, 6), -3, None), (("rows", "cols"), -1, None),
                                            (("n", 4), 1, I64)])
def test_eye_like(make_model, matches_ort, dims, k, dtype):
    attrs = {"k": k} if k else {}
    if dtype is not None:
        attrs["dtype"] = dtype
    nodes = [helper.make_node("EyeLike", ["x"], ["e"], name="eye0", **attrs),
             helper.make_node("Identity", ["e"], ["y"])]
    m = make_model(nodes, [("x", F, list(dims))], [("y", dtype or F, None)])
    shape = tuple(d if isinstance(d, int) else 5 + i for i, d in enumerate(dims))
    g = matches_ort(m, {"x": np.random.default_rng(9).standard_normal(shape).astype(np.float32)})
    assert g.shape_of(g.outputs[0]).dims == tuple(dims)


def test_eye_like_of_an_integer_input_keeps_its_dtype(make_model, matches_ort):
    nodes = [helper.make_node("EyeLike", ["x"], ["y"], name="eye0", k=-1)]
    m = make_model(nodes, [("x", I64, [3, 4])], [("y", I64, None)])
    matches_ort(m, {"x": np.zeros((3, 4), np.int64)})


def test_eye_like_of_rank_three_is_refused(make_model):
    nodes = [helper.make_node("EyeLike", ["x"], ["y"], name="eye0")]
    m = make_model(nodes, [("x", F, [2, 3, 4])], [("y", F, None)])
    with pytest.raises(FrontendError, match=r"eye0 \(EyeLike\).*rank-2 input"):
        bz.import_onnx(m)


def test_new_ops_are_listed_as_supported():
    from braze.frontends.onnx.importer import SUPPORTED_OPS

    assert {"ScatterElements", "ScatterND", "EyeLike"} <= set(SUPPORTED_OPS())
