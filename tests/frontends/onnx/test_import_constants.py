"""Initializers and Constant nodes at import: float tensors with more than one element become
params holding their stored values (read-only views of the model's bytes, never copies); scalars
and small integer tensors are compile-time values that shape computations fold through and that
appear in the graph only where data reads them; Constant nodes follow the same rule."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import braze as bz  # noqa: E402
from braze.frontends.onnx.importer import KNOWN_INT_LIMIT  # noqa: E402
from braze.ir.ops.io import Constant, Param  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def sources(g, cls):
    return [n for n in g.nodes if isinstance(n.op, cls)]


def test_float_initializers_become_params_with_their_values(make_model):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    m = make_model([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                    helper.make_node("Add", ["h", "b"], ["y"], name="bias")],
                   [("x", F, ["n", 4])], [("y", F, None)],
                   [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    data = m.SerializeToString()
    g = bz.import_onnx(data)
    assert sorted(n.op.name for n in g.params) == ["b", "w"]
    np.testing.assert_array_equal(g.weights["w"], w)
    np.testing.assert_array_equal(g.weights["b"], b)
    for arr in g.weights.values():  # views of the model's bytes: no copy, not writable
        assert not arr.flags.writeable
        assert not arr.flags.owndata
    x = rng.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(bz.interpret(g, {"x": x})[0], x @ w + b, rtol=1e-6)


def test_scalar_and_small_int_initializers_are_compile_time(make_model):
    """A float scalar becomes a constant where it is used; an int shape vector folds into the
    reshape and never appears as a node."""
    m = make_model([helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
                    helper.make_node("Mul", ["r", "scale"], ["y"], name="scale")],
                   [("x", F, [2, 6])], [("y", F, None)],
                   [numpy_helper.from_array(np.array([3, 4], np.int64), "shape"),
                    numpy_helper.from_array(np.array(0.5, np.float32), "scale")])
    g = bz.import_onnx(m)
    assert not g.params
    consts = sources(g, Constant)
    assert len(consts) == 1 and consts[0].outputs[0] == bz.Shape((), bz.f32)
    assert g.op_counts() == {"reshape": 1, "mul": 1}
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(bz.interpret(g, {"x": x})[0], x.reshape(3, 4) * 0.5)


def test_large_int_initializers_are_params(make_model):
    """An integer table above KNOWN_INT_LIMIT elements is data (a param), not a compile-time
    value."""
    table = np.arange(KNOWN_INT_LIMIT + 1, dtype=np.int64) * 3
    small = np.arange(8, dtype=np.int64)
    m = make_model([helper.make_node("Gather", ["table", "idx"], ["y"], name="lookup"),
                    helper.make_node("Gather", ["small", "idx"], ["z"], name="lookup_small")],
                   [("idx", I64, [5])], [("y", I64, None), ("z", I64, None)],
                   [numpy_helper.from_array(table, "table"),
                    numpy_helper.from_array(small, "small")])
    g = bz.import_onnx(m)
    assert [n.op.name for n in g.params] == ["table"]
    assert len(sources(g, Constant)) == 1  # the small table, materialized where data reads it
    idx = np.array([0, 3, 7, 2, 1], np.int64)
    y, z = bz.interpret(g, {"idx": idx})
    np.testing.assert_array_equal(y, table[idx])
    np.testing.assert_array_equal(z, small[idx])


def test_compile_time_values_fold_through_arithmetic(make_model):
    """Shape values computed from initializers (Concat / Mul / Gather) fold completely."""
    nodes = [
        helper.make_node("Mul", ["two", "three"], ["six"], name="mul"),
        helper.make_node("Concat", ["six", "two"], ["shape"], name="cat", axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape"),
    ]
    inits = [numpy_helper.from_array(np.array([2], np.int64), "two"),
             numpy_helper.from_array(np.array([3], np.int64), "three")]
    m = make_model(nodes, [("x", F, [3, 4])], [("y", F, None)], inits)
    g = bz.import_onnx(m)
    assert g.op_counts() == {"reshape": 1}
    assert g.shape_of(g.outputs[0]).dims == (6, 2)


@pytest.mark.parametrize("attr, value, dtype", [
    ("value_float", 2.5, np.float32),
    ("value_floats", [1.0, 2.0, 3.0], np.float32),
    ("value_int", 3, np.int64),
    ("value_ints", [1, 3], np.int64),
    ("value", numpy_helper.from_array(np.array([[1.5, -2.0, 0.25]], np.float32)), np.float32),
    ("value", numpy_helper.from_array(np.array([7, 8, 9], np.int32)), np.int32),
])
def test_constant_node_forms(make_model, attr, value, dtype):
    m = make_model([helper.make_node("Constant", [], ["c"], name="const", **{attr: value}),
                    helper.make_node("Identity", ["c"], ["y"], name="out")],
                   [], [("y", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), None)])
    g = bz.import_onnx(m)
    (y,) = bz.interpret(g, {})
    want = numpy_helper.to_array(value) if attr == "value" else np.asarray(value, dtype)
    assert y.dtype == want.dtype
    np.testing.assert_array_equal(y, want)
    assert not g.params


def test_float_constant_tensor_is_a_constant_node_not_a_param(make_model):
    arr = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    m = make_model([helper.make_node("Constant", [], ["c"], name="const",
                                     value=numpy_helper.from_array(arr)),
                    helper.make_node("Add", ["x", "c"], ["y"], name="add")],
                   [("x", F, [2, 3])], [("y", F, None)])
    g = bz.import_onnx(m)
    (c,) = sources(g, Constant)
    assert c.provenance == "const"
    assert not sources(g, Param)
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(bz.interpret(g, {"x": x})[0], x + arr)


def test_initializer_listed_as_graph_input_is_an_initializer(make_model):
    """Old exporters (IR < 4) list initializers among the inputs too: they stay weights."""
    w = np.eye(3, dtype=np.float32) * 2
    m = make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                   [("x", F, [1, 3]), ("w", F, [3, 3])], [("y", F, None)],
                   [numpy_helper.from_array(w, "w")], ir_version=3)
    g = bz.import_onnx(m)
    assert [n.op.name for n in g.inputs] == ["x"]
    assert [n.op.name for n in g.params] == ["w"]


def test_typed_field_initializers_import(make_model):
    """Initializers stored in float_data / int64_data (not raw_data) import the same."""
    w = helper.make_tensor("w", F, [2, 2], [1.0, 2.0, 3.0, 4.0])
    s = helper.make_tensor("s", I64, [2], [2, 2])
    m = make_model([helper.make_node("Reshape", ["x", "s"], ["r"], name="reshape"),
                    helper.make_node("MatMul", ["w", "r"], ["y"], name="mm")],
                   [("x", F, [4])], [("y", F, None)], [w, s])
    g = bz.import_onnx(m)
    np.testing.assert_array_equal(g.weights["w"], [[1, 2], [3, 4]])
    x = np.arange(4, dtype=np.float32)
    (y,) = bz.interpret(g, {"x": x})
    np.testing.assert_array_equal(y, np.array([[1, 2], [3, 4]], np.float32) @ x.reshape(2, 2))


def test_folding_at_import_gives_ieee_results_without_warnings(make_model):
    """T5's relative-position buckets take Log of relative positions that hold 0 (-inf on
    purpose, clamped later): small integer tables fold at import, with no NumPy warning."""
    import warnings

    m = make_model([helper.make_node("Cast", ["t"], ["tf"], name="cast", to=F),
                    helper.make_node("Log", ["tf"], ["l"], name="log"),
                    helper.make_node("Max", ["l", "floor"], ["c"], name="clamp"),
                    helper.make_node("Add", ["x", "c"], ["y"], name="add")],
                   [("x", F, [3])], [("y", F, None)],
                   [numpy_helper.from_array(np.array([0, 1, 8], np.int64), "t"),
                    numpy_helper.from_array(np.array(-5.0, np.float32), "floor")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = bz.import_onnx(m)
        y = bz.compile(g)({"x": np.zeros(3, np.float32)})[0]
    assert "log" not in g.op_counts()  # folded at import
    np.testing.assert_allclose(y, [-5.0, 0.0, np.log(8.0)], rtol=1e-6)
