"""Graph outputs of an imported ONNX model (importer.py `_outputs`): ONNX's order is kept, and a
tensor listed more than once (what the TorchScript exporter writes for a module returning one
tensor twice) imports as one braze value returned at each position, which the interpreter, the
compiled executable and braze's ONNX export all run like ONNX Runtime does."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import braze as bz  # noqa: E402
from braze.errors import FrontendError  # noqa: E402

F32 = TensorProto.FLOAT


def doubled(make_model, outputs, x_dims=(4, 3)):
    """y = x * 2, z = y + 1; the graph returns `outputs` (names among x, y, z, w)."""
    nodes = [helper.make_node("Mul", ["x", "two"], ["y"], name="mul"),
             helper.make_node("Add", ["y", "one"], ["z"], name="add")]
    inits = [numpy_helper.from_array(np.array(2, np.float32), "two"),
             numpy_helper.from_array(np.array(1, np.float32), "one"),
             numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")]
    return make_model(nodes, [("x", F32, list(x_dims))], [(o, F32, None) for o in outputs],
                      inits)


@pytest.mark.parametrize("outputs", [["y", "y"], ["y", "z", "y"], ["z", "y", "y", "z"],
                                     ["x", "y", "x"], ["w", "z", "w"]])
def test_a_repeated_output_imports_and_runs(make_model, matches_ort, outputs):
    m = doubled(make_model, outputs)
    g = matches_ort(m, {"x": np.random.default_rng(0).standard_normal((4, 3), np.float32)})
    assert len(g.outputs) == len(outputs)
    for name, v in zip(outputs, g.outputs):
        first = outputs.index(name)
        assert v == g.outputs[first]          # one value per ONNX tensor


def test_repeated_outputs_are_separate_arrays_in_the_executable(make_model):
    g = bz.import_onnx(doubled(make_model, ["y", "y"]))
    a, b = bz.compile(g, "cpu")({"x": np.ones((4, 3), np.float32)})
    assert not np.shares_memory(a, b)
    a[...] = 0
    np.testing.assert_array_equal(b, 2)


def test_repeated_outputs_with_a_symbolic_batch_survive_fusion_and_export(make_model, ort_run,
                                                                          tmp_path):
    g = bz.import_onnx(doubled(make_model, ["z", "y", "z"], x_dims=("batch", 3)))
    fused, _ = bz.fuse(g, "cpu")
    path = tmp_path / "out.onnx"
    bz.export_onnx(fused, str(path), target="standard")
    x = np.random.default_rng(1).standard_normal((5, 3), np.float32)
    want = [2 * x + 1, 2 * x, 2 * x + 1]
    for got in (bz.interpret(fused, {"x": x}), ort_run(onnx.load(str(path)), {"x": x})):
        assert len(got) == 3
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-6)


def test_torch_module_returning_one_tensor_twice(matches_ort, tmp_path):
    """The sweep's reproduction: TorchScript lists the same ONNX value twice."""
    torch = pytest.importorskip("torch")
    import warnings

    class Twice(torch.nn.Module):
        def forward(self, x):
            y = x * 2
            return y, y

    x = torch.randn(4, 3)
    path = tmp_path / "dup.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Twice(), (x,), str(path), input_names=["x"], opset_version=17,
                          dynamo=False)
    model = onnx.load(str(path))
    assert [o.name for o in model.graph.output][0] == [o.name for o in model.graph.output][1]
    matches_ort(model, {"x": x.numpy()})


def test_an_output_nothing_produces_is_still_an_error(make_model):
    m = doubled(make_model, ["y", "nowhere"])
    with pytest.raises(FrontendError, match="graph output 'nowhere' is not produced"):
        bz.import_onnx(m)
