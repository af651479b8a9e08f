"""Bindings a graph refuses (`Input.excludes`) are refused by its ONNX export too.

An ONNX model branching on `Shape(x)[0] > 1` imports for N >= 2 and refuses N = 1; its export
used to compute the N >= 2 branch at N = 1 in ONNX Runtime (a silently wrong 2.0 where the
original gives 3.0). The export now carries a guard that fails in ONNX Runtime, at every
optimization level, naming why; the exclusions travel in metadata_props, so braze -> ONNX ->
braze keeps them and drops the guard nodes. A graph without exclusions exports as before."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

import braze as bz  # noqa: E402

LEVELS = ["ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL"]


def _if_model():
    """y = x.sum() + (1 if N > 1 else 2): braze decides the If for N >= 2, refusing N = 1."""
    branch = lambda name, v: helper.make_graph(  # noqa: E731
        [helper.make_node("Constant", [], [f"c_{name}"],
                          value=helper.make_tensor("v", TensorProto.FLOAT, [], [v]))],
        name, [], [helper.make_tensor_value_info(f"c_{name}", TensorProto.FLOAT, [])])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Greater", ["n", "one"], ["big"]),
             helper.make_node("If", ["big"], ["c"], name="pick", then_branch=branch("t", 1.0),
                              else_branch=branch("e", 2.0)),
             helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             helper.make_node("Add", ["total", "c"], ["y"])]
    g = helper.make_graph(nodes, "if_n", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N"])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [])],
        [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
         helper.make_tensor("one", TensorProto.INT64, [], [1])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _session(model, level="ORT_ENABLE_ALL"):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _exported(g, tmp_path):
    return onnx.load(bz.export_onnx(g, tmp_path / "m.onnx"))


def test_imported_graph_refuses_what_the_original_model_computes_otherwise():
    g = bz.import_onnx(_if_model())
    with pytest.raises(bz.InterpretError, match="binds N = 1"):
        bz.interpret(g, {"x": np.ones(1, np.float32)})
    (orig,) = _session(_if_model()).run(None, {"x": np.ones(1, np.float32)})
    assert orig == 3.0


@pytest.mark.parametrize("level", LEVELS)
def test_export_runs_allowed_bindings_and_refuses_excluded_ones(tmp_path, level):
    g = bz.import_onnx(_if_model())
    sess = _session(_exported(g, tmp_path), level)
    for n in (2, 5):
        x = np.arange(n, dtype=np.float32)
        (got,) = sess.run(None, {"x": x})
        np.testing.assert_array_equal(got, bz.interpret(g, {"x": x})[0])
    for n in (0, 1):
        with pytest.raises(Exception, match=rf"braze_refuses_N_eq_{n}__") as err:
            sess.run(None, {"x": np.ones(n, np.float32)})
        assert "node_big_Greater" in str(err.value)  # why: the decision braze took, where


def _ranged_graph():
    g = bz.Graph("ranged")
    x = g.input("x", bz.Shape(("B", 3), bz.f32),
                excludes=[("B", 4, 6, "made for B < 4 or B > 6"),
                          ("B", 10, None, "trained for B < 10")])
    g.set_outputs([g.relu(x), g.neg(x)])
    return g


@pytest.mark.parametrize("level", LEVELS)
def test_ranges_and_open_ranges_are_refused(tmp_path, level):
    sess = _session(_exported(_ranged_graph(), tmp_path), level)
    for b in (2, 3, 7, 9):
        x = np.random.default_rng(b).standard_normal((b, 3)).astype(np.float32)
        relu, neg = sess.run(None, {"x": x})
        np.testing.assert_array_equal(relu, np.maximum(x, 0))
        np.testing.assert_array_equal(neg, -x)
    for b, why in ((4, "B_in_4_6__made_for_B"), (6, "B_in_4_6"), (10, "B_ge_10__trained"),
                   (50, "B_ge_10")):
        with pytest.raises(Exception, match=f"braze_refuses_{why}"):
            sess.run(None, {"x": np.zeros((b, 3), np.float32)})


def test_round_trip_keeps_the_exclusions_and_drops_the_guard(tmp_path):
    g = _ranged_graph()
    model = _exported(g, tmp_path)
    back = bz.import_onnx(model)
    (x_op,) = [n.op for n in back.inputs]
    assert set(x_op.excludes) == set(g.inputs[0].op.excludes)
    kinds = {n.op.kind for n in back.nodes}
    assert kinds == {"input", "unary"}, kinds  # relu, neg: no guard arithmetic
    with pytest.raises(bz.InterpretError, match="trained for B < 10"):
        bz.interpret(back, {"x": np.zeros((12, 3), np.float32)})
    again = _exported(back, tmp_path)
    assert [n.op_type for n in again.graph.node] == [n.op_type for n in model.graph.node]


def test_graph_without_exclusions_exports_as_before(tmp_path):
    g = bz.Graph("plain")
    x = g.input("x", bz.Shape(("B", 3), bz.f32))
    g.set_outputs([g.relu(x)])
    model = _exported(g, tmp_path)
    assert [n.op_type for n in model.graph.node] == ["Relu", "Identity"]
    assert not any(n.name.startswith("braze_") for n in model.graph.node)
    assert not model.metadata_props


@pytest.mark.parametrize("level", LEVELS)
def test_outputs_of_every_dtype_pass_the_guard_unchanged(tmp_path, level):
    g = bz.Graph("dtypes")
    x = g.input("x", bz.Shape(("B",), bz.f32), excludes=[("B", 1, 1, "decided for B >= 2")])
    outs = [g.cast(x, dt) for dt in (bz.f16, bz.f64, bz.i8, bz.i16, bz.i32, bz.i64, bz.u8,
                                     bz.bool_)]
    g.set_outputs([g.neg(x), g.reshape(g.sum(x), ()), *outs])
    sess = _session(_exported(g, tmp_path), level)
    x = np.asarray([1.0, -2.0, 0.0], np.float32)
    for got, want in zip(sess.run(None, {"x": x}), bz.interpret(g, {"x": x}), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    with pytest.raises(Exception, match="braze_refuses_B_eq_1__decided_for_B_2"):
        sess.run(None, {"x": x[:1]})
