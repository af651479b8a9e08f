"""Ops whose form changed between opsets import in every form and agree with ONNX Runtime:
Squeeze / Unsqueeze axes (attribute until 12, input from 13), reductions' axes (attribute, input
from 13 for ReduceSum and 18 for the others, noop_with_empty_axes), Split sizes (attribute,
input from 13, num_outputs from 18) and Softmax / LogSoftmax before 13 (normalizing over all
dims from `axis`, flattened)."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import braze as bz  # noqa: E402

F = TensorProto.FLOAT


def ints(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def agree(g, model, ort_run, feeds):
    got = bz.interpret(g, feeds)
    want = ort_run(model, feeds)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    return got


def axes_node(op, opset, axes, inputs=("x",), **attrs):
    """`op` with `axes` as attribute (old opsets) or as an initializer input (new ones)."""
    new_form = {"Squeeze": 13, "Unsqueeze": 13, "ReduceSum": 13}.get(op, 18)
    if axes is None:
        return helper.make_node(op, list(inputs), ["y"], name="node", **attrs), []
    if opset >= new_form:
        return (helper.make_node(op, [*inputs, "axes"], ["y"], name="node", **attrs),
                [ints("axes", axes)])
    return helper.make_node(op, list(inputs), ["y"], name="node", axes=list(axes), **attrs), []


@pytest.mark.parametrize("opset", [11, 13, 17])
@pytest.mark.parametrize("op, axes, shape", [
    ("Squeeze", [1, -1], [3, 1, 4, 1]),
    ("Squeeze", None, [1, 3, 1, 4]),
    ("Unsqueeze", [0, 3], [3, 4]),
    ("Unsqueeze", [-1, 1], [3, 4]),
])
def test_squeeze_unsqueeze_axes(make_model, ort_run, opset, op, axes, shape):
    node, inits = axes_node(op, opset, axes)
    m = make_model([node], [("x", F, shape)], [("y", F, None)], inits, opset=opset)
    g = bz.import_onnx(m)
    assert g.op_counts() == {"reshape": 1}
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    agree(g, m, ort_run, {"x": x})


@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceProd"])
@pytest.mark.parametrize("axes, keepdims", [([1], 1), ([0, -1], 0), (None, 1)])
def test_reduction_axes(make_model, ort_run, opset, op, axes, keepdims):
    node, inits = axes_node(op, opset, axes, keepdims=keepdims)
    m = make_model([node], [("x", F, [2, 3, 4])], [("y", F, None)], inits, opset=opset)
    g = bz.import_onnx(m)
    x = np.random.default_rng(1).uniform(0.5, 1.5, (2, 3, 4)).astype(np.float32)
    agree(g, m, ort_run, {"x": x})


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
def test_reduction_noop_with_empty_axes(make_model, ort_run, op):
    opset = 18
    m = make_model([helper.make_node(op, ["x"], ["y"], name="node", noop_with_empty_axes=1)],
                   [("x", F, [2, 3])], [("y", F, None)], opset=opset)
    g = bz.import_onnx(m)
    assert g.op_counts() == {}  # the input passes through
    agree(g, m, ort_run, {"x": np.arange(6, dtype=np.float32).reshape(2, 3)})


@pytest.mark.parametrize("form, opset", [
    ("attribute", 11), ("input", 13), ("input", 18), ("equal", 13), ("num_outputs", 18),
])
def test_split_forms(make_model, ort_run, form, opset):
    outs = ["a", "b", "c"]
    inits = []
    if form == "attribute":
        node = helper.make_node("Split", ["x"], outs, name="split", axis=1, split=[2, 3, 2])
    elif form == "input":
        node = helper.make_node("Split", ["x", "sizes"], outs, name="split", axis=1)
        inits = [ints("sizes", [2, 3, 2])]
    elif form == "equal":  # no sizes: equal parts
        node = helper.make_node("Split", ["x"], outs, name="split", axis=1)
    else:  # opset 18: num_outputs, the last part smaller
        node = helper.make_node("Split", ["x"], outs, name="split", axis=1, num_outputs=3)
    width = 6 if form == "equal" else 7
    m = make_model([node], [("x", F, [2, width])], [(o, F, None) for o in outs], inits,
                   opset=opset)
    g = bz.import_onnx(m)
    assert g.op_counts() == {"narrow": 3}
    x = np.arange(2 * width, dtype=np.float32).reshape(2, width)
    got = agree(g, m, ort_run, {"x": x})
    want = {"attribute": [2, 3, 2], "input": [2, 3, 2], "equal": [2, 2, 2],
            "num_outputs": [3, 3, 1]}[form]
    assert [a.shape[1] for a in got] == want


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset, axis", [(11, 1), (11, 0), (11, -1), (13, 1), (13, -1)])
def test_softmax_before_and_after_13(make_model, ort_run, op, opset, axis):
    m = make_model([helper.make_node(op, ["x"], ["y"], name="sm", axis=axis)],
                   [("x", F, [2, 3, 4])], [("y", F, None)], opset=opset)
    g = bz.import_onnx(m)
    x = np.random.default_rng(2).standard_normal((2, 3, 4)).astype(np.float32)
    (y,) = agree(g, m, ort_run, {"x": x})
    flattened = opset < 13 and axis % 3 != 2
    assert (g.count("reshape") == 2) == flattened
    if op == "Softmax" and flattened:  # rows of the flattened [.., rest] view sum to one
        np.testing.assert_allclose(y.reshape(int(np.prod(x.shape[:axis % 3])), -1).sum(-1),
                                   1.0, rtol=1e-5)


def test_softmax_default_axis_differs_between_opsets(make_model, ort_run):
    """No axis attribute: opset 11 normalizes dims 1.. together, opset 13 the last dim."""
    x = np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)
    results = []
    for opset in (11, 13):
        m = make_model([helper.make_node("Softmax", ["x"], ["y"], name="sm")],
                       [("x", F, [2, 3, 4])], [("y", F, None)], opset=opset)
        results.append(agree(bz.import_onnx(m), m, ort_run, {"x": x})[0])
    np.testing.assert_allclose(results[0].sum(axis=(1, 2)), 1.0, rtol=1e-5)
    np.testing.assert_allclose(results[1].sum(axis=-1), 1.0, rtol=1e-5)
    assert not np.allclose(results[0], results[1])
