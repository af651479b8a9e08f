"""Round trips through braze's own ONNX export: what bz.export_onnx writes, ONNX Runtime runs
to braze's numbers and bz.import_onnx reads back (float aranges, symbolic dim expressions,
resizes by a scale)."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest

import braze as bz
from braze.export.onnx import ExportError


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


def test_dim_expressions_import_back_as_expressions(tmp_path):
    g = bz.Graph("poly")
    x = g.input("x", bz.Shape(("b*s", 8)))
    y = g.input("y", bz.Shape(("b", "s", 8)))
    z = g.input("z", bz.Shape(("n+1", 8)))
    g.set_outputs([g.add(g.reshape(x, ("b", "s", 8)), y), g.narrow(z, 0, 1, "n")])
    feeds = {"x": np.ones((6, 8), np.float32), "y": np.ones((2, 3, 8), np.float32),
             "z": np.arange(40, dtype=np.float32).reshape(5, 8)}
    path = bz.export_onnx(g, tmp_path / "poly.onnx")
    back = bz.import_onnx(path)
    assert [n.op.shape.dims for n in back.inputs] == [n.op.shape.dims for n in g.inputs]
    for got, want in zip(bz.interpret(back, feeds), bz.interpret(g, feeds), strict=True):
        np.testing.assert_array_equal(got, want)


def test_an_unbindable_dim_expression_stays_a_name(tmp_path):
    """A lone `batch*seq` input (an ORT-optimized model's packed tokens) binds no symbol by
    itself, so it stays one opaque dim as before."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch*seq", 4])
    out = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch*seq", 4])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g", [x], [out])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    g = bz.import_onnx(model)
    assert g.inputs[0].op.shape.dims == ("batch_seq", 4)
    assert bz.interpret(g, {"x": -np.ones((6, 4), np.float32)})[0].shape == (6, 4)


@pytest.mark.parametrize("n_in,size,scale,mode", [
    (10, 7, 0.7, "linear"),     # float32 0.7 * 10 floors to 6 in ONNX
    (100, 29, 0.29, "nearest"),
    (3, 7, 7 / 3, "cubic"),
])
def test_resize_with_a_scale_exports_its_size(tmp_path, n_in, size, scale, mode):
    g = bz.Graph("rs")
    x = g.input("x", bz.Shape((1, 2, n_in, n_in)))
    g.set_outputs([g.resize(x, (size, size), mode=mode, scale=(scale, scale))])
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 2, n_in, n_in), np.float32)}
    want = bz.interpret(g, feeds)[0]
    path = bz.export_onnx(g, tmp_path / "rs.onnx")
    np.testing.assert_allclose(_ort(path, feeds)[0], want, rtol=1e-4, atol=1e-5)


def test_interpolate_by_scale_factor_from_torch_exports(tmp_path):
    torch = pytest.importorskip("torch")

    class Down(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.interpolate(x, scale_factor=0.7, mode="bilinear")

    x = torch.randn(1, 2, 10, 10)
    path = bz.export_onnx(bz.import_torch(Down(), (x,)), tmp_path / "down.onnx")
    np.testing.assert_allclose(_ort(path, {"x": x.numpy()})[0], Down()(x).numpy(), rtol=1e-4,
                               atol=1e-5)


def test_resize_size_that_disagrees_with_its_scale_is_named(tmp_path):
    g = bz.Graph("rs")
    x = g.input("x", bz.Shape((1, 2, 5, 5)))
    g.set_outputs([g.resize(x, (8, 8), mode="linear", scale=(1.5, 1.5))])
    with pytest.raises(ExportError, match=r"floor\(5 \* 1.5\) = 7 .* not the size 8"):
        bz.export_onnx(g, tmp_path / "rs.onnx")
