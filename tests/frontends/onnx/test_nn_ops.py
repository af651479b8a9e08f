"""ONNX CNN ops (braze/frontends/onnx/ops/nn.py): for each op and attribute combination a
one-node ONNX model is imported, run with the reference interpreter and compared with ONNX
Runtime on random inputs; bad attributes and dynamic spatial dims raise errors that name the
node (training-mode BatchNormalization: test_batch_norm_training.py)."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import braze as bz  # noqa: E402
from braze.errors import FrontendError  # noqa: E402

RTOL = ATOL = 1e-5
_ONNX_TYPES = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE,
               np.float16: TensorProto.FLOAT16,
               np.int64: TensorProto.INT64, np.int32: TensorProto.INT32,
               np.uint8: TensorProto.UINT8}


def model(op_type, x_shape, *, attrs=None, inits=(), opset=19, n_out=1, x_dims=None,
          dtype=np.float32, name="node0"):
    """A one-node model: input "x" (dims `x_dims` or `x_shape`), then initializers in order
    (None leaves an optional input empty); outputs y0.."""
    names = ["x"]
    tensors = []
    for i, arr in enumerate(inits):
        if arr is None:
            names.append("")
            continue
        tensors.append(numpy_helper.from_array(np.asarray(arr), f"in{i + 1}"))
        names.append(f"in{i + 1}")
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op_type, names, outs, name=name, **(attrs or {}))
    x = helper.make_tensor_value_info("x", _ONNX_TYPES[dtype], x_dims or x_shape)
    ys = [helper.make_tensor_value_info(o, _ONNX_TYPES[dtype], None) for o in outs]
    graph = helper.make_graph([node], "g", [x], ys, tensors)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=9)


def ort_run(m, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check(m, x_shape, *, dtype=np.float32, seed=0, input_shapes=None, rtol=RTOL, atol=ATOL,
          data=None):
    """Import `m`, run braze and ORT on the same random input, compare; returns the graph."""
    rng = np.random.default_rng(seed)
    x = data if data is not None else (rng.standard_normal(x_shape).astype(dtype)
                                       if np.dtype(dtype).kind == "f"
                                       else rng.integers(0, 50, x_shape).astype(dtype))
    g = bz.import_onnx(m, input_shapes=input_shapes)
    ours = bz.interpret(g, {"x": x})
    ref = ort_run(m, {"x": x})
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        assert a.shape == b.shape, (a.shape, b.shape)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    return g


def rand(*shape, seed=1, positive=False):
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return np.abs(a) + 0.5 if positive else a


# -- Conv ---------------------------------------------------------------------------------------
CONV_CASES = {
    "plain": dict(),
    "pads": dict(pads=[1, 2, 0, 1]),
    "strided": dict(strides=[2, 3], pads=[1, 1, 1, 1]),
    "dilated": dict(dilations=[2, 1], pads=[2, 1, 2, 1]),
    "same_upper": dict(auto_pad="SAME_UPPER", strides=[2, 2]),
    "same_lower": dict(auto_pad="SAME_LOWER", strides=[2, 2]),
    "same_upper_s1": dict(auto_pad="SAME_UPPER"),
    "valid": dict(auto_pad="VALID", strides=[2, 1]),
    "kernel_shape": dict(kernel_shape=[3, 3]),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
@pytest.mark.parametrize("bias", [True, False])
def test_conv2d(case, bias):
    w, b = rand(6, 4, 3, 3), rand(6, seed=2)
    m = model("Conv", [2, 4, 9, 10], attrs=CONV_CASES[case], inits=[w, b] if bias else [w])
    g = check(m, [2, 4, 9, 10])
    assert g.count("conv2d") == 1


@pytest.mark.parametrize("group,cin,cout", [(2, 4, 6), (4, 4, 4), (4, 4, 8)])
def test_grouped_and_depthwise_conv(group, cin, cout):
    w = rand(cout, cin // group, 3, 3)
    m = model("Conv", [1, cin, 7, 7], attrs=dict(group=group, pads=[1, 1, 1, 1]),
              inits=[w, rand(cout)])
    check(m, [1, cin, 7, 7])


@pytest.mark.parametrize("attrs", [dict(), dict(pads=[2, 1], strides=[2]),
                                   dict(auto_pad="SAME_UPPER", dilations=[1]),
                                   dict(group=2, strides=[3])])
def test_conv1d_runs_as_2d_with_a_unit_axis(attrs):
    w = rand(4, 4 // attrs.get("group", 1), 3)
    m = model("Conv", [2, 4, 11], attrs=attrs, inits=[w, rand(4)])
    g = check(m, [2, 4, 11])
    conv = next(n for n in g.nodes if n.op.kind == "conv2d")
    assert g.shape_of(conv.inputs[0]).dims[2] == 1
    weight = g.node(conv.inputs[1])
    assert weight.op.kind == "param" and weight.op.name.endswith(".2d")


@pytest.mark.parametrize("auto_pad,pads", [("SAME_LOWER", [2, 1, 1, 1]),
                                           ("SAME_UPPER", [1, 1, 2, 1])])
def test_dilated_same_padding_equals_its_explicit_pads(auto_pad, pads):
    """ORT refuses dilated SAME convs; the padding is ONNX's: total = dilation * (k - 1), the
    odd element at the end (upper) or start (lower)."""
    w = rand(4, 3, 2, 2)
    same = model("Conv", [1, 3, 8, 9], attrs=dict(auto_pad=auto_pad, dilations=[3, 2]),
                 inits=[w])
    explicit = model("Conv", [1, 3, 8, 9], attrs=dict(pads=pads, dilations=[3, 2]), inits=[w])
    x = rand(1, 3, 8, 9, seed=3)
    ours = bz.interpret(bz.import_onnx(same), {"x": x})[0]
    np.testing.assert_allclose(ours, ort_run(explicit, {"x": x})[0], rtol=RTOL, atol=ATOL)


def test_conv_keeps_symbolic_spatial_dims_when_stride_1_same():
    m = model("Conv", None, x_dims=["n", 3, "h", "w"], attrs=dict(pads=[1, 1, 1, 1]),
              inits=[rand(5, 3, 3, 3)])
    g = check(m, [2, 3, 6, 7])
    assert g.shape_of(g.outputs[0]).dims == ("n", 5, "h", "w")


def test_conv_with_dynamic_spatial_dims_says_to_pass_input_shapes():
    m = model("Conv", None, x_dims=["n", 3, "h", "w"], attrs=dict(strides=[2, 2]),
              inits=[rand(5, 3, 3, 3)], name="stem_conv")
    with pytest.raises(FrontendError, match=r"stem_conv.*input_shapes=\{\"x\": \(1, 3, "):
        bz.import_onnx(m)
    check(m, [1, 3, 16, 20], input_shapes={"x": (1, 3, 16, 20)})


def test_same_padding_with_stride_and_dynamic_dims_is_an_actionable_error():
    m = model("Conv", None, x_dims=[1, 3, "h", "w"], attrs=dict(auto_pad="SAME_UPPER",
                                                               strides=[2, 2]),
              inits=[rand(5, 3, 3, 3)], name="same_conv")
    with pytest.raises(FrontendError, match="same_conv.*input_shapes="):
        bz.import_onnx(m)


@pytest.mark.parametrize("attrs,msg", [
    (dict(auto_pad="SAME"), "unknown auto_pad"),
    (dict(strides=[1, 1, 1]), "strides"),
    (dict(kernel_shape=[5, 5]), "kernel_shape"),
    (dict(pads=[1, 1]), "pads"),
])
def test_conv_bad_attributes_name_the_node(attrs, msg):
    m = model("Conv", [1, 3, 8, 8], attrs=attrs, inits=[rand(4, 3, 3, 3)], name="bad_conv")
    with pytest.raises(FrontendError, match=f"bad_conv.*{msg}"):
        bz.import_onnx(m)


def test_conv3d_is_rejected_by_name():
    m = model("Conv", [1, 2, 4, 4, 4], inits=[rand(2, 2, 1, 1, 1)], name="c3d")
    with pytest.raises(FrontendError, match="c3d.*3-D"):
        bz.import_onnx(m)


# -- ConvTranspose ------------------------------------------------------------------------------
CONVT_CASES = {
    "plain": dict(),
    "stride2": dict(strides=[2, 2]),
    "pads": dict(strides=[2, 2], pads=[1, 0, 0, 1]),
    "output_padding": dict(strides=[2, 3], output_padding=[1, 2]),
    "dilated": dict(dilations=[2, 1], strides=[2, 2]),
    "output_shape": dict(strides=[2, 2], output_shape=[10, 9]),
    "output_shape_upper": dict(strides=[2, 2], output_shape=[10, 10], auto_pad="SAME_UPPER"),
    "output_shape_grows": dict(strides=[2, 2], output_shape=[12, 12]),
    "same_upper": dict(strides=[2, 2], auto_pad="SAME_UPPER"),
    "same_lower": dict(strides=[2, 2], auto_pad="SAME_LOWER"),
    "valid": dict(strides=[2, 2], auto_pad="VALID"),
}


@pytest.mark.parametrize("case", sorted(CONVT_CASES))
def test_conv_transpose2d(case):
    m = model("ConvTranspose", [2, 4, 5, 5], attrs=CONVT_CASES[case],
              inits=[rand(4, 3, 3, 3), rand(3, seed=3)])
    g = check(m, [2, 4, 5, 5])
    assert g.count("conv_transpose2d") == 1


def test_grouped_conv_transpose_and_1d():
    m = model("ConvTranspose", [1, 4, 5, 6], attrs=dict(group=2, strides=[2, 1]),
              inits=[rand(4, 3, 2, 2)])
    check(m, [1, 4, 5, 6])
    m = model("ConvTranspose", [2, 3, 7], attrs=dict(strides=[2], pads=[1, 0]),
              inits=[rand(3, 2, 4), rand(2)])
    check(m, [2, 3, 7])


def test_conv_transpose_with_output_shape_and_dynamic_spatial_dims_says_to_pass_input_shapes():
    m = model("ConvTranspose", None, x_dims=[1, 4, "h", "w"],
              attrs=dict(strides=[2, 2], output_shape=[9, 9]), inits=[rand(4, 3, 2, 2)],
              name="up")
    with pytest.raises(FrontendError, match="up.*output_shape.*input_shapes="):
        bz.import_onnx(m)


# -- BatchNormalization, Instance / GroupNormalization, LpNormalization -------------------------
@pytest.mark.parametrize("shape", [[2, 5, 4, 3], [3, 5], [2, 5, 7]])
def test_batch_norm_inference(shape):
    c = shape[1]
    m = model("BatchNormalization", shape, attrs=dict(epsilon=1e-3),
              inits=[rand(c), rand(c, seed=2), rand(c, seed=3), rand(c, seed=4, positive=True)])
    g = check(m, shape)
    assert g.count("batch_norm") == 1


@pytest.mark.parametrize("shape", [[2, 3, 5, 4], [2, 3, 6]])
def test_instance_norm(shape):
    m = model("InstanceNormalization", shape, attrs=dict(epsilon=1e-4),
              inits=[rand(3), rand(3, seed=5)])
    check(m, shape)


@pytest.mark.parametrize("opset", [18, 21])  # 18: scale / bias per group; 21: per channel
@pytest.mark.parametrize("shape, groups", [([2, 6, 5, 4], 3), ([2, 6, 7], 2), ([1, 6, 3, 3], 6),
                                           ([2, 4, 5, 3], 1)])
def test_group_norm(shape, groups, opset):
    n = groups if opset < 21 else shape[1]
    m = model("GroupNormalization", shape, attrs=dict(epsilon=1e-4, num_groups=groups),
              inits=[rand(n, seed=4), rand(n, seed=5)], opset=opset)
    g = check(m, shape)
    assert g.count("group_norm") == 1
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(bz.compile(g)({"x": x})[0], ort_run(m, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)


def test_group_norm_of_float16_runs_its_statistics_in_float32():
    """stash_type 1 (the default): normalized in float32, cast back, then scaled."""
    m = model("GroupNormalization", [2, 6, 5, 4], attrs=dict(num_groups=3), opset=21,
              inits=[rand(6, seed=4).astype(np.float16), rand(6, seed=5).astype(np.float16)],
              dtype=np.float16)
    g = check(m, [2, 6, 5, 4], dtype=np.float16, rtol=2e-3, atol=2e-3)
    assert g.count("group_norm") == 1 and g.count("cast") == 2


@pytest.mark.parametrize("groups, scale, match", [(4, 4, "num_groups 4 does not divide"),
                                                  (3, 6, r"scale has shape \(6,\); opset 18")])
def test_group_norm_errors_name_the_node(groups, scale, match):
    m = model("GroupNormalization", [1, 6, 4, 4], attrs=dict(num_groups=groups),
              inits=[rand(scale), rand(scale)], opset=18, name="gn")
    with pytest.raises(FrontendError, match=f"gn.*{match}"):
        bz.import_onnx(m)


@pytest.mark.parametrize("axis, scale, bias", [
    (-1, [4], [4]), (1, [3, 4], [3, 4]), (-2, [1, 4], [3, 1]), (1, [4], None), (-2, [4], [1])],
    ids=["last", "two axes", "broadcast [1, D] / [S, 1]", "no bias", "broadcast [D] / [1]"])
def test_layer_norm(axis, scale, bias):
    """Scale and bias of the normalized shape, or broadcasting to it (ONNX's function body
    multiplies with broadcasting; ONNX Runtime takes them)."""
    inits = [rand(*scale, seed=4)] + ([rand(*bias, seed=5)] if bias else [])
    m = model("LayerNormalization", [2, 3, 4], attrs=dict(axis=axis, epsilon=1e-4),
              inits=inits, opset=17)
    g = check(m, [2, 3, 4])
    assert g.count("layer_norm") == 1
    x = np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(bz.compile(g)({"x": x})[0], ort_run(m, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)


def _lrn_spec(x, size, alpha=1e-4, beta=0.75, bias=1.0):
    """ONNX's LRN formula, channel by channel."""
    sq, out = x.astype(np.float64) ** 2, np.empty_like(x)
    for c in range(x.shape[1]):
        lo, hi = max(0, c - (size - 1) // 2), min(x.shape[1], c + -(-(size - 1) // 2) + 1)
        out[:, c] = x[:, c] / (bias + alpha / size * sq[:, lo:hi].sum(axis=1)) ** beta
    return out


@pytest.mark.parametrize("shape, attrs", [
    ([2, 7, 5, 4], dict(size=5)), ([1, 6, 3, 2], dict(size=3, alpha=0.02, beta=0.6, bias=2.0)),
    ([2, 3, 2, 2], dict(size=1)), ([1, 6, 3], dict(size=3, alpha=0.5)),
    ([1, 5, 4, 4], dict(size=4, alpha=0.3))], ids=["5", "3 attrs", "1", "3-d", "even size"])
def test_lrn(shape, attrs):
    """Against ONNX Runtime where it runs LRN (4-d, an odd size), else the spec's formula."""
    m = model("LRN", shape, attrs=attrs)
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    if len(shape) == 4 and attrs["size"] % 2:
        g = check(m, shape)
        want = ort_run(m, {"x": x})[0]
    else:
        g = bz.import_onnx(m)
        want = _lrn_spec(x, **attrs)
        np.testing.assert_allclose(bz.interpret(g, {"x": x})[0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bz.compile(g)({"x": x})[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("p,axis", [(2, -1), (1, 1), (2, 0)])
def test_lp_norm(p, axis):
    x = rand(3, 4, 5, seed=7)
    x[0, 0, :] = 0.0  # a zero row along the last axis
    m = model("LpNormalization", [3, 4, 5], attrs=dict(p=p, axis=axis))
    check(m, [3, 4, 5], data=x)


# -- pooling ------------------------------------------------------------------------------------
POOL_CASES = {
    "plain": dict(kernel_shape=[2, 2], strides=[2, 2]),
    "overlap": dict(kernel_shape=[3, 3], strides=[1, 2]),
    "pads": dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 0]),
    "ceil": dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    "ceil_pads": dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
    "ceil_dropped_window": dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1],
                                ceil_mode=1),
    "same_upper": dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
    "same_lower": dict(kernel_shape=[2, 3], strides=[2, 2], auto_pad="SAME_LOWER"),
    "valid": dict(kernel_shape=[2, 2], strides=[1, 1], auto_pad="VALID"),
}


@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_max_pool(case):
    check(model("MaxPool", [2, 3, 9, 9], attrs=POOL_CASES[case]), [2, 3, 9, 9])


@pytest.mark.parametrize("case", sorted(POOL_CASES))
@pytest.mark.parametrize("include", [0, 1])
def test_average_pool(case, include):
    attrs = dict(POOL_CASES[case], count_include_pad=include)
    check(model("AveragePool", [2, 3, 9, 9], attrs=attrs), [2, 3, 9, 9])


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pool1d(op):
    attrs = dict(kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1)
    if op == "AveragePool":
        attrs["count_include_pad"] = 1
    check(model(op, [2, 3, 10], attrs=attrs), [2, 3, 10])


def test_max_pool_storage_order_and_integer_input():
    m = model("MaxPool", [1, 2, 6, 6], attrs=dict(kernel_shape=[2, 2], storage_order=1),
              dtype=np.uint8)
    check(m, [1, 2, 6, 6], dtype=np.uint8)


def test_max_pool_indices_output_is_an_error_naming_the_node():
    m = model("MaxPool", [1, 2, 6, 6], attrs=dict(kernel_shape=[2, 2]), n_out=2, name="mp")
    with pytest.raises(FrontendError, match="mp.*Indices"):
        bz.import_onnx(m)


@pytest.mark.parametrize("op,attrs,msg", [
    ("MaxPool", dict(kernel_shape=[2, 2], dilations=[2, 2]), "dilations"),
    ("MaxPool", dict(strides=[2, 2]), "kernel_shape"),
    ("AveragePool", dict(kernel_shape=[2, 2], auto_pad="FOO"), "auto_pad"),
    ("AveragePool", dict(kernel_shape=[2, 2], pads=[2, 0, 0, 0]), "smaller than the kernel"),
])
def test_pool_bad_attributes_name_the_node(op, attrs, msg):
    m = model(op, [1, 2, 6, 6], attrs=attrs, name="pool7")
    with pytest.raises(FrontendError, match=f"pool7.*{msg}"):
        bz.import_onnx(m)


def test_ceil_mode_pool_with_dynamic_dims_says_to_pass_input_shapes():
    m = model("MaxPool", None, x_dims=[1, 3, "h", "w"],
              attrs=dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), name="pool")
    with pytest.raises(FrontendError, match="pool.*input_shapes="):
        bz.import_onnx(m)


@pytest.mark.parametrize("shape", [[2, 3, 5, 4], [2, 3, 7], [1, 2, 3, 4, 2]])
@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pools(op, shape):
    g = check(model(op, shape), shape)
    if op == "GlobalAveragePool" and len(shape) == 4:
        assert g.count("global_avg_pool") == 1


def test_global_average_pool_keeps_symbolic_spatial_dims():
    m = model("GlobalAveragePool", None, x_dims=["n", 4, "h", "w"])
    g = check(m, [2, 4, 5, 3])
    assert g.shape_of(g.outputs[0]).dims == ("n", 4, 1, 1)


# -- Resize / Upsample --------------------------------------------------------------------------
_COORDS = ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
           "tf_half_pixel_for_nn", "half_pixel_symmetric"]
_NEAREST = ["floor", "round_prefer_floor", "round_prefer_ceil", "ceil"]
_SCALES = {"up2": [1, 1, 2, 2], "up_frac": [1, 1, 1.5, 2.5], "down": [1, 1, 0.5, 0.6],
           "mixed": [1, 1, 3, 0.75]}


def resize_model(x_shape, attrs, scales=None, sizes=None, opset=19, axes_inputs=None,
                 name="resize0"):
    roi = np.zeros(0, np.float32)
    inits = [roi, np.asarray(scales, np.float32) if scales is not None else
             np.zeros(0, np.float32)]
    if sizes is not None:
        inits.append(np.asarray(sizes, np.int64))
    return model("Resize", x_shape, attrs=attrs, inits=inits, opset=opset, name=name)


@pytest.mark.parametrize("scales", sorted(_SCALES))
@pytest.mark.parametrize("coord", _COORDS)
@pytest.mark.parametrize("nearest", _NEAREST)
def test_resize_nearest(scales, coord, nearest):
    m = resize_model([1, 2, 6, 8], dict(mode="nearest", coordinate_transformation_mode=coord,
                                        nearest_mode=nearest), scales=_SCALES[scales])
    check(m, [1, 2, 6, 8])


@pytest.mark.parametrize("scales", sorted(_SCALES))
@pytest.mark.parametrize("coord", _COORDS)
@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_linear_and_cubic(scales, coord, mode):
    m = resize_model([2, 3, 5, 7], dict(mode=mode, coordinate_transformation_mode=coord),
                     scales=_SCALES[scales])
    check(m, [2, 3, 5, 7])


@pytest.mark.parametrize("attrs", [dict(cubic_coeff_a=-0.5), dict(exclude_outside=1),
                                   dict(exclude_outside=1, cubic_coeff_a=-0.6,
                                        coordinate_transformation_mode="asymmetric")])
def test_resize_cubic_options(attrs):
    m = resize_model([1, 2, 6, 5], dict(mode="cubic", **attrs), sizes=[1, 2, 9, 3])
    check(m, [1, 2, 6, 5])


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("sizes", [[1, 3, 12, 5], [1, 3, 4, 16], [1, 3, 1, 1]])
def test_resize_to_sizes(mode, sizes):
    m = resize_model([1, 3, 6, 8], dict(mode=mode,
                                        coordinate_transformation_mode="pytorch_half_pixel"),
                     sizes=sizes)
    check(m, [1, 3, 6, 8])


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_resize_keep_aspect_ratio_policy(policy):
    m = resize_model([1, 2, 6, 8], dict(mode="linear", keep_aspect_ratio_policy=policy,
                                        axes=[2, 3]), sizes=[9, 10])
    check(m, [1, 2, 6, 8])


def test_resize_axes_attribute_with_scales():
    m = resize_model([1, 2, 5, 6], dict(mode="linear", axes=[3, 2]), scales=[2.0, 1.5])
    check(m, [1, 2, 5, 6])


@pytest.mark.parametrize("opset", [11, 13])
def test_resize_older_opsets(opset):
    m = resize_model([1, 2, 4, 5], dict(mode="linear", coordinate_transformation_mode=
                                        "align_corners"), scales=[1, 1, 2, 3], opset=opset)
    check(m, [1, 2, 4, 5])


def test_resize_1d():
    m = resize_model([2, 3, 7], dict(mode="linear"), scales=[1, 1, 2.5])
    check(m, [2, 3, 7])


@pytest.mark.parametrize("coord,nearest,exact", [
    ("asymmetric", "floor", True), ("asymmetric", "round_prefer_floor", True),
    ("half_pixel", "round_prefer_floor", True), ("half_pixel", "round_prefer_ceil", True),
    ("tf_half_pixel_for_nn", "floor", True), ("asymmetric", "ceil", False),
    ("align_corners", "round_prefer_floor", True), ("align_corners", "floor", False),
])
def test_resize_nearest_2x_becomes_the_2x_kind_only_when_exact(coord, nearest, exact):
    m = resize_model([1, 2, 5, 6], dict(mode="nearest", coordinate_transformation_mode=coord,
                                        nearest_mode=nearest), scales=[1, 1, 2, 2])
    g = check(m, [1, 2, 5, 6])
    assert (g.count("resize_nearest_2x"), g.count("resize")) == ((1, 0) if exact else (0, 1))


def test_resize_nearest_of_integers():
    m = resize_model([1, 2, 4, 4], dict(mode="nearest"), scales=[1, 1, 1.5, 3])
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.INT32
    m.graph.output[0].type.tensor_type.elem_type = TensorProto.INT32
    check(m, [1, 2, 4, 4], dtype=np.int32)


def test_resize_identity_is_no_op():
    m = resize_model([1, 2, 4, 4], dict(mode="linear"), scales=[1, 1, 1, 1])
    g = check(m, [1, 2, 4, 4])
    assert g.count("resize") == 0


@pytest.mark.parametrize("attrs,kw,msg", [
    (dict(mode="area"), dict(scales=[1, 1, 2, 2]), "mode='area'"),
    (dict(coordinate_transformation_mode="tf_crop_and_resize"), dict(scales=[1, 1, 2, 2]),
     "tf_crop_and_resize"),
    (dict(nearest_mode="nearest"), dict(scales=[1, 1, 2, 2]), "nearest_mode"),
    (dict(), dict(scales=[1, 2, 2, 2]), "batch / channels"),
    (dict(), dict(sizes=[1, 3, 8, 8]), "batch / channels"),
    (dict(mode="linear", antialias=1), dict(scales=[1, 1, 0.5, 0.5]), "antialias"),
    (dict(), dict(), "exactly one of scales and sizes"),
])
def test_resize_bad_attributes_name_the_node(attrs, kw, msg):
    m = resize_model([1, 2, 4, 4], attrs, **kw, name="rs")
    with pytest.raises(FrontendError, match=f"rs.*{msg}"):
        bz.import_onnx(m)


def test_resize_with_dynamic_spatial_dims_says_to_pass_input_shapes():
    m = model("Resize", None, x_dims=["n", 3, "h", "w"], name="up8",
              inits=[np.zeros(0, np.float32), np.asarray([1, 1, 1.5, 1.5], np.float32)])
    with pytest.raises(FrontendError, match=r"up8.*input_shapes=\{\"x\": \(1, 3, 224, 224\)"):
        bz.import_onnx(m)


def test_resize_to_static_sizes_from_a_dynamic_input():
    m = resize_model(None, dict(mode="linear"), sizes=[1, 3, 6, 6])
    m.graph.input[0].type.tensor_type.shape.Clear()
    for d in (1, 3, "h", "w"):
        dim = m.graph.input[0].type.tensor_type.shape.dim.add()
        if isinstance(d, int):
            dim.dim_value = d
        else:
            dim.dim_param = d
    g = check(m, [1, 3, 4, 9])
    assert g.shape_of(g.outputs[0]).dims == (1, 3, 6, 6)


@pytest.mark.parametrize("mode,scales", [("nearest", [1, 1, 2, 3]), ("linear", [1, 1, 2, 1.5]),
                                         ("nearest", [1, 1, 2, 2])])
def test_upsample_is_asymmetric_resize(mode, scales):
    """Upsample (deprecated since opset 10) means Resize with asymmetric coordinates and
    nearest rounding down; ORT only runs it under opset 9, so compare with that Resize."""
    m = model("Upsample", [1, 2, 4, 5], attrs=dict(mode=mode),
              inits=[np.asarray(scales, np.float32)], opset=11)
    ref = resize_model([1, 2, 4, 5], dict(mode=mode, coordinate_transformation_mode="asymmetric",
                                          nearest_mode="floor"), scales=scales)
    x = rand(1, 2, 4, 5, seed=9)
    ours = bz.interpret(bz.import_onnx(m), {"x": x})[0]
    np.testing.assert_allclose(ours, ort_run(ref, {"x": x})[0], rtol=RTOL, atol=ATOL)
    old = model("Upsample", [1, 2, 4, 5], attrs=dict(mode=mode),
                inits=[np.asarray(scales, np.float32)], opset=9)
    np.testing.assert_allclose(ours, ort_run(old, {"x": x})[0], rtol=RTOL, atol=ATOL)


# -- Pad ----------------------------------------------------------------------------------------
PAD_CASES = {
    "constant": ("constant", [0, 1, 2, 1, 0, 0, 1, 3], 1.5),
    "constant_default": ("constant", [1, 0, 0, 2, 0, 1, 1, 0], None),
    "reflect": ("reflect", [0, 0, 2, 1, 0, 0, 1, 3], None),
    "edge": ("edge", [0, 1, 3, 1, 1, 0, 2, 4], None),
    "wrap": ("wrap", [0, 0, 2, 1, 0, 0, 1, 3], None),
    "negative": ("constant", [0, 0, -1, 2, 0, 0, 1, -2], 0.25),
    "negative_reflect": ("reflect", [0, 0, -1, 2, 0, 0, 1, -2], None),
}


@pytest.mark.parametrize("case", sorted(PAD_CASES))
def test_pad(case):
    mode, pads, value = PAD_CASES[case]
    inits = [np.asarray(pads, np.int64)]
    if value is not None:
        inits.append(np.asarray(value, np.float32))
    m = model("Pad", [2, 3, 4, 5], attrs=dict(mode=mode), inits=inits)
    g = check(m, [2, 3, 4, 5])
    if mode in ("reflect", "edge"):
        (p,) = [n for n in g.nodes if n.op.kind == "pad"]
        assert p.op.mode.value == mode


def test_pad_with_axes_input():
    m = model("Pad", [2, 3, 4, 5], attrs=dict(mode="edge"),
              inits=[np.asarray([1, 2, 3, 0], np.int64), None, np.asarray([-1, 1], np.int64)])
    check(m, [2, 3, 4, 5])


def test_pad_integer_constant():
    m = model("Pad", [2, 3], inits=[np.asarray([1, 0, 0, 2], np.int64),
                                    np.asarray(7, np.int64)], dtype=np.int64)
    check(m, [2, 3], dtype=np.int64)


def test_pad_attributes_form_is_refused_at_opset_11():
    """Pad-2 kept pads as attributes; from opset 11 they are inputs, and an old-form node in a
    newer model is malformed: the error names the node and what ONNX's schema expects."""
    m = model("Pad", [2, 3, 4], attrs=dict(mode="reflect", pads=[0, 1, 2, 0, 1, 1]), opset=11)
    m.opset_import[0].version = 11
    with pytest.raises(bz.FrontendError, match=r"\(Pad\) has 1 inputs; ONNX's Pad-11 takes"):
        bz.import_onnx(m)


def test_pad_of_symbolic_dims_constant_mode():
    m = model("Pad", None, x_dims=["n", 3], inits=[np.asarray([0, 1, 0, 2], np.int64)])
    g = check(m, [4, 3])
    assert g.shape_of(g.outputs[0]).dims == ("n", 6)


@pytest.mark.parametrize("inits,attrs,msg", [
    ([np.asarray([1, 1], np.int64)], dict(), "pads"),
    ([np.asarray([0, 0, 0, 0], np.int64)], dict(mode="mirror"), "mode='mirror'"),
    ([np.asarray([0, 4, 0, 0], np.int64)], dict(mode="reflect"), "reflect pad"),
])
def test_pad_bad_attributes_name_the_node(inits, attrs, msg):
    m = model("Pad", [2, 3], attrs=attrs, inits=inits, name="pad9")
    with pytest.raises(FrontendError, match=f"pad9.*{msg}"):
        bz.import_onnx(m)
