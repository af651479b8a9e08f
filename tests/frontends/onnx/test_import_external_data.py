"""Models whose weights live in external data files: they import (one data file or one per
tensor, memory-mapped or read, from a path or from bytes with base_dir=), and a data location
that is absolute, climbs out with "..", or reaches outside through a symlink is refused with an
error naming the model, the tensor and the location; a missing or short data file is an error
too, never an exception from deep inside."""
from __future__ import annotations

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import braze as bz  # noqa: E402
from braze.errors import FrontendError  # noqa: E402

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)
W = RNG.standard_normal((16, 8)).astype(np.float32)
B = RNG.standard_normal(8).astype(np.float32)
C = RNG.standard_normal((1, 8)).astype(np.float32)


def model():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["hb"], name="bias"),
             helper.make_node("Constant", [], ["c"], name="const",
                              value=numpy_helper.from_array(C)),
             helper.make_node("Mul", ["hb", "c"], ["y"], name="scale")]
    g = helper.make_graph(nodes, "ext", [helper.make_tensor_value_info("x", F, ["n", 16])],
                          [helper.make_tensor_value_info("y", F, None)],
                          [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def expected(x):
    return (x @ W + B) * C


def save_external(folder, one_file=True, **kw):
    path = os.path.join(folder, "model.onnx")
    onnx.save(model(), path, save_as_external_data=True, all_tensors_to_one_file=one_file,
              location="weights.bin" if one_file else None, size_threshold=0,
              convert_attribute=True, **kw)
    return path


def check(g):
    x = RNG.standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(bz.interpret(g, {"x": x})[0], expected(x), rtol=1e-5)


@pytest.mark.parametrize("one_file", [True, False])
@pytest.mark.parametrize("mmap", [None, True, False])
def test_external_data_imports(tmp_path, one_file, mmap):
    path = save_external(str(tmp_path), one_file)
    assert len(os.listdir(tmp_path)) > 1  # the weights really are outside the .onnx file
    g = bz.import_onnx(path, mmap=mmap)
    np.testing.assert_array_equal(g.weights["w"], W)
    assert not g.weights["w"].flags.writeable  # a view of the data file's bytes
    check(g)


def test_bytes_with_external_data_need_base_dir(tmp_path):
    path = save_external(str(tmp_path))
    data = open(path, "rb").read()
    with pytest.raises(FrontendError, match="external data.*base_dir"):
        bz.import_onnx(data)
    check(bz.import_onnx(data, base_dir=tmp_path))


def relocate(path, out, location, names=("w",)):
    """Copy of the model at `path` whose tensors `names` point at `location`."""
    m = onnx.load(path, load_external_data=False)
    for t in m.graph.initializer:
        if t.name in names:
            for e in t.external_data:
                if e.key == "location":
                    e.value = location
    onnx.save(m, out)
    return out


@pytest.mark.parametrize("location", [
    "/etc/passwd", "../weights.bin", "sub/../../weights.bin", "C:\\weights.bin",
    "\\\\server\\share\\weights.bin",
])
def test_locations_outside_the_folder_are_refused(tmp_path, location):
    inner = tmp_path / "model"
    inner.mkdir()
    path = save_external(str(inner))
    (tmp_path / "weights.bin").write_bytes((inner / "weights.bin").read_bytes())
    bad = relocate(path, str(inner / "bad.onnx"), location)
    with pytest.raises(FrontendError) as e:
        bz.import_onnx(bad)
    msg = str(e.value)
    assert "bad.onnx" in msg and "'w'" in msg and "outside the model's folder" in msg


def test_symlink_out_of_the_folder_is_refused(tmp_path):
    inner = tmp_path / "model"
    inner.mkdir()
    path = save_external(str(inner))
    secret = tmp_path / "secret.bin"
    secret.write_bytes((inner / "weights.bin").read_bytes())
    os.symlink(secret, inner / "link.bin")
    bad = relocate(path, str(inner / "bad.onnx"), "link.bin")
    with pytest.raises(FrontendError, match=r"resolves outside the model's folder"):
        bz.import_onnx(bad)
    # a link that stays inside the folder is fine
    os.symlink(inner / "weights.bin", inner / "inside.bin")
    ok = relocate(path, str(inner / "ok.onnx"), "inside.bin", names=("w", "b"))
    check(bz.import_onnx(ok))


def test_missing_and_short_data_files(tmp_path):
    path = save_external(str(tmp_path))
    missing = relocate(path, str(tmp_path / "missing.onnx"), "nowhere.bin")
    with pytest.raises(FrontendError, match=r"'nowhere.bin'.*'w' is missing"):
        bz.import_onnx(missing)
    data = (tmp_path / "weights.bin").read_bytes()
    (tmp_path / "weights.bin").write_bytes(data[:100])
    with pytest.raises(FrontendError, match=r"truncated data file"):
        bz.import_onnx(path)


def test_external_data_offset_is_checked(tmp_path):
    path = save_external(str(tmp_path))
    m = onnx.load(path, load_external_data=False)
    for e in m.graph.initializer[0].external_data:
        if e.key == "offset":
            e.value = "not a number"
    onnx.save(m, str(tmp_path / "bad.onnx"))
    with pytest.raises(FrontendError, match=r"malformed external data offset"):
        bz.import_onnx(str(tmp_path / "bad.onnx"))


def test_symlink_loops_and_nul_bytes_are_braze_errors(tmp_path):
    """Found by a hostile-file sweep: a model path or data location that is a symlink loop was a
    RuntimeError from Path.resolve(), a location with a NUL byte a ValueError."""
    path = save_external(str(tmp_path))
    os.symlink(tmp_path / "loop_b.onnx", tmp_path / "loop_a.onnx")
    os.symlink(tmp_path / "loop_a.onnx", tmp_path / "loop_b.onnx")
    with pytest.raises(FrontendError, match=r"cannot read ONNX model .*loop_a.onnx"):
        bz.import_onnx(tmp_path / "loop_a.onnx")
    looped = relocate(path, str(tmp_path / "looped.onnx"), "loop_a.onnx")
    with pytest.raises(FrontendError, match=r"looped.onnx: cannot read external data "
                       r"'loop_a.onnx' of tensor 'w'"):
        bz.import_onnx(looped)
    nul = relocate(path, str(tmp_path / "nul.onnx"), "weights\0.bin")
    with pytest.raises(FrontendError, match=r"nul.onnx: tensor 'w' .* NUL byte"):
        bz.import_onnx(nul)
    data = open(path, "rb").read()
    with pytest.raises(FrontendError, match=r"cannot use .*loop_a.onnx.* external data"):
        bz.import_onnx(data, base_dir=tmp_path / "loop_a.onnx")
