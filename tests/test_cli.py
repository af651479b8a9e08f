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
