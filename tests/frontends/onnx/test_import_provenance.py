"""Provenance and the unsupported-ops error: every braze node an ONNX node turns into records
that node's name (inputs record "input <name>", weights their initializer's name), so reports
point at the ONNX graph; a model with ops braze lacks fails once, listing every missing op type
with a node that uses it."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

import braze as bz  # noqa: E402
from braze.errors import UnsupportedOpsError  # noqa: E402
from braze.ir.ops.io import Input, Param  # noqa: E402

F = TensorProto.FLOAT


def check_provenance(g, m) -> None:
    """Every node's provenance names its origin in `m`."""
    names = {n.name for n in m.graph.node}
    unnamed = {f"{n.op_type}:{n.output[0]}" for n in m.graph.node if not n.name}
    inits = {t.name for t in m.graph.initializer}
    for node in g.nodes:
        if isinstance(node.op, Input):
            assert node.provenance == f"input {node.op.name}"
        elif isinstance(node.op, Param):
            assert node.provenance in inits | names, node.describe()
        else:
            assert node.provenance in names | unnamed, node.describe()


@pytest.mark.parametrize("seed", ["attention", "cnn", "embedding"])
def test_seed_models_record_onnx_node_names(seed_models, seed):
    data, _ = seed_models[seed]
    m = onnx.load_from_string(data)
    g = bz.import_onnx(data)
    check_provenance(g, m)
    # every ONNX node that computes at run time shows up in some braze node's provenance
    used = {n.provenance for n in g.nodes}
    folded = {"shape", "get_batch", "get_seq", "unsq_b", "unsq_s", "cat", "seq_len",
              "slice"}  # shape arithmetic, and a Slice of the whole axis (no node)
    for n in m.graph.node:
        if n.name not in folded and n.op_type not in ("Shape", "Identity"):
            assert n.name in used, n.name


def test_multi_node_conversions_share_the_onnx_name(make_model):
    """HardSwish is written as several braze nodes: all carry the ONNX node's name; an unnamed
    ONNX node is named by its op type and first output."""
    m = make_model([helper.make_node("HardSwish", ["x"], ["h"], name="act/hswish"),
                    helper.make_node("Relu", ["h"], ["y"])],
                   [("x", F, [2, 3])], [("y", F, None)], opset=14)
    g = bz.import_onnx(m)
    by_prov = {}
    for n in g.nodes:
        by_prov.setdefault(n.provenance, []).append(n.op.label)
    assert len(by_prov["act/hswish"]) >= 3
    assert by_prov["Relu:y"] == ["relu"]
    check_provenance(g, m)


def test_real_export_provenance(hf_zoo):
    path = hf_zoo.onnx("bert", "sdpa")
    m = onnx.load(path)
    g = bz.import_onnx(path)
    check_provenance(g, m)
    matmuls = [n.provenance for n in g.nodes if n.op.kind == "matmul"]
    assert matmuls and all("/" in p for p in matmuls)  # torch module paths, e.g. .../query/MatMul


def test_unsupported_ops_are_listed_once_with_node_names(make_model):
    nodes = [
        helper.make_node("NonZero", ["x"], ["nz"], name="where_nonzero"),
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Hardmax", ["r"], ["h1"], name="hardmax_1"),
        helper.make_node("Hardmax", ["h1"], ["h2"], name="hardmax_2"),
        helper.make_node("Bar", ["h2"], ["y"], name="custom_bar", domain="com.example"),
    ]
    m = make_model(nodes, [("x", F, [2, 3])], [("y", F, None), ("nz", TensorProto.INT64, None)])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOpsError) as e:
        bz.import_onnx(m)
    err = e.value
    assert err.ops == {"NonZero": "where_nonzero", "Hardmax": "hardmax_1",
                       "com.example::Bar": "custom_bar"}
    msg = str(err)
    for text in ("3 op type(s)", "NonZero (e.g. node 'where_nonzero')",
                 "Hardmax (e.g. node 'hardmax_1')", "com.example::Bar (e.g. node 'custom_bar')"):
        assert text in msg
    assert "Relu" in msg.split("Supported ONNX ops:")[1]  # and what braze does support


def test_provenance_reaches_import_and_run_time_errors(make_model):
    """Errors name the ONNX node: at import (a Reshape target computed at run time) and when
    the reference interpreter fails (an index out of range)."""
    m = make_model([helper.make_node("Reshape", ["x", "s"], ["y"], name="bad_reshape")],
                   [("x", F, ["n"]), ("s", TensorProto.INT64, [2])], [("y", F, None)])
    with pytest.raises(bz.FrontendError, match="bad_reshape"):
        bz.import_onnx(m)
    m = make_model([helper.make_node("Gather", ["x", "i"], ["y"], name="lookup", axis=0)],
                   [("x", F, [3, 2]), ("i", TensorProto.INT64, [1])], [("y", F, None)])
    g = bz.import_onnx(m)
    with pytest.raises(bz.InterpretError, match="from lookup"):
        bz.interpret(g, {"x": np.ones((3, 2), np.float32), "i": np.array([7])})
