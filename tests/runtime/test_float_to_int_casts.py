"""Float -> integer casts of NaN, infinities and out-of-range values (ir/ops/float_to_int.py).

A C cast of such a value is undefined behaviour: generated kernels differed from the NumPy
reference, and a literal constant (folded by the compiler) from the same constant passed as an
argument. braze defines the result once (what ONNX Runtime, PyTorch and NumPy give on x86-64),
and the interpreter, the plain cast kernel and generated regions (float32 / float64, and
float16 / bfloat16 through float32) compute exactly that, for every float x integer dtype."""
import ml_dtypes
import numpy as np
import pytest

import braze as bz
from braze.ir.ops.float_to_int import float_to_int
from braze.runtime.codegen import cc
from braze.runtime.kernels import Dispatch

FLOATS = [bz.f32, bz.f64, bz.f16, bz.bf16]
INTS = [bz.i8, bz.i16, bz.i32, bz.i64, bz.u8, bz.u32, bz.bool_]
SPECIAL = [np.nan, np.inf, -np.inf, -0.0, 0.0, -0.5, -0.9, -1.0, 0.7, 127.0, 128.0, -128.0,
           -129.0, 255.0, 256.0, 300.0, -300.0, 32767.0, 32768.0, -32769.0, 65504.0, -65504.0,
           2.0 ** 31 - 128, 2.0 ** 31, -2.0 ** 31, -2.0 ** 31 - 512, 3e9, -3e9, 2.0 ** 32,
           2.0 ** 32 + 4096, 2.0 ** 63, -2.0 ** 63, 2.0 ** 64, 1e20, -1e20]

needs_cc = pytest.mark.skipif(not cc.available(), reason="no C compiler on this machine")


def _values(src):
    with np.errstate(all="ignore"):
        return np.asarray(SPECIAL, np.float64).astype(src.np)


def test_the_rule_is_what_onnx_runtime_torch_and_x86_numpy_give():
    x = np.asarray([np.nan, np.inf, -np.inf, 300.0, -1.0, 3e9, -3e9, 2.0 ** 32], np.float32)
    assert float_to_int(x, np.int8).tolist() == [0, 0, 0, 44, -1, 0, 0, 0]
    assert float_to_int(x, np.uint8).tolist() == [0, 0, 0, 44, 255, 0, 0, 0]
    m = -2 ** 31
    assert float_to_int(x, np.int32).tolist() == [m, m, m, 300, -1, m, m, m]
    assert float_to_int(x, np.int64).tolist() == [-2 ** 63] * 3 + [300, -1, 3000000000,
                                                                   -3000000000, 2 ** 32]
    assert float_to_int(x, np.uint32).tolist() == [0, 0, 0, 300, 2 ** 32 - 1, 3000000000,
                                                   2 ** 32 - 3000000000, 0]
    assert float_to_int(x, np.bool_).tolist() == [True] * 8


def test_the_rule_matches_onnx_runtime_on_every_pair():
    ort = pytest.importorskip("onnxruntime")
    from onnx import helper

    from braze.export.onnx.builder import onnx_type

    for src in (bz.f32, bz.f64, bz.f16):
        for dst in INTS:
            g = helper.make_graph(
                [helper.make_node("Cast", ["x"], ["y"], to=onnx_type(dst))], "c",
                [helper.make_tensor_value_info("x", onnx_type(src), [1])],
                [helper.make_tensor_value_info("y", onnx_type(dst), [1])])
            m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
            sess = ort.InferenceSession(m.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
            for v in _values(src):  # one at a time: ORT's vectorized uint32 loop differs
                (want,) = sess.run(None, {"x": v.reshape(1)})
                np.testing.assert_array_equal(float_to_int(v.reshape(1), dst.np), want,
                                              err_msg=f"{src.name} -> {dst.name} of {v}")


def _cast_graph(src, dst):
    g = bz.Graph("cast")
    g.set_outputs([g.cast(g.input("x", bz.Shape((len(SPECIAL),), src)), dst)])
    return g


@pytest.mark.parametrize("src", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("dst", INTS, ids=lambda d: d.name)
def test_interpret_and_plain_cast_kernel_follow_the_rule(src, dst):
    g = _cast_graph(src, dst)
    x = _values(src)
    want = float_to_int(x.astype(np.float64), dst.np)
    (ref,) = bz.interpret(g, {"x": x})
    assert ref.dtype == dst.np
    np.testing.assert_array_equal(ref, want)
    (got,) = bz.compile(g)({"x": x})
    np.testing.assert_array_equal(got, want)


def _region_graph(src, dst):
    """One generated region: cast(x) and cast(x * 1 + c) for a scalar c argument (the kernel's
    compares must not be folded away)."""
    body = bz.Graph("body")
    x = body.input("in0", bz.Shape((len(SPECIAL),), src))
    body.set_outputs([body.cast(x, dst), body.cast(body.neg(x), dst)])
    g = bz.Graph("r")
    outs = g.elementwise_region(body, [g.input("x", bz.Shape((len(SPECIAL),), src))])
    g.set_outputs(list(outs))
    return g


def _generated(exe):
    rows = [(d, impl) for _, kind, d, impl in exe.dispatch_report().rows
            if kind == "elementwise_region"]
    return bool(rows) and all(d == Dispatch.GENERATED for d, _ in rows)


@needs_cc
@pytest.mark.parametrize("src", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("dst", INTS, ids=lambda d: d.name)
def test_generated_regions_follow_the_rule(src, dst):
    g = _region_graph(src, dst)
    x = _values(src)
    exe = bz.compile(g)
    assert _generated(exe)
    got = exe({"x": x})
    want = [float_to_int(x.astype(np.float64), dst.np),
            float_to_int(-x.astype(np.float64), dst.np)]
    for r, w in zip(bz.interpret(g, {"x": x}), want, strict=True):
        np.testing.assert_array_equal(r, w)
    for r, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(r, w)


@needs_cc
@pytest.mark.parametrize("dst", INTS[:-1], ids=lambda d: d.name)  # bool: x != 0, no UB
@pytest.mark.parametrize("src", [bz.f32, bz.f64], ids=lambda d: d.name)
def test_literal_and_argument_constants_cast_alike(src, dst):
    """y = x + cast(c): c is a literal (0, +-1, +-inf) or a kernel argument (the rest); the
    compiler used to fold the literal's undefined cast differently from the run-time one."""
    for c in SPECIAL:
        body = bz.Graph("body")
        x = body.input("in0", bz.Shape((3,), dst))
        k = body.constant(np.asarray(c, src.np), src)
        body.set_outputs([body.add(x, body.cast(k, dst))])
        g = bz.Graph("r")
        g.set_outputs([g.elementwise_region(body, [g.input("x", bz.Shape((3,), dst))])])
        feeds = {"x": np.zeros(3, dst.np)}
        exe = bz.compile(g)
        want = np.zeros(3, dst.np) + float_to_int(np.asarray(c, src.np), dst.np)
        np.testing.assert_array_equal(bz.interpret(g, feeds)[0], want, err_msg=f"c={c}")
        np.testing.assert_array_equal(exe(feeds)[0], want, err_msg=f"c={c}")


def test_bfloat16_values_convert_exactly():
    x = np.asarray([3e9, -3e9, 1e20], ml_dtypes.bfloat16)
    assert float_to_int(x, np.int64).tolist() == [int(v) for v in x.astype(np.float64)[:2]] \
        + [-2 ** 63]


def test_integer_clamp_to_an_out_of_range_float_bound_converts_by_the_rule():
    g = bz.Graph("clamp")
    g.set_outputs([g.clamp(g.input("x", bz.Shape((3,), bz.i8)), 1e3, 2e3)])
    (got,) = bz.interpret(g, {"x": np.arange(3, dtype=np.int8)})
    assert got.dtype == np.int8 and got.tolist() == [float_to_int(np.float64(1e3), np.int8)] * 3
