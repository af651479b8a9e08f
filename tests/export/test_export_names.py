"""Tensor names the exporter makes up (constants, node outputs, the graph outputs "output",
"output_1") never repeat a graph input's or param's name, so export -> import_onnx -> export
works and inputs / params may be called anything."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest

import braze as bz
from braze.export.onnx import to_onnx_model
from braze.op_examples import example_graph


def _runs_like(model, g, params=None):
    onnx.checker.check_model(model, full_check=True)
    feeds = bz.random_feeds(g, 0)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, want in zip(sess.run(None, feeds), bz.interpret(g, feeds, params), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", ["standard", "onnxruntime"])
def test_export_import_export_round_trip(target):
    g = example_graph("resize_nearest_2x")
    again = bz.import_onnx(to_onnx_model(g, target))
    assert [n.op.name for n in again.params]  # the first export's constant, now a param
    _runs_like(to_onnx_model(again, target), g)


def test_inputs_and_params_named_like_generated_tensors():
    g = bz.Graph("names")
    x = g.input("output", bz.Shape((2, 3)))
    y = g.input("output_1", bz.Shape((2, 3)))
    w = g.param("tanh_1", bz.Shape((3,)))
    g.set_outputs([g.mul(g.tanh(x), w), g.add(x, y)])
    params = {"tanh_1": np.arange(3, dtype=np.float32)}
    model = to_onnx_model(g, "standard", params=params)
    assert [i.name for i in model.graph.input] == ["output", "output_1"]
    _runs_like(model, g, params)
