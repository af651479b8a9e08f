"""ONNX SoftmaxCrossEntropyLoss imports as softmax_cross_entropy and matches ONNX Runtime: 2-D
and 3-D scores, every reduction, ignore_index (-100 and inside the classes), the log_prob
output; weights are refused naming the node; an out-of-range label raises when compiled."""
import numpy as np
import pytest

import braze as bz

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

RNG = np.random.default_rng(3)


def _model(score_dims, reduction, ignore_index, log_prob=False, weights=False):
    attrs = {"reduction": reduction}
    if ignore_index is not None:
        attrs["ignore_index"] = ignore_index
    inputs = ["scores", "labels"] + (["w"] if weights else [])
    outputs = ["loss"] + (["log_prob"] if log_prob else [])
    node = helper.make_node("SoftmaxCrossEntropyLoss", inputs, outputs, **attrs)
    label_dims = [score_dims[0], *score_dims[2:]]
    graph_inputs = [helper.make_tensor_value_info("scores", TensorProto.FLOAT, score_dims),
                    helper.make_tensor_value_info("labels", TensorProto.INT64, label_dims)]
    if weights:
        graph_inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT,
                                                          [score_dims[1]]))
    graph_outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs]
    graph = helper.make_graph([node], "sce", graph_inputs, graph_outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


CASES = [((4, 5), "mean", None), ((4, 5), "sum", -100), ((2, 5, 3), "mean", -100),
         ((2, 5, 3), "none", 2), ((2, 5, 3), "mean", 2)]


@pytest.mark.parametrize("dims, reduction, ignore_index", CASES)
def test_matches_onnx_runtime(dims, reduction, ignore_index):
    model = _model(list(dims), reduction, ignore_index, log_prob=True)
    scores = RNG.normal(size=dims).astype(np.float32)
    labels = RNG.integers(0, dims[1], size=(dims[0], *dims[2:])).astype(np.int64)
    if ignore_index == -100:
        labels.flat[1] = -100
    feeds = {"scores": scores, "labels": labels}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    g = bz.import_onnx(model)
    assert g.op_counts().get("softmax_cross_entropy") == 1
    for got in (bz.interpret(g, feeds), bz.compile(g)(feeds)):
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_weights_are_refused_and_bad_labels_raise_when_compiled():
    with pytest.raises(bz.BrazeError, match="SoftmaxCrossEntropyLoss.*per-class weights"):
        bz.import_onnx(_model([4, 5], "mean", None, weights=True))
    exe = bz.compile(bz.import_onnx(_model([4, 5], "mean", None)))
    with pytest.raises(bz.BrazeError, match=r"class labels must lie in \[0, 5\)"):
        exe({"scores": np.zeros((4, 5), np.float32), "labels": np.array([0, 1, -100, 2])})
