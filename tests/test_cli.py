"""The `braze` command: inspect, fuse (report, JSON, saved graph), clear errors on bad input."""
import json

import pytest

import braze as bz
from braze.cli import main


def test_inspect_builtin(capsys):
    assert main(["inspect", "bert-tiny"]) == 0
    out = capsys.readouterr().out
    assert "graph bert_tiny" in out and "matmul" in out and "params" in out


def test_fuse_writes_report_and_graph(tmp_path, capsys):
    js, saved = tmp_path / "r.json", tmp_path / "fused.json"
    assert main(["fuse", "llama-tiny", "--json", str(js), "--save", str(saved), "--check"]) == 0
    out = capsys.readouterr().out
    assert "Fusion report" in out and "numeric check" in out
    data = json.loads(js.read_text())
    assert data["fused"]["fused_attention_block"] == 2
    g = bz.load(str(saved))
    assert g.count("fused_attention_block") == 2


def test_fuse_saved_graph_file(tmp_path, capsys):
    g = bz.models.bert_tiny()
    p = tmp_path / "bert.json"
    bz.save(g, str(p))
    assert main(["fuse", str(p), "--target", "gpu"]) == 0
    assert "target gpu" in capsys.readouterr().out


@pytest.mark.parametrize("argv, words", [
    (["fuse", "no-such-model"], "neither a builtin model"),
    (["fuse", "bert-tiny", "--target", "tpu"], "unknown target"),
])
def test_bad_input_exits_non_zero_with_a_clear_message(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_corrupt_file(tmp_path, capsys):
    p = tmp_path / "bad.json"
    p.write_text('{"format": "braze-graph", "version": 1, "nodes": [')
    assert main(["inspect", str(p)]) == 2
    assert "bad.json" in capsys.readouterr().err


def _tiny_onnx(path):
    """x [batch, 4] @ W + b -> relu: an ONNX file built with onnx.helper."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(4, 2), "w")
    b = numpy_helper.from_array(np.ones(2, np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
             helper.make_node("Add", ["h", "b"], ["hb"], name="bias"),
             helper.make_node("Relu", ["hb"], ["y"], name="act")]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["batch", 4])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["batch", 2])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10  # what ONNX Runtime 1.31 reads
    onnx.save(model, str(path))
    return path


def test_fuse_onnx_file_names_onnx_nodes_and_reports_progress(tmp_path, capsys):
    p = _tiny_onnx(tmp_path / "tiny.onnx")
    assert main(["fuse", str(p), "--check"]) == 0
    out, err = capsys.readouterr()
    assert "fused_matmul_bias_act" in out and "numeric check" in out
    assert "importing tiny.onnx" in err and "fusing" in err


def test_inspect_onnx_with_input_shape_override(tmp_path, capsys):
    p = _tiny_onnx(tmp_path / "tiny.onnx")
    assert main(["inspect", str(p), "--input-shape", "x=3x4", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "%x: f32[3, 4]" in out and "# proj" in out and err == ""


def test_input_shape_parsing_keeps_names_with_an_x():
    """Commas split the dims whenever there are any: 'max_len' is one dim, not 'ma', '_len'."""
    from braze.cli import _parse_input_shapes

    assert _parse_input_shapes(["ids=1,max_len", "x=1x3x32*hx32*w", "y=batch,3,32*h"]) == {
        "ids": (1, "max_len"), "x": (1, 3, "32*h", "32*w"), "y": ("batch", 3, "32*h")}


@pytest.mark.parametrize("content, words", [(b"", "empty"), (b"\x08\x07garbage\xff\xff", "not")])
def test_corrupt_onnx_file_is_a_one_line_error(tmp_path, capsys, content, words):
    p = tmp_path / "bad.onnx"
    p.write_bytes(content)
    assert main(["fuse", str(p)]) == 2
    err = capsys.readouterr().err
    assert "bad.onnx" in err and words in err and "Traceback" not in err


def test_bad_input_shape_option(tmp_path, capsys):
    p = _tiny_onnx(tmp_path / "tiny.onnx")
    assert main(["inspect", str(p), "--input-shape", "x"]) == 2
    assert "NAME=DIMS" in capsys.readouterr().err


def test_fuse_onnx_and_export_for_onnxruntime(tmp_path, capsys):
    import numpy as np
    import onnxruntime as ort

    p = _tiny_onnx(tmp_path / "tiny.onnx")
    out = tmp_path / "fused.onnx"
    assert main(["fuse", str(p), "--target", "onnxruntime", "--export", str(out), "--quiet"]) == 0
    assert "exported to" in capsys.readouterr().out
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    want = ort.InferenceSession(str(p)).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(out)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_run_and_bench_builtin_models(tmp_path, capsys):
    import numpy as np

    out = tmp_path / "out.npz"
    assert main(["run", "bert-tiny", "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "output 0: float32[2, 8, 64]" in text and "random weights" in text
    with np.load(out) as data:
        assert data["output_0"].shape == (2, 8, 64)
    assert main(["bench", "llama-tiny", "--repeat", "2", "--quiet", "--profile"]) == 0
    text = capsys.readouterr().out
    assert "ms median of 2" in text and "Profile:" in text


def test_run_with_feeds_file_and_bad_feeds(tmp_path, capsys):
    import numpy as np

    p = _tiny_onnx(tmp_path / "tiny.onnx")
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, x=np.ones((5, 4), np.float32))
    assert main(["run", str(p), "--feeds", str(feeds), "--quiet"]) == 0
    assert "output 0: float32[5, 2]" in capsys.readouterr().out
    np.savez(feeds, y=np.ones((5, 4), np.float32))
    assert main(["run", str(p), "--feeds", str(feeds), "--quiet"]) == 2
    assert "no arrays for inputs ['x']" in capsys.readouterr().err


@pytest.mark.parametrize("case, words", [
    ("corrupt feeds", "cannot read feeds from"), ("extra feed", "feeds name 'bogus'"),
    ("repeat 0", "needs a whole number >= 1"), ("input shape on a builtin", "take --dim"),
    ("huge dim", "out of memory"), ("nested json", "nested too deeply"),
    ("weights out of the folder", "a path or link out of the folder is refused")])
def test_hostile_or_mistaken_input_is_a_one_line_error(case, words, tmp_path, capsys):
    """Found by an API / CLI sweep: each of these had been a traceback or silently wrong."""
    import numpy as np

    tiny = str(_tiny_onnx(tmp_path / "tiny.onnx"))
    feeds = tmp_path / "feeds.npz"
    if case == "corrupt feeds":
        feeds.write_bytes(b"PK\x03\x04garbage")
        argv = ["run", tiny, "--feeds", str(feeds)]
    elif case == "extra feed":
        np.savez(feeds, x=np.ones((5, 4), np.float32), bogus=np.ones(3))
        argv = ["run", tiny, "--feeds", str(feeds)]
    elif case == "repeat 0":
        with pytest.raises(SystemExit):
            main(["bench", "bert-tiny", "--repeat", "0"])
        assert words in capsys.readouterr().err
        return
    elif case == "input shape on a builtin":
        argv = ["run", "bert-tiny", "--input-shape", "hidden=1x8x64"]
    elif case == "huge dim":
        argv = ["run", tiny, "--dim", "batch=99999999999"]
    elif case == "nested json":
        nested = tmp_path / "g.json"
        nested.write_text("[" * 100000 + "]" * 100000)
        argv = ["run", str(nested)]
    else:  # a saved graph whose weights entry points out of its folder
        (tmp_path / "sub").mkdir()
        bz.save(bz.models.bert_tiny(), str(tmp_path / "g.json"))
        doc = json.loads((tmp_path / "g.json").read_text())
        doc["weights"] = {"file": "../secret.npz", "entries": []}
        (tmp_path / "sub" / "g.json").write_text(json.dumps(doc))
        np.savez(tmp_path / "secret.npz", a=np.ones(2))
        argv = ["run", str(tmp_path / "sub" / "g.json")]
    assert main(argv + ["--quiet"]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and err.count("\n") <= 2, err


def test_run_out_names_the_file_np_savez_writes(tmp_path, capsys):
    assert main(["run", "bert-tiny", "--out", str(tmp_path / "outs"), "--quiet"]) == 0
    assert f"outputs written to {tmp_path / 'outs.npz'}" in capsys.readouterr().out
    assert (tmp_path / "outs.npz").exists()


# -- inspect --pipeline, and what the report says about builtin models ---------------------------
def test_inspect_pipeline_prints_every_stage_and_dumps_files(tmp_path, capsys):
    dump = tmp_path / "stages"
    assert main(["inspect", "--pipeline", "resnet-block", "--dump-dir", str(dump), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "Pipeline inspection of 'resnet_block' for target cpu" in out
    assert "== 00_built:" in out and "FuseConvBiasAct" in out and "_compiled:" in out
    files = sorted(p.name for p in dump.iterdir())
    assert files[0] == "00_built.txt" and "index.txt" in files
    assert any(f.endswith("_FuseConvBiasAct.txt") for f in files)
    assert "fused_conv_bias_act" in next(dump.glob("*_FuseConvBiasAct.txt")).read_text()


def test_inspect_pipeline_summary_only_and_dump_dir_needs_pipeline(tmp_path, capsys):
    assert main(["inspect", "--pipeline", "bert-tiny", "--summary-only", "--target", "gpu",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "for target gpu" in out and "00_built.txt" in out and "graph bert_tiny(" not in out
    assert main(["inspect", "bert-tiny", "--dump-dir", str(tmp_path), "--quiet"]) == 2
    assert "use it with --pipeline" in capsys.readouterr().err


def test_fuse_resnet_block_gives_no_bias_advice_for_the_residual(capsys):
    assert main(["fuse", "resnet-block", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "fused_conv_bias_act          2" in out
    assert "write the conv bias" not in out and "not fused: nothing" in out


def _console_script(tmp_path):
    """A copy of the `braze` console script pip writes, so the frames match a real run."""
    script = tmp_path / "braze"
    script.write_text("import sys\nfrom braze.cli import main\nif __name__ == '__main__':\n"
                      "    sys.argv[0] = sys.argv[0].removesuffix('.exe')\n"
                      "    sys.exit(main())\n")
    return script


def test_builtin_model_provenance_names_the_builder_line_via_the_console_script(tmp_path):
    import subprocess
    import sys

    run = subprocess.run([sys.executable, str(_console_script(tmp_path)), "inspect",
                          "resnet-block", "--quiet"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    node_lines = [line for line in run.stdout.splitlines() if " = " in line and "#" in line]
    assert node_lines
    assert all("# braze/models/resnet.py:" in line for line in node_lines)
    assert "braze:" not in run.stdout


def test_user_code_provenance_names_the_user_line_and_models_their_builder():
    import inspect

    g = bz.Graph("user")
    x = g.input("x", bz.Shape((2, 4)))
    line = inspect.currentframe().f_lineno + 1
    y = g.relu(x)
    g.set_outputs([y])
    assert g.nodes[y.node].provenance == f"test_cli.py:{line}"
    built = bz.models.bert_tiny()
    assert all(n.provenance.startswith("braze/models/") for n in built.nodes)


def test_run_binds_symbolic_dims_and_refuses_unknown_ones(tmp_path, capsys):
    g = bz.Graph("sym")
    x = g.input("x", bz.Shape(("batch", "seq", 4)))
    g.set_outputs([g.tanh(g.mm(x, g.param("w", bz.Shape((4, 3)))))])
    p = tmp_path / "sym.json"
    bz.save(g, str(p))
    assert main(["run", str(p), "--dim", "batch=2", "--dim", "seq=5"]) == 0
    assert "[2, 5, 3]" in capsys.readouterr().out
    assert main(["run", str(p), "--dim", "batch=2", "--dim", "sequence=5"]) == 2
    err = capsys.readouterr().err
    assert "--dim sequence" in err and "batch, seq" in err
    assert main(["bench", "bert-tiny", "--dim", "batch=1", "--repeat", "1"]) == 2
    assert "its shapes are static" in capsys.readouterr().err


def test_demo_times_its_variants_in_turns():
    """The demo's fused / unfused / bf16 comparison times the calls in alternating turns (a
    warm call each first), so drift on a shared machine hits all alike."""
    from braze.cli_exec import _interleaved_ms

    order = []
    ms = _interleaved_ms({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, 4)
    assert set(ms) == {"a", "b"} and all(v >= 0 for v in ms.values())
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]


def _strided_conv_onnx(path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="stem", strides=[2, 2],
                            pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "cnn", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["n", 3, "h", "w"])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def test_a_dynamic_image_size_error_names_the_command_line_option_and_the_option_works(
        tmp_path, capsys):
    p = _strided_conv_onnx(tmp_path / "cnn.onnx")
    assert main(["bench", str(p), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "stem" in err and "--input-shape NAME=DIMS" in err and "32*h" in err
    assert main(["run", str(p), "--input-shape", "x=batch,3,32*h,32*w", "--dim", "batch=2",
                 "--dim", "h=2", "--dim", "w=1", "--quiet"]) == 0
    assert "float32[2, 4, 32, 16]" in capsys.readouterr().out


# -- found by a held-out CLI sweep: each of these had been a Python traceback ----------------------
@pytest.mark.parametrize("name, content", [
    ("model.txt", b"\x08\x07\xbe\xef binary"), ("weights.npz", b"PK\x03\x04\x14\x00\x82\xff"),
    ("bad.json", b'{"format": "braze-graph", "name": "\xff\xfe\x80"}')])
def test_a_binary_or_non_utf8_model_file_is_a_one_line_error(name, content, tmp_path, capsys):
    p = tmp_path / name
    p.write_bytes(content)
    assert main(["run", str(p), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert name in err and "not UTF-8" in err and ".onnx" in err
    assert "Traceback" not in err and err.count("\n") == 1, err


def test_the_model_extension_is_case_insensitive(tmp_path, capsys):
    p = _tiny_onnx(tmp_path / "TINY.ONNX")
    assert main(["run", str(p), "--input-shape", "x=3x4", "--quiet"]) == 0
    assert "output 0: float32[3, 2]" in capsys.readouterr().out


def test_feeds_declaring_a_huge_array_are_refused_before_allocation(tmp_path, capsys):
    """Found by a hostile-file sweep: a feeds member whose .npy header declares f32[2**40, 4]
    in a few bytes was allocated (an 'out of memory' blaming --dim); one that is not .npy was
    handed to the executor as bytes."""
    import zipfile

    tiny = str(_tiny_onnx(tmp_path / "tiny.onnx"))
    head = "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 4), }"
    head += " " * (63 - (len(head) + 10) % 64) + "\n"
    for member, data, words in (
            ("x.npy", b"\x93NUMPY\x01\x00" + len(head).to_bytes(2, "little") + head.encode(),
             "'x.npy' declares float32[1099511627776, 4]"),
            ("x", b"\0" * 80, "member 'x' is not a NumPy array")):
        with zipfile.ZipFile(tmp_path / "feeds.npz", "w") as z:
            z.writestr(member, data)
        assert main(["run", tiny, "--feeds", str(tmp_path / "feeds.npz"), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert words in err and "out of memory" not in err and err.count("\n") == 1, err


def test_feeds_saved_with_np_save_are_a_one_line_error(tmp_path, capsys):
    import numpy as np

    tiny = str(_tiny_onnx(tmp_path / "tiny.onnx"))
    np.save(tmp_path / "x.npy", np.ones((5, 4), np.float32))
    assert main(["run", tiny, "--feeds", str(tmp_path / "x.npy"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "x.npy" in err and "np.savez" in err and "Traceback" not in err


def test_dim_conflicting_with_feeds_or_itself_is_refused(tmp_path, capsys):
    import numpy as np

    tiny = str(_tiny_onnx(tmp_path / "tiny.onnx"))
    np.savez(tmp_path / "f.npz", x=np.ones((5, 4), np.float32))
    assert main(["run", tiny, "--feeds", str(tmp_path / "f.npz"), "--dim", "batch=3",
                 "--quiet"]) == 2
    assert "drop --dim batch" in capsys.readouterr().err
    assert main(["run", tiny, "--dim", "batch=3", "--dim", "batch=4", "--quiet"]) == 2
    assert "--dim batch is given twice (3 and 4)" in capsys.readouterr().err


def test_bench_of_an_onnx_file_onnxruntime_cannot_run_still_times_braze(tmp_path, capsys):
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("LRN", ["x"], ["y"], size=2, name="lrn")  # ORT runs odd sizes only
    graph = helper.make_graph([node], "lrn", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 4, 5, 5])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 4, 5, 5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(tmp_path / "lrn.onnx"))
    assert main(["bench", str(tmp_path / "lrn.onnx"), "--repeat", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "braze compiled (f32)" in out and "onnxruntime: cannot run this model" in out


def test_bench_of_an_upper_case_onnx_name_times_onnxruntime_too(tmp_path, capsys):
    """model.ONNX imports as ONNX, so bench puts ONNX Runtime beside it as for model.onnx."""
    p = _tiny_onnx(tmp_path / "TINY.ONNX")
    assert main(["bench", str(p), "--dim", "batch=2", "--repeat", "1", "--quiet"]) == 0
    assert "onnxruntime: " in capsys.readouterr().out


@pytest.mark.parametrize("cmd", ["inspect", "fuse"])
def test_input_shape_on_a_builtin_points_inspect_and_fuse_to_no_missing_option(capsys, cmd):
    """inspect and fuse take no --dim: the refusal must not tell them to pass one."""
    assert main([cmd, "bert-tiny", "--input-shape", "hidden=1x8x64", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--input-shape fixes an ONNX model" in err and "take --dim" not in err
    assert "`braze run` / `bench`" in err


def test_ctrl_c_is_one_line_and_exit_code_130(monkeypatch, capsys):
    import braze.cli as cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_load_model", interrupted)
    try:
        rc = main(["inspect", "bert-tiny", "--quiet"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped main(): the user sees a Python traceback")
    assert rc == 130
    err = capsys.readouterr().err
    assert err == "braze: interrupted\n"


def test_fuse_export_of_a_builtin_model_exports_random_weights(tmp_path, capsys):
    import numpy as np
    import onnxruntime as ort

    out = tmp_path / "llama.onnx"
    assert main(["fuse", "llama-tiny", "--export", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "exporting random weights" in text and "exported to" in text
    sess = ort.InferenceSession(str(out))
    feeds = bz.random_feeds(bz.models.llama_tiny(), 0)
    (y,) = sess.run(None, {k: v for k, v in feeds.items()})[:1]
    assert np.isfinite(y).all()


def test_feeds_file_that_is_no_archive_is_not_called_a_pickle(tmp_path, capsys):
    """np.load reads an unknown format as a pickle and says to allow_pickle it; braze says the
    file is no .npz (a hostile file must not be met with advice to unpickle it)."""
    (tmp_path / "f.npz").write_text("name,value\nx,1\n")
    assert main(["run", "bert-tiny", "--feeds", str(tmp_path / "f.npz"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "not an .npz archive" in err and "pickle" not in err

