"""ONNX quantization ops (braze/frontends/onnx/ops/quant.py): one-node models of
QuantizeLinear / DequantizeLinear (opsets 11..23, per tensor and per axis),
DynamicQuantizeLinear, MatMulInteger, QLinearMatMul, ConvInteger and QLinearConv import, and
the interpreter and the compiled executor give ONNX Runtime's outputs bit for bit on random
data; block quantization, int4 / int16 and float8 are refused naming the node."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import braze as bz  # noqa: E402
from braze.errors import FrontendError, UnsupportedOpsError  # noqa: E402

_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
          np.dtype(np.int8): TensorProto.INT8, np.dtype(np.uint8): TensorProto.UINT8,
          np.dtype(np.int32): TensorProto.INT32, np.dtype(np.int16): TensorProto.INT16}


def one_node(op_type, feeds: dict, inits: list, n_out=1, opset=21, **attrs):
    """A model of one node reading the graph inputs `feeds` (in order) and then the
    initializers `inits` (None: an empty optional input)."""
    names = list(feeds)
    tensors = []
    for i, arr in enumerate(inits):
        if arr is None:
            names.append("")
            continue
        tensors.append(numpy_helper.from_array(np.asarray(arr), f"c{i}"))
        names.append(f"c{i}")
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op_type, names, outs, name="qnode", **attrs)
    ins = [helper.make_tensor_value_info(k, _TYPES[v.dtype], v.shape) for k, v in feeds.items()]
    graph = helper.make_graph([node], "g", ins,
                              [onnx.ValueInfoProto(name=o) for o in outs], tensors)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8 if opset < 21 else 10
    return m


def ort_run(m, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check_exact(m, feeds, compile=True):
    """braze (interpreter and compiled) equals ONNX Runtime bit for bit; returns the graph."""
    want = ort_run(m, feeds)
    g = bz.import_onnx(m)
    runs = [bz.interpret(g, feeds)]
    if compile:
        runs.append(bz.compile(g)(feeds))
    for got in runs:
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a, b)
    return g


def _x(rng, shape, spread=3.0):
    x = (rng.normal(size=shape) * spread).astype(np.float32)
    x.reshape(-1)[:3] = [2.5 * 0.02, -2.5 * 0.02, 1e9]  # ties and saturation
    return x


@pytest.mark.parametrize("opset", [11, 13, 19, 21, 23])
@pytest.mark.parametrize("zdt", [np.int8, np.uint8])
def test_quantize_dequantize_linear_per_tensor(opset, zdt):
    rng = np.random.default_rng(0)
    x = _x(rng, (3, 40))
    zp = zdt(7)
    check_exact(one_node("QuantizeLinear", {"x": x}, [np.float32(0.02), zp], opset=opset),
                {"x": x})
    q = rng.integers(0, 100, (3, 40)).astype(zdt)
    check_exact(one_node("DequantizeLinear", {"q": q}, [np.float32(0.02), zp], opset=opset),
                {"q": q})


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_dequantize_linear_per_axis(axis):
    rng = np.random.default_rng(1)
    x = _x(rng, (4, 5, 6))
    n = x.shape[axis]
    scale = (rng.random(n) * 0.05 + 0.01).astype(np.float32)
    zp = rng.integers(-5, 5, n).astype(np.int8)
    g = check_exact(one_node("QuantizeLinear", {"x": x}, [scale, zp], opset=13, axis=axis),
                    {"x": x})
    assert [n.op.axis for n in g.nodes if n.op.kind == "quantize"] == [axis % 3]
    q = rng.integers(-128, 128, x.shape).astype(np.int8)
    check_exact(one_node("DequantizeLinear", {"q": q}, [scale, zp], opset=13, axis=axis),
                {"q": q})


def test_missing_zero_point_means_uint8_zero_and_int32_dequantize():
    rng = np.random.default_rng(2)
    x = _x(rng, (2, 30))
    check_exact(one_node("QuantizeLinear", {"x": x}, [np.float32(0.05)]), {"x": x})
    q = rng.integers(-2**20, 2**20, (2, 30)).astype(np.int32)
    check_exact(one_node("DequantizeLinear", {"q": q}, [np.float32(1e-3)]), {"q": q})


def test_float16_quantize_and_dequantize():
    rng = np.random.default_rng(3)
    with np.errstate(over="ignore"):  # 1e9 is inf in float16
        x = _x(rng, (2, 30)).astype(np.float16)
    check_exact(one_node("QuantizeLinear", {"x": x}, [np.float16(0.05), np.int8(0)]), {"x": x})
    q = rng.integers(0, 255, (2, 30)).astype(np.uint8)
    check_exact(one_node("DequantizeLinear", {"q": q}, [np.float16(0.05), np.uint8(9)]),
                {"q": q})


@pytest.mark.parametrize("opset", [21, 23])
@pytest.mark.parametrize("axis", [None, -1])
def test_float16_quotients_round_as_the_opset_says(opset, axis):
    """QuantizeLinear-23 rounds a float16 x / scale to float16 before rounding it to an
    integer; earlier opsets divide in float32 (ONNX Runtime). The x here are float16 values
    whose float32 quotient lies just off a half, so the two disagree on many of them."""
    rng = np.random.default_rng(3)
    x = (rng.normal(size=(64, 4)) * 3).astype(np.float16)
    scale = rng.uniform(0.01, 0.1, 4 if axis is not None else ()).astype(np.float16)
    zp = np.zeros(scale.shape, np.int8)
    attrs = {} if axis is None else {"axis": axis}
    m = one_node("QuantizeLinear", {"x": x}, [scale, zp], opset=opset, **attrs)
    f32_quotient = np.rint(x.astype(np.float32) / scale.astype(np.float32)).clip(-128, 127)
    f16_quotient = np.rint((x / scale).astype(np.float32)).clip(-128, 127)
    assert (f32_quotient != f16_quotient).sum() > 0  # the data tells the two apart
    check_exact(m, {"x": x})


@pytest.mark.parametrize("xdt, sdt, precision", [
    (np.float32, np.float16, None), (np.float16, np.float32, None),
    (np.float32, np.float32, TensorProto.FLOAT16), (np.float16, np.float16, TensorProto.FLOAT)])
def test_quantize_linear_23_divides_in_the_scales_type_or_its_precision(xdt, sdt, precision):
    """Opset 23 lets x and the scale differ: the division runs in the scale's type, or the
    `precision` attribute's (braze cast the scale to x's type and divided in float32)."""
    rng = np.random.default_rng(5)
    x = (rng.normal(size=(200, 4)) * 3).astype(xdt)
    attrs = {} if precision is None else {"precision": precision}
    m = one_node("QuantizeLinear", {"x": x}, [sdt(0.0731), np.int8(0)], opset=23, **attrs)
    check_exact(m, {"x": x})


@pytest.mark.parametrize("kind", ["mixed", "positive", "negative", "zeros"])
def test_dynamic_quantize_linear(kind):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(5, 37)).astype(np.float32) * 4
    x = {"mixed": x, "positive": np.abs(x) + 0.5, "negative": -np.abs(x) - 0.5,
         "zeros": np.zeros_like(x)}[kind]
    check_exact(one_node("DynamicQuantizeLinear", {"x": x}, [], n_out=3, opset=11), {"x": x})


@pytest.mark.parametrize("adt, bdt", [(np.uint8, np.int8), (np.uint8, np.uint8),
                                      (np.int8, np.int8)])
@pytest.mark.parametrize("per_axis", [False, True])
def test_matmul_integer(adt, bdt, per_axis):
    rng = np.random.default_rng(5)
    info_a, info_b = np.iinfo(adt), np.iinfo(bdt)
    a = rng.integers(info_a.min, info_a.max + 1, (2, 7, 33)).astype(adt)
    b = rng.integers(info_b.min, info_b.max + 1, (33, 9)).astype(bdt)
    a_zp = adt(rng.integers(0, 50))
    b_zp = rng.integers(0, 20, 9).astype(bdt) if per_axis else bdt(3)
    check_exact(one_node("MatMulInteger", {"a": a}, [b, a_zp, b_zp], opset=11), {"a": a})


@pytest.mark.parametrize("adt, bdt", [(np.uint8, np.int8), (np.uint8, np.uint8),
                                      (np.int8, np.int8)])
@pytest.mark.parametrize("per_axis", [False, True])
def test_qlinear_matmul(adt, bdt, per_axis):
    rng = np.random.default_rng(6)
    info_a, info_b = np.iinfo(adt), np.iinfo(bdt)
    a = rng.integers(info_a.min, info_a.max + 1, (3, 4, 64)).astype(adt)
    b = rng.integers(info_b.min, info_b.max + 1, (64, 16)).astype(bdt)
    b_scale = (rng.random(16) * 0.01 + 0.001).astype(np.float32) if per_axis \
        else np.float32(0.004)
    b_zp = rng.integers(0, 9, 16).astype(bdt) if per_axis else bdt(2)
    inits = [np.float32(0.02), adt(5), b, b_scale, b_zp, np.float32(0.3), adt(9)]
    m = one_node("QLinearMatMul", {"a": a}, inits, opset=21 if per_axis else 11)
    check_exact(m, {"a": a})


@pytest.mark.parametrize("attrs", [{}, {"pads": [1, 0, 2, 1], "strides": [2, 1]},
                                   {"group": 2, "dilations": [1, 2]}])
def test_conv_integer(attrs):
    rng = np.random.default_rng(7)
    x = rng.integers(0, 256, (2, 4, 9, 8)).astype(np.uint8)
    group = attrs.get("group", 1)
    w = rng.integers(-128, 128, (6, 4 // group, 3, 3)).astype(np.int8)
    w_zp = np.int8(1)  # ONNX Runtime takes no per-channel weight zero point here
    check_exact(one_node("ConvInteger", {"x": x}, [w, np.uint8(100), w_zp], opset=11, **attrs),
                {"x": x})


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("xdt", [np.uint8, np.int8])
@pytest.mark.parametrize("bias", [False, True])
def test_qlinear_conv(per_channel, xdt, bias):
    rng = np.random.default_rng(8)
    info = np.iinfo(xdt)
    x = rng.integers(info.min, info.max + 1, (2, 8, 10, 9)).astype(xdt)
    w = rng.integers(-127, 128, (5, 8, 3, 3)).astype(np.int8)
    w_scale = (rng.random(5) * 0.01 + 0.001).astype(np.float32) if per_channel \
        else np.float32(0.005)
    w_zp = np.zeros(5, np.int8) if per_channel else np.int8(0)
    b = rng.integers(-5000, 5000, 5).astype(np.int32) if bias else None
    inits = [np.float32(0.03), xdt(3), w, w_scale, w_zp, np.float32(0.7), xdt(-2 if xdt is
                                                                              np.int8 else 128)]
    if bias:
        inits.append(b)
    check_exact(one_node("QLinearConv", {"x": x}, inits, opset=11, pads=[1, 1, 1, 1]),
                {"x": x})


def test_block_quantization_and_narrow_types_are_refused_naming_the_node():
    x = np.zeros((4, 8), np.float32)
    m = one_node("QuantizeLinear", {"x": x}, [np.full((4, 2), 0.1, np.float32),
                                              np.zeros((4, 2), np.int8)], block_size=4, axis=1)
    with pytest.raises(UnsupportedOpsError, match=r"qnode \(QuantizeLinear\).*block"):
        bz.import_onnx(m)
    m = one_node("QuantizeLinear", {"x": x}, [np.float32(0.1)],
                 output_dtype=TensorProto.INT4)
    with pytest.raises(UnsupportedOpsError, match=r"qnode \(QuantizeLinear\).*INT4"):
        bz.import_onnx(m)
    m = one_node("QuantizeLinear", {"x": x}, [np.float32(0.1)],
                 output_dtype=TensorProto.FLOAT8E4M3FN)
    with pytest.raises(UnsupportedOpsError, match=r"qnode .*FLOAT8E4M3FN"):
        bz.import_onnx(m)
    q = np.zeros((4, 8), np.int16)
    m = one_node("DequantizeLinear", {"q": q}, [np.float32(0.1)])
    with pytest.raises(FrontendError, match=r"qnode|int16|INT16"):
        bz.import_onnx(m)


def _contrib_node(op_type, a, b, params, b_is_input=True):
    """A com.microsoft QLinearAdd / QLinearMul reading a (and b) as graph inputs."""
    feeds = {"a": a, "b": b} if b_is_input else {"a": a}
    a_s, a_zp, b_s, b_zp, c_s, c_zp = params
    tensors = [numpy_helper.from_array(np.asarray(v), n) for v, n in
               [(a_s, "as"), (a_zp, "az"), (b_s, "bs"), (b_zp, "bz"), (c_s, "cs"), (c_zp, "cz")]]
    if not b_is_input:
        tensors.append(numpy_helper.from_array(b, "b"))
    node = helper.make_node(op_type, ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["y"],
                            name="qnode", domain="com.microsoft")
    ins = [helper.make_tensor_value_info(k, _TYPES[v.dtype], v.shape) for k, v in feeds.items()]
    graph = helper.make_graph([node], "g", ins, [onnx.ValueInfoProto(name="y")], tensors)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m, feeds


@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("qdt", [np.uint8, np.int8])
@pytest.mark.parametrize("b_shape", [(7, 333), (333,), ()])
def test_qlinear_add_and_mul_contrib_ops(op_type, qdt, b_shape):
    rng = np.random.default_rng(9)
    info = np.iinfo(qdt)
    for _ in range(5):
        a = rng.integers(info.min, info.max + 1, (7, 333)).astype(qdt)
        b = np.asarray(rng.integers(info.min, info.max + 1, b_shape)).astype(qdt)
        scales = [np.float32(rng.random() * 0.1 + 1e-3) for _ in range(3)]
        zps = [qdt(rng.integers(info.min, info.max + 1)) for _ in range(3)]
        params = (scales[0], zps[0], scales[1], zps[1], scales[2], zps[2])
        m, feeds = _contrib_node(op_type, a, b, params, b_is_input=b_shape != ())
        check_exact(m, feeds)


def _ms_node(op_type, feeds: dict, inits: dict, names: list, **attrs):
    """One com.microsoft node reading graph inputs `feeds` and initializers `inits` by the
    input names `names` ("" for an absent optional input)."""
    node = helper.make_node(op_type, names, ["y"], name="qnode", domain="com.microsoft",
                            **attrs)
    ins = [helper.make_tensor_value_info(k, _TYPES[v.dtype], v.shape) for k, v in feeds.items()]
    tensors = [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()]
    graph = helper.make_graph([node], "g", ins, [onnx.ValueInfoProto(name="y")], tensors)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (1, 1)])
@pytest.mark.parametrize("bias, quantized_out", [(False, True), (True, True), (True, False)])
@pytest.mark.parametrize("per_column", [False, True])
def test_qgemm_contrib_op(trans_a, trans_b, bias, quantized_out, per_column):
    """ORT's QGemm (QOperator Gemm): integer product, int32 C, alpha; float32 out or
    requantized with y_scale / y_zero_point."""
    rng = np.random.default_rng(4)
    m_, k, n = 5, 37, 9
    a = rng.integers(0, 256, (k, m_) if trans_a else (m_, k)).astype(np.uint8)
    b = rng.integers(-128, 128, (n, k) if trans_b else (k, n)).astype(np.int8)
    b_scale = (rng.random(n if per_column else ()) * 0.01 + 1e-3).astype(np.float32)
    inits = {"as": np.float32(0.02), "az": np.uint8(131), "b": b, "bs": b_scale,
             "bz": np.zeros(b_scale.shape, np.int8)}
    names = ["a", "as", "az", "b", "bs", "bz"]
    if bias:
        inits["c"] = rng.integers(-5000, 5000, n).astype(np.int32)
    names.append("c" if bias else "")
    if quantized_out:
        inits.update(ys=np.float32(0.05), yz=np.uint8(100))
        names += ["ys", "yz"]
    while names[-1] == "":
        names.pop()
    m = _ms_node("QGemm", {"a": a}, inits, names, transA=trans_a, transB=trans_b, alpha=0.5)
    check_exact(m, {"a": a})


@pytest.mark.parametrize("op_type, attrs", [
    ("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.1}),
    ("QLinearGlobalAveragePool", {})])
@pytest.mark.parametrize("qdt", [np.uint8, np.int8])
def test_qlinear_unary_and_pooling_contrib_ops(op_type, attrs, qdt):
    rng = np.random.default_rng(6)
    info = np.iinfo(qdt)
    x = rng.integers(info.min, info.max + 1, (2, 3, 5, 4)).astype(qdt)
    inits = {"xs": np.float32(0.05), "xz": qdt(9), "ys": np.float32(0.04), "yz": qdt(7)}
    m = _ms_node(op_type, {"x": x}, inits, ["x", "xs", "xz", "ys", "yz"], **attrs)
    check_exact(m, {"x": x})


@pytest.mark.parametrize("attrs", [{"axis": -1, "opset": 13}, {"axis": 1, "opset": 11}])
@pytest.mark.parametrize("qdt, y_scale", [(np.uint8, 1 / 255), (np.uint8, 1 / 256),
                                          (np.int8, 1 / 256)])
def test_qlinear_softmax_computes_onnx_runtimes_table_arithmetic(attrs, qdt, y_scale):
    """ORT scales by floor(1 / y_scale) (254 for 1 / 255), not 1 / y_scale: a float softmax
    quantized with y_scale is off by a quantum on most values there."""
    rng = np.random.default_rng(6)
    info = np.iinfo(qdt)
    x = rng.integers(info.min, info.max + 1, (2, 3, 5, 4)).astype(qdt)
    inits = {"xs": np.float32(0.05), "xz": qdt(9), "ys": np.float32(y_scale),
             "yz": qdt(info.min)}
    m = _ms_node("QLinearSoftmax", {"x": x}, inits, ["x", "xs", "xz", "ys", "yz"], **attrs)
    check_exact(m, {"x": x})


def test_qlinear_softmax_of_an_infinite_scale_is_onnx_runtimes():
    """quantize_static calibrates a BERT attention mask's add to an infinite scale; ORT's
    table is then NaN at each row's maximum and 0 elsewhere, and its output 0 throughout."""
    x = np.random.default_rng(1).integers(-128, 128, (2, 8)).astype(np.int8)
    inits = {"xs": np.float32(np.inf), "xz": np.int8(0), "ys": np.float32(1 / 256),
             "yz": np.int8(-128)}
    m = _ms_node("QLinearSoftmax", {"x": x}, inits, ["x", "xs", "xz", "ys", "yz"], axis=-1,
                 opset=13)
    with np.errstate(invalid="ignore"):  # 0 * inf
        check_exact(m, {"x": x})


@pytest.mark.parametrize("same_params", [False, True])
def test_qlinear_concat_contrib_op(same_params):
    rng = np.random.default_rng(7)
    a = rng.integers(0, 256, (2, 3, 4)).astype(np.uint8)
    b = rng.integers(0, 256, (2, 5, 4)).astype(np.uint8)
    inits = {"ys": np.float32(0.03), "yz": np.uint8(120), "as": np.float32(0.05),
             "az": np.uint8(10), "b": b, "bs": np.float32(0.03 if same_params else 0.02),
             "bz": np.uint8(120 if same_params else 200)}
    m = _ms_node("QLinearConcat", {"a": a}, inits, ["ys", "yz", "a", "as", "az", "b", "bs", "bz"],
                 axis=1)
    check_exact(m, {"a": a})


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [2, 2]},
    {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1], "strides": [2, 1], "count_include_pad": 1},
    {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "strides": [2, 2], "ceil_mode": 1}])
def test_qlinear_average_pool_sums_each_window_in_order_as_onnx_runtime(attrs):
    """ORT sums a window's dequantized values in row-major order; braze's average pool sums
    them in another order, a quantum off at ties (x and y sharing a scale) in 1 case in 7."""
    rng = np.random.default_rng(8)
    for _ in range(10):
        x = rng.integers(-128, 128, (2, 3, 7, 6)).astype(np.int8)
        inits = {"xs": np.float32(0.1), "xz": np.int8(rng.integers(-128, 128)),
                 "ys": np.float32(0.1), "yz": np.int8(rng.integers(-128, 128))}
        m = _ms_node("QLinearAveragePool", {"x": x}, inits, ["x", "xs", "xz", "ys", "yz"],
                     **attrs)
        check_exact(m, {"x": x})


def test_channels_last_qlinear_pooling_is_refused_naming_the_node():
    x = np.zeros((1, 4, 4, 3), np.uint8)
    inits = {"xs": np.float32(0.05), "xz": np.uint8(9), "ys": np.float32(0.05),
             "yz": np.uint8(9)}
    m = _ms_node("QLinearGlobalAveragePool", {"x": x}, inits, ["x", "xs", "xz", "ys", "yz"],
                 channels_last=1)
    with pytest.raises(FrontendError, match="qnode.*channels_last"):
        bz.import_onnx(m)


@pytest.mark.parametrize("zero_points", [False, True])
@pytest.mark.parametrize("per_column, bias", [(False, False), (True, True)])
def test_ort_fused_dynamic_matmuls(zero_points, per_column, bias):
    """MatMulIntegerToFloat and DynamicQuantizeMatMul (what ORT's optimizer writes for a
    quantize_dynamic model, saved with optimized_model_filepath) match ONNX Runtime up to
    float32 rounding of the scale-and-bias epilogue."""
    rng = np.random.default_rng(11)
    k, n = 24, 10
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    b_scale = (rng.random(n if per_column else ()) * 0.01 + 1e-3).astype(np.float32)
    b_zp = rng.integers(-5, 5, b_scale.shape).astype(np.int8) if zero_points else None
    tail = {"bias": rng.normal(size=n).astype(np.float32)} if bias else {}
    x = rng.normal(size=(2, 3, k)).astype(np.float32)
    a = rng.integers(0, 256, (2, 3, k)).astype(np.uint8)
    a_zp = {"az": np.uint8(120)} if zero_points else {}
    cases = [
        ("MatMulIntegerToFloat", {"a": a},
         {"b": b, "as": np.float32(0.02), "bs": b_scale, **a_zp,
          **({"bz": b_zp} if zero_points else {}), **tail},
         ["a", "b", "as", "bs", "az" if zero_points else "", "bz" if zero_points else "",
          "bias" if bias else ""]),
        ("DynamicQuantizeMatMul", {"x": x},
         {"b": b, "bs": b_scale, **({"bz": b_zp} if zero_points else {}), **tail},
         ["x", "b", "bs", "bz" if zero_points else "", "bias" if bias else ""]),
    ]
    for op_type, feeds, inits, names in cases:
        while names[-1] == "":
            names.pop()
        m = _ms_node(op_type, feeds, inits, names)
        want = ort_run(m, feeds)[0]
        g = bz.import_onnx(m)
        for got in (bz.interpret(g, feeds)[0], bz.compile(g)(feeds)[0]):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("qdt", [np.uint8, np.int8])
def test_qlinear_global_average_pool_sums_in_integers_as_onnx_runtime(qdt):
    """ORT sums x - x_zero_point in int32 and requantizes with x_scale / (y_scale * H * W); a
    float average of the dequantized values was a quantum off on about 1 case in 20."""
    rng = np.random.default_rng(12)
    info = np.iinfo(qdt)
    for _ in range(40):
        shape = (2, 4) + tuple(int(d) for d in rng.integers(2, 9, 2))
        x = rng.integers(info.min, info.max + 1, shape).astype(qdt)
        scale = np.float32(rng.choice([0.1, 1 / 255, rng.uniform(0.005, 0.3)]))  # ties too
        inits = {"xs": scale, "xz": qdt(rng.integers(info.min, 50)), "ys": scale,
                 "yz": qdt(rng.integers(info.min, 50))}
        m = _ms_node("QLinearGlobalAveragePool", {"x": x}, inits, ["x", "xs", "xz", "ys", "yz"])
        check_exact(m, {"x": x})
