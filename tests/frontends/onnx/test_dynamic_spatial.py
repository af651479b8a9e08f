"""Strided windows and resizes over dynamic image sizes: an input dim declared a multiple of
the stride ("12*h+1") keeps every later size a polynomial, so one import (and one compile) runs
every such size. Each case is compared with ONNX Runtime at two sizes; sizes braze cannot keep
symbolic are import errors that name the node and the fix."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import braze as bz  # noqa: E402
from braze.errors import FrontendError, InterpretError  # noqa: E402

DIMS = ("n", 4, "12*h+1", "12*w+2")  # a multiple of both strides 2 and 3, plus a remainder
SIZES = [(1, 4, 13, 14), (2, 4, 37, 26)]


def rand(*shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def one_node(op_type, attrs, inits=(), x_dims=DIMS, name="node0"):
    names, tensors = ["x"], []
    for i, arr in enumerate(inits):
        names.append("" if arr is None else f"in{i}")
        if arr is not None:
            tensors.append(numpy_helper.from_array(np.asarray(arr), f"in{i}"))
    node = helper.make_node(op_type, names, ["y"], name=name, **attrs)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_dims))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([node], "g", [x], [y], tensors)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


def check_sizes(m, dims=DIMS, sizes=SIZES):
    """Import once with the symbolic dims, compile once, compare with ORT at every size."""
    g = bz.import_onnx(m, input_shapes={"x": dims})
    assert any(isinstance(d, str) for d in g.inputs[0].op.shape.dims[2:])
    exe = bz.compile(g, target="cpu")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    for shape in sizes:
        x = rand(*shape, seed=shape[2])
        (want,) = sess.run(None, {"x": x})
        for got in (bz.interpret(g, {"x": x})[0], exe({"x": x})[0]):
            assert got.shape == want.shape, (shape, got.shape, want.shape)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return g


CONV = {
    "strided": dict(strides=[2, 3], pads=[1, 1, 1, 1]),
    "strided_dilated": dict(strides=[2, 2], dilations=[2, 1], pads=[2, 1, 1, 0]),
    "same_upper": dict(auto_pad="SAME_UPPER", strides=[2, 2]),
    "same_lower": dict(auto_pad="SAME_LOWER", strides=[3, 2]),
    "valid": dict(auto_pad="VALID", strides=[2, 3]),
}


@pytest.mark.parametrize("case", sorted(CONV))
def test_strided_conv(case):
    g = check_sizes(one_node("Conv", CONV[case], [rand(6, 4, 3, 3), rand(6, seed=2)]))
    assert all(isinstance(d, str) for d in g.shape_of(g.outputs[0]).dims[2:])


POOL = {
    "plain": dict(kernel_shape=[2, 2], strides=[2, 2]),
    "pads": dict(kernel_shape=[3, 3], strides=[2, 3], pads=[1, 1, 1, 0]),
    "ceil": dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    "ceil_dropped_window": dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1],
                                ceil_mode=1),
    "same_upper": dict(kernel_shape=[3, 3], strides=[2, 3], auto_pad="SAME_UPPER"),
}


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("case", sorted(POOL))
def test_strided_pool(op, case):
    check_sizes(one_node(op, POOL[case]))


@pytest.mark.parametrize("attrs", [dict(strides=[2, 2]), dict(strides=[2, 3], pads=[1, 0, 0, 1]),
                                   dict(strides=[2, 2], auto_pad="SAME_UPPER")])
def test_conv_transpose(attrs):
    check_sizes(one_node("ConvTranspose", attrs, [rand(4, 3, 3, 3), rand(3, seed=3)]))


@pytest.mark.parametrize("scale,coord,nearest", [
    (2.0, "asymmetric", "floor"), (4.0, "asymmetric", "floor"), (3.0, "asymmetric", "floor"),
    (8.0, "half_pixel", "round_prefer_floor"), (2.0, "pytorch_half_pixel", "round_prefer_ceil"),
    (2.0, "align_corners", "round_prefer_floor"),
])
def test_nearest_upsampling(scale, coord, nearest):
    attrs = dict(mode="nearest", coordinate_transformation_mode=coord, nearest_mode=nearest)
    scales = np.asarray([1, 1, scale, scale], np.float32)
    g = check_sizes(one_node("Resize", attrs, [None, scales]))
    out = g.shape_of(g.outputs[0]).dims[2:]
    assert out == (f"{int(12 * scale)}*h+{int(scale)}", f"{int(12 * scale)}*w+{int(2 * scale)}")
    # the exact 2x case keeps its own kind; align_corners' float32 table is i // 2 only for
    # small lengths, so it stays a general resize
    assert g.count("resize_nearest_2x") == int(scale == 2.0 and coord != "align_corners")


@pytest.mark.parametrize("mode,coord", [("linear", "half_pixel"), ("linear", "align_corners"),
                                        ("linear", "pytorch_half_pixel"),
                                        ("cubic", "half_pixel"), ("linear", "asymmetric")])
@pytest.mark.parametrize("scale", [2.0, 0.5, 1.5])
def test_interpolating_resizes(mode, coord, scale):
    dims = ("n", 4, "12*h+2", "12*w+4")  # even, so a half keeps a polynomial
    sizes = [(1, 4, 14, 16), (2, 4, 26, 40)]
    attrs = dict(mode=mode, coordinate_transformation_mode=coord)
    g = check_sizes(one_node("Resize", attrs, [None, np.asarray([1, 1, scale, scale],
                                                                np.float32)]), dims, sizes)
    assert g.count("resize") == 1


def test_resize_to_sizes_read_from_another_tensors_shape():
    """sizes = Shape(y)[2:] of a second input: an FPN's upsampling to its lateral's size."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, "2*h", "2*w"])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Shape", ["y"], ["ys"]),
             helper.make_node("Resize", ["x", "", "", "ys"], ["up"], mode="linear"),
             helper.make_node("Add", ["up", "y"], ["out"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [x, y], [out]),
                          opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    g = bz.import_onnx(m, input_shapes={"x": ("n", 4, "h", "w"), "y": ("n", 4, "2*h", "2*w")})
    exe = bz.compile(g, target="cpu")
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for n, h, w in ((1, 3, 5), (2, 6, 4)):
        feeds = {"x": rand(n, 4, h, w), "y": rand(n, 4, 2 * h, 2 * w, seed=2)}
        np.testing.assert_allclose(exe(feeds)[0], sess.run(None, feeds)[0], rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("scales", [[1, 1, 0.625, 0.625], [1, 1, 1 / 3, 1 / 3],
                                    [1, 1, 0.125, 0.125]])
def test_a_resize_whose_size_is_not_a_polynomial_names_the_fix(scales):
    m = one_node("Resize", dict(mode="linear"), [None, np.asarray(scales, np.float32)],
                 name="up7")
    with pytest.raises(FrontendError, match=r"up7.*not a polynomial size.*input_shapes="):
        bz.import_onnx(m, input_shapes={"x": DIMS})


def test_a_stride_the_declared_multiple_does_not_cover_names_the_fix():
    m = one_node("Conv", dict(strides=[5, 5]), [rand(6, 4, 3, 3)], name="conv9")
    with pytest.raises(FrontendError, match=r"conv9.*stride 5 needs H static or declared a "
                                            r"multiple of the stride.*\"32\*h\""):
        bz.import_onnx(m, input_shapes={"x": DIMS})
    plain = one_node("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
                     x_dims=(1, 4, "h", "w"), name="pool3")
    with pytest.raises(FrontendError, match=r"pool3.*ceil_mode=1 needs each spatial dim static "
                                            r"or a multiple of the stride 2"):
        bz.import_onnx(plain)


def test_a_size_that_is_not_of_the_declared_form_is_refused_at_run_time():
    g = bz.import_onnx(one_node("Conv", CONV["strided"], [rand(6, 4, 3, 3)]),
                       input_shapes={"x": DIMS})
    exe = bz.compile(g, target="cpu")
    with pytest.raises(InterpretError, match=r"dim 12\*h\+1 must be of the form 12\*h\+1 for a "
                                             r"whole h >= 0, but was fed 14"):
        exe({"x": rand(1, 4, 14, 14)})
    with pytest.raises(InterpretError, match="must be a multiple of 32, but was fed 33"):
        bz.interpret(bz.import_onnx(one_node("MaxPool", POOL["plain"]),
                                    input_shapes={"x": (1, 4, "32*h", 8)}),
                     {"x": rand(1, 4, 33, 8)})


def _shape_model(nodes, consts, x_dims):
    inits = [numpy_helper.from_array(np.asarray(v, np.int64), k) for k, v in consts.items()]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_dims))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                             opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_window_padding_computed_with_mod_from_a_multiple_of_the_window():
    """Swin's pad = (win - W % win) % win from Shape -> Gather -> Mod (plus W - W // win * win):
    over "8*w" and a window of 4 both are 0 for every size, over "8*w+2" 2 each; the shape
    arithmetic folds at import and the pad is static."""
    nodes = [helper.make_node("Shape", ["x"], ["shp"]),
             helper.make_node("Gather", ["shp", "i3"], ["W"], axis=0),
             helper.make_node("Mod", ["W", "win"], ["r"]),
             helper.make_node("Sub", ["win", "r"], ["s"]),
             helper.make_node("Mod", ["s", "win"], ["p"]),
             helper.make_node("Div", ["W", "win"], ["blocks"]),
             helper.make_node("Mul", ["blocks", "win"], ["whole"]),
             helper.make_node("Sub", ["W", "whole"], ["p2"]),
             helper.make_node("Add", ["p", "p2"], ["p3"]),
             helper.make_node("Unsqueeze", ["p3", "ax"], ["p1"]),
             helper.make_node("Concat", ["z", "p1"], ["pads"], axis=0),
             helper.make_node("Pad", ["x", "pads"], ["y"])]
    for win, dims, pad in ((4, ("n", 4, "8*h", "8*w"), 0), (4, ("n", 4, "8*h", "8*w+2"), 4)):
        m = _shape_model(nodes, {"i3": 3, "win": win, "ax": [0], "z": [0] * 7}, dims)
        g = bz.import_onnx(m, input_shapes={"x": dims})
        assert g.shape_of(g.outputs[0]).dims[3] == (bz.ir.symbolic.SymDim.of(dims[3]) + pad
                                                    ).to_dim()
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        for w in (1, 3):
            x = rand(2, 4, 16, 8 * w + (2 if "+2" in dims[3] else 0))
            np.testing.assert_array_equal(bz.compile(g)({"x": x})[0],
                                          sess.run(None, {"x": x})[0])


@pytest.mark.parametrize("start,step", [(1, 2), (0, 2), (3, 4), (1, 8)])
def test_strided_slice_of_a_multiple(start, step):
    """x[..., start::step] of a "16*w" axis has ceil((16w - start) / step) elements, a
    polynomial when the step divides 16."""
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])]
    m = _shape_model(nodes, {"st": [start], "en": [2 ** 62], "ax": [3], "sp": [step]},
                     ("n", 4, 5, "16*w"))
    g = bz.import_onnx(m, input_shapes={"x": ("n", 4, 5, "16*w")})
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for w in (1, 3):
        x = rand(2, 4, 5, 16 * w)
        np.testing.assert_array_equal(bz.compile(g)({"x": x})[0], sess.run(None, {"x": x})[0])


def test_the_fix_named_for_an_audio_input_declares_its_length_a_multiple():
    """[N, L] samples into a strided Conv1d: the hint makes L (not a channel axis) a
    multiple, and the form it names imports."""
    axes = numpy_helper.from_array(np.asarray([1], np.int64), "axes")
    w = numpy_helper.from_array(rand(4, 1, 10), "w")
    nodes = [helper.make_node("Unsqueeze", ["x", "axes"], ["x3"]),
             helper.make_node("Conv", ["x3", "w"], ["y"], strides=[5], name="conv5")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "len"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [axes, w]),
                          opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    hint = r'conv5.*input_shapes=\{"x": \("batch", "32\*w"\)\}'
    with pytest.raises(FrontendError, match=hint):
        bz.import_onnx(m)
    g = bz.import_onnx(m, input_shapes={"x": ("batch", "5*w")})
    assert g.outputs and bz.interpret(g, {"x": rand(2, 60)})[0].shape == (2, 4, 11)
