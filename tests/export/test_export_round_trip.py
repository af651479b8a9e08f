"""Round trips through braze's own ONNX export: what bz.export_onnx writes, ONNX Runtime runs
to braze's numbers and bz.import_onnx reads back (float aranges)."""
import numpy as np
import onnxruntime as ort
import pytest

import braze as bz


def _ort(path, feeds):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.mark.parametrize("length,start,delta,dtype", [
    (10, 0.7, 0.1, bz.f32),   # float Range counted 11 elements: (1.7 - 0.7) / 0.1 > 10 in f32
    (3, 0.1, 0.1, bz.f64),
    ("n", 0.7, 0.1, bz.f32),  # a symbolic length: the float limit did not import back
])
def test_float_arange_exports_its_length_and_imports_back(tmp_path, length, start, delta, dtype):
    g = bz.Graph("ar")
    x = g.input("x", bz.Shape(("n",)))
    a = g.cast(g.arange(length, start=start, delta=delta, dtype=dtype), bz.f32)
    g.set_outputs([g.add(g.narrow(x, 0, 0, length), a) if length != "n" else g.add(x, a)])
    feeds = {"x": np.ones(10, np.float32)}
    want = bz.interpret(g, feeds)[0]
    path = bz.export_onnx(g, tmp_path / "ar.onnx", target="standard")
    np.testing.assert_allclose(_ort(path, feeds)[0], want, rtol=1e-6)
    np.testing.assert_allclose(bz.interpret(bz.import_onnx(path), feeds)[0], want, rtol=1e-6)
