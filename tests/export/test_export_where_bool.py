"""A where over bool values exports to a model ONNX Runtime runs (its CPU provider has no bool
Where kernel), to braze's numbers, with broadcasting."""
import numpy as np
import onnxruntime as ort
import pytest

import braze as bz
from braze.export.onnx import to_onnx_model


@pytest.mark.parametrize("target", ["standard", "onnxruntime"])
def test_where_of_bools_runs_in_ort(target):
    g = bz.Graph("where_bool")
    c = g.input("c", bz.Shape((2, 3, 4), bz.bool_))
    x = g.input("x", bz.Shape((3, 4), bz.bool_))
    y = g.input("y", bz.Shape((2, 1, 4), bz.bool_))
    g.set_outputs([g.where(c, x, y)])
    feeds = bz.random_feeds(g, 0)
    sess = ort.InferenceSession(to_onnx_model(g, target).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    (got,), (want,) = sess.run(None, feeds), bz.interpret(g, feeds)
    assert got.dtype == want.dtype == np.bool_ and got.shape == want.shape == (2, 3, 4)
    np.testing.assert_array_equal(got, want)
