"""Import decisions taken for symbolic dims >= 2 are refused, not silently wrong, at 0 / 1.

An ONNX Squeeze without axes drops every dim of size 1: braze keeps a symbolic dim (fixed
rank), which ONNX Runtime drops when it is fed 1. The input records the exclusion
(`Input.excludes`), so feeding 1 is an InterpretError naming the node and the symbol, from the
interpreter and the compiled executable alike, and it survives bz.save / load and text IR; the
other sizes (0 included, which ONNX keeps) still run and match ONNX Runtime. A comparison or
Max / Min of shape values folded for N >= 2 (max(N, 1) is N) excludes the N it gets wrong."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

import braze as bz  # noqa: E402
from braze.ir.parser import parse_graph  # noqa: E402


def _squeeze_model():
    node = helper.make_node("Squeeze", ["x"], ["y"], name="sq")
    g = helper.make_graph([node], "sq", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 4, 1])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_squeeze_without_axes_refuses_symbol_bound_to_one(tmp_path):
    g = bz.import_onnx(_squeeze_model())
    exe = bz.compile(g)
    x1 = np.ones((1, 4, 1), np.float32)
    for run in (lambda: bz.interpret(g, {"x": x1}), lambda: exe({"x": x1})):
        with pytest.raises(bz.InterpretError,
                           match=r"binds N = 1, .*node sq \(Squeeze\).*keeps dim N"):
            run()
    with pytest.raises(bz.ShapeError, match="Squeeze without axes"):
        g.bind(N=1)
    bz.save(g, tmp_path / "g.json")
    for again in (bz.load(tmp_path / "g.json"), parse_graph(str(g))):
        with pytest.raises(bz.InterpretError, match="node sq"):
            bz.interpret(again, {"x": x1})


@pytest.mark.parametrize("n", [0, 2, 3])
def test_squeeze_without_axes_other_sizes_match_ort(ort_run, n):
    model = _squeeze_model()
    g = bz.import_onnx(model)
    x = np.random.default_rng(n).standard_normal((n, 4, 1)).astype(np.float32)
    (want,) = ort_run(model, {"x": x})
    for got in (bz.interpret(g, {"x": x})[0], bz.compile(g)({"x": x})[0]):
        assert got.shape == want.shape == (n, 4)
        np.testing.assert_array_equal(got, want)


def _max_one_model():
    """ConstantOfShape([max(N, 1)]): folded at import as N, which is 0 where ONNX gives 1."""
    i64 = lambda name, v: helper.make_tensor(name, TensorProto.INT64, [len(v)] if isinstance(  # noqa: E731
        v, list) else [], v if isinstance(v, list) else [v])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Max", ["n", "one"], ["k"], name="clamp"),
             helper.make_node("Unsqueeze", ["k", "axes"], ["k1"]),
             helper.make_node("ConstantOfShape", ["k1"], ["y"], value=helper.make_tensor(
                 "v", TensorProto.FLOAT, [1], [1.0]))]
    g = helper.make_graph(nodes, "mx", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 2])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)],
        [i64("zero", 0), i64("one", 1), i64("axes", [0])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_folded_max_of_a_symbol_refuses_the_binding_it_got_wrong(ort_run):
    model = _max_one_model()
    g = bz.import_onnx(model)
    x0 = np.ones((0, 2), np.float32)
    with pytest.raises(bz.InterpretError, match=r"binds N = 0, .*node clamp \(Max\).*N = 0"):
        bz.interpret(g, {"x": x0})
    with pytest.raises(bz.InterpretError, match=r"node clamp \(Max\)"):
        bz.compile(g)({"x": x0})
    for n in (1, 2, 3):  # max(1, 1) is 1 as folded: runs
        x = np.ones((n, 2), np.float32)
        np.testing.assert_array_equal(bz.interpret(g, {"x": x})[0], ort_run(model, {"x": x})[0])


def test_a_decision_repeated_per_layer_is_recorded_once():
    """Two Squeezes without axes over the same dim add one exclusion, naming the first."""
    nodes = [helper.make_node("Squeeze", ["x"], ["s1"], name="sq1"),
             helper.make_node("Squeeze", ["s1"], ["y"], name="sq2")]
    g = helper.make_graph(nodes, "sq", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 4, 1])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    (excl,) = bz.import_onnx(model).inputs[0].op.excludes
    assert excl[:3] == ("N", 1, 1) and "sq1" in excl[3]


def _i64(name, v):
    return helper.make_tensor(name, TensorProto.INT64, [len(v)], v)


def _shape_arith_model(nodes, out_type=TensorProto.FLOAT, inits=()):
    """x [N, 3]; `n` is N as a [1] vector (Shape, Slice), `two` and `one` constants."""
    head = [helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Slice", ["s", "zero", "one"], ["n"])]
    g = helper.make_graph(head + nodes, "m", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 3])], [helper.make_tensor_value_info("y", out_type, None)],
        [_i64("zero", [0]), _i64("one", [1]), _i64("two", [2]), *inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _runs_or_refuses(model, ort_run, refused: dict[int, str]):
    """ORT's outputs at N = 0..3, except the Ns in `refused`, which both the interpreter and
    the compiled executable refuse with a message matching refused[N]."""
    g = bz.import_onnx(model)
    exe = bz.compile(g)
    for n in range(4):
        x = np.random.default_rng(n).standard_normal((n, 3)).astype(np.float32)
        for run in (lambda x=x: bz.interpret(g, {"x": x})[0], lambda x=x: exe({"x": x})[0]):
            if n in refused:
                with pytest.raises(bz.InterpretError, match=refused[n]):
                    run()
                continue
            (want,) = ort_run(model, {"x": x})
            got = run()
            assert got.shape == want.shape, n
            np.testing.assert_array_equal(got, want)


def test_slice_end_clamped_for_large_sizes_refuses_the_binding_it_gets_wrong(ort_run):
    """x[:2*N-2] keeps all of x for N >= 2 (the end is clamped to N); at N = 1 ONNX keeps
    nothing, where the clamped end would keep the row."""
    model = _shape_arith_model([
        helper.make_node("Mul", ["n", "two"], ["n2"]),
        helper.make_node("Sub", ["n2", "two"], ["end"]),
        helper.make_node("Slice", ["x", "zero", "end", "zero"], ["y"], name="cut")])
    _runs_or_refuses(model, ort_run, {1: r"binds N = 1, .*node cut \(Slice\).*N = 1"})


def test_fmod_of_shape_values_refuses_the_binding_it_gets_wrong(ort_run):
    """fmod(2*N - 1, 2) folds to 1, which ONNX's fmod gives for N >= 1 only: -1 at N = 0."""
    model = _shape_arith_model([
        helper.make_node("Mul", ["n", "two"], ["n2"]),
        helper.make_node("Sub", ["n2", "one"], ["odd"]),
        helper.make_node("Mod", ["odd", "two"], ["r"], name="rem", fmod=1),
        helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT)])
    _runs_or_refuses(model, ort_run, {0: r"binds N = 0, .*node rem \(Mod\).*N = 0"})
    python_mod = _shape_arith_model([  # Python's mod: 1 at every N, no exclusion
        helper.make_node("Mul", ["n", "two"], ["n2"]),
        helper.make_node("Sub", ["n2", "one"], ["odd"]),
        helper.make_node("Mod", ["odd", "two"], ["r"], name="rem"),
        helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT)])
    assert bz.import_onnx(python_mod).inputs[0].op.excludes == ()
    _runs_or_refuses(python_mod, ort_run, {})


def test_antialias_resize_upscaling_for_large_sizes_refuses_a_small_downscale(ort_run):
    """Resize (linear, antialias=1) of rows 2*h to 3*h - 2 upscales for h >= 2, so braze's
    plain linear resize is exact there; at h = 1 it downscales 2 rows to 1, where antialias
    averages, so that binding is refused."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "two", "three"], ["rows"]),
             helper.make_node("Div", ["rows", "two"], ["h"]),
             helper.make_node("Mul", ["h", "three"], ["h3"]),
             helper.make_node("Sub", ["h3", "two"], ["out_rows"]),
             helper.make_node("Concat", ["ones", "out_rows", "four"], ["sizes"], axis=0),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="up", mode="linear",
                              antialias=1)]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 1, "2*h", 4])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)],
        [_i64("two", [2]), _i64("three", [3]), _i64("ones", [1, 1]), _i64("four", [4])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    g = bz.import_onnx(model)
    for h in (2, 3):
        x = np.random.default_rng(h).standard_normal((1, 1, 2 * h, 4)).astype(np.float32)
        np.testing.assert_allclose(bz.interpret(g, {"x": x})[0], ort_run(model, {"x": x})[0],
                                   rtol=1e-5, atol=1e-5)
    x = np.ones((1, 1, 2, 4), np.float32)
    with pytest.raises(bz.InterpretError, match=r"binds h = 1, .*node up \(Resize\).*h = 1"):
        bz.interpret(g, {"x": x})
