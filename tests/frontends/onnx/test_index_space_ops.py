"""ArgMin (ops/reduce.py) and DepthToSpace / SpaceToDepth (ops/shape.py) against ONNX Runtime:
every axis / keepdims / select_last_index combination on data full of ties, integer dtypes at
their extremes, both DepthToSpace modes and several block sizes on odd shapes, symbolic dims;
shapes the ops cannot split are refused with an error naming the node."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

import braze as bz  # noqa: E402
from braze.errors import FrontendError  # noqa: E402

_TYPES = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE,
          np.int32: TensorProto.INT32, np.int64: TensorProto.INT64, np.uint8: TensorProto.UINT8,
          np.int8: TensorProto.INT8}


def one_node(make_model, op, x_dims, dtype, out_type, opset=13, **attrs):
    node = helper.make_node(op, ["x"], ["y"], name="n0", **attrs)
    return make_model([node], [("x", _TYPES[dtype], x_dims)], [("y", out_type, None)],
                      opset=opset)


def ties(shape, dtype, seed=0):
    """Few distinct values, so most rows have several minima."""
    return np.random.default_rng(seed).integers(0, 3, shape).astype(dtype)


# -- ArgMin -------------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, -1, 2])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_min(make_model, matches_ort, axis, keepdims, last):
    shape = [3, 5, 4]
    m = one_node(make_model, "ArgMin", shape, np.float32, TensorProto.INT64, axis=axis,
                 keepdims=keepdims, select_last_index=last)
    matches_ort(m, {"x": ties(shape, np.float32)})


def test_arg_min_defaults_to_axis_0_kept(make_model, matches_ort):
    m = one_node(make_model, "ArgMin", [4, 3], np.float32, TensorProto.INT64, opset=11)
    g = matches_ort(m, {"x": np.random.default_rng(1).standard_normal((4, 3), np.float32)})
    assert g.shape_of(g.outputs[0]).dims == (1, 3)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.float64])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_min_of_other_dtypes_at_their_extremes(make_model, matches_ort, dtype, last):
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else np.finfo(dtype)
    x = ties([4, 6], dtype, seed=2)
    x[0, 1] = x[2, 3] = info.min    # -1 - x / MAX - x must not overflow at either end
    x[1, 2] = x[3, 0] = info.max
    x[1, 4] = info.max
    m = one_node(make_model, "ArgMin", [4, 6], dtype, TensorProto.INT64, axis=1,
                 select_last_index=last)
    matches_ort(m, {"x": x})


def test_arg_min_keeps_a_symbolic_dim(make_model, matches_ort):
    m = one_node(make_model, "ArgMin", ["batch", 7], np.float32, TensorProto.INT64, axis=1,
                 keepdims=0)
    g = matches_ort(m, {"x": ties([3, 7], np.float32)})
    assert g.shape_of(g.outputs[0]).dims == ("batch",)


def test_arg_min_select_last_index_on_a_symbolic_axis_is_an_error(make_model):
    m = one_node(make_model, "ArgMin", [2, "n"], np.float32, TensorProto.INT64, axis=1,
                 select_last_index=1)
    with pytest.raises(FrontendError, match="n0.*ArgMin.*select_last_index.*input_shapes"):
        bz.import_onnx(m)


# -- DepthToSpace / SpaceToDepth ----------------------------------------------------------------
def floats(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("mode", [None, "DCR", "CRD"])
@pytest.mark.parametrize("shape,block", [([1, 4, 2, 3], 2), ([2, 8, 3, 5], 2),
                                         ([2, 18, 2, 1], 3), ([1, 3, 4, 2], 1)])
def test_depth_to_space(make_model, matches_ort, mode, shape, block):
    attrs = dict(blocksize=block) | ({} if mode is None else dict(mode=mode))
    m = one_node(make_model, "DepthToSpace", shape, np.float32, TensorProto.FLOAT, **attrs)
    matches_ort(m, {"x": floats(shape)})


@pytest.mark.parametrize("shape,block", [([1, 1, 4, 6], 2), ([2, 3, 6, 4], 2),
                                         ([2, 2, 3, 9], 3), ([1, 5, 3, 3], 1)])
def test_space_to_depth(make_model, matches_ort, shape, block):
    m = one_node(make_model, "SpaceToDepth", shape, np.float32, TensorProto.FLOAT,
                 blocksize=block)
    matches_ort(m, {"x": floats(shape, seed=1)})


def test_space_to_depth_then_depth_to_space_dcr_is_the_identity(make_model):
    nodes = [helper.make_node("SpaceToDepth", ["x"], ["d"], blocksize=2),
             helper.make_node("DepthToSpace", ["d"], ["y"], blocksize=2, mode="DCR")]
    m = make_model(nodes, [("x", TensorProto.FLOAT, [2, 3, 4, 6])],
                   [("y", TensorProto.FLOAT, None)])
    x = floats([2, 3, 4, 6], seed=2)
    np.testing.assert_array_equal(bz.interpret(bz.import_onnx(m), {"x": x})[0], x)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_keeps_symbolic_dims(make_model, matches_ort, mode):
    m = one_node(make_model, "DepthToSpace", ["n", 8, "h", "w"], np.float32,
                 TensorProto.FLOAT, blocksize=2, mode=mode)
    g = matches_ort(m, {"x": floats([3, 8, 5, 2])})
    assert g.shape_of(g.outputs[0]).dims == ("n", 2, "2*h", "2*w")


def test_space_to_depth_with_a_symbolic_batch(make_model, matches_ort):
    m = one_node(make_model, "SpaceToDepth", ["n", 3, 4, 6], np.float32, TensorProto.FLOAT,
                 blocksize=2)
    g = matches_ort(m, {"x": floats([2, 3, 4, 6])})
    assert g.shape_of(g.outputs[0]).dims == ("n", 12, 2, 3)


@pytest.mark.parametrize("op,dims,attrs,message", [
    ("DepthToSpace", [1, 6, 2, 2], dict(blocksize=2), "divisible by blocksize\\^2 = 4"),
    ("DepthToSpace", [1, 8, 2, 2], dict(blocksize=2, mode="XYZ"), "mode='XYZ'"),
    ("DepthToSpace", [1, 8, 2], dict(blocksize=2), "rank-4"),
    ("DepthToSpace", [1, 8, 2, 2], dict(blocksize=0), "positive blocksize"),
    ("SpaceToDepth", [1, 3, 5, 4], dict(blocksize=2), "divisible by blocksize 2"),
    ("SpaceToDepth", [1, 3, "h", 4], dict(blocksize=2), "divisible.*input_shapes="),
])
def test_space_depth_errors_name_the_node(make_model, op, dims, attrs, message):
    m = one_node(make_model, op, dims, np.float32, TensorProto.FLOAT, **attrs)
    with pytest.raises(FrontendError, match=f"n0 \\({op}\\).*{message}"):
        bz.import_onnx(m)


def test_space_to_depth_of_a_symbolic_size_fixed_by_input_shapes(make_model, matches_ort):
    m = one_node(make_model, "SpaceToDepth", [1, 3, "h", "w"], np.float32, TensorProto.FLOAT,
                 blocksize=2)
    matches_ort(m, {"x": floats([1, 3, 4, 8])}, input_shapes={"x": (1, 3, 4, 8)})


def test_new_ops_are_listed_as_supported():
    from braze.frontends.onnx.importer import SUPPORTED_OPS

    assert {"ArgMin", "DepthToSpace", "SpaceToDepth"} <= set(SUPPORTED_OPS())


# -- TopK with NaN --------------------------------------------------------------------------------
@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("k", [2, 6])
def test_top_k_ranks_nan_as_onnx_runtime(make_model, matches_ort, largest, k):
    """ORT ranks NaN above +inf (first for the largest, last for the smallest), as torch does;
    braze's reference and kernel give the same values and indices."""
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], name="n0", axis=-1,
                            largest=largest)
    m = make_model([node], [("x", TensorProto.FLOAT, [2, 6])],
                   [("v", TensorProto.FLOAT, None), ("i", TensorProto.INT64, None)],
                   initializers=[helper.make_tensor("k", TensorProto.INT64, [1], [k])])
    x = np.array([[1, np.nan, np.inf, -1, np.nan, -np.inf],
                  [np.nan, 2, 2, np.nan, -0.0, 0.0]], np.float32)
    matches_ort(m, {"x": x})
