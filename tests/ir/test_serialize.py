"""`bz.save` / `bz.load`: versioned JSON plus a `<stem>.weights.npz` sidecar; a round trip
gives an equal graph with bit-identical weights, and every kind of damaged file raises a braze
error that names the file."""
from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import braze as bz
from braze.ir.equality import graph_diff
from braze.ir.serialize import sidecar_path
from braze.testing import random_graphs


def weighted_graph() -> bz.Graph:
    g = bz.Graph("mlp")
    x = g.input("x", bz.Shape(("batch", "seq", 4)))
    w = g.param("w", bz.Shape((4, 3)), np.arange(12, dtype=np.float32).reshape(4, 3) / 7)
    b = g.param("b", bz.Shape((3,), bz.bf16), np.array([0.1, -2.5, 3e-3], ml_dtypes.bfloat16))
    k = g.param("k", bz.Shape((2,), bz.i64), np.array([7, -1]))
    h = g.add(g.mm(x, w), g.cast(b, bz.f32))
    g.set_outputs([g.gelu(h), k])
    return g


def test_save_load_round_trips_graph_and_weights(tmp_path):
    g = weighted_graph()
    path = tmp_path / "model.json"
    bz.save(g, path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "braze-graph" and doc["version"] == 1
    assert doc["weights"]["file"] == "model.weights.npz"
    assert os.path.exists(tmp_path / "model.weights.npz")
    back = bz.load(path)
    assert graph_diff(g, back) is None
    assert back.node(0).op.shape.dims == ("batch", "seq", 4)
    for name, arr in g.weights.items():
        got = back.weights[name]
        assert got.dtype == arr.dtype and got.tobytes() == arr.tobytes()
    assert back.weights["b"].dtype == ml_dtypes.bfloat16


def test_graph_without_weights_writes_no_sidecar(tmp_path):
    g = bz.Graph("plain")
    g.set_outputs([g.relu(g.input("x", bz.Shape((2,))))])
    bz.save(g, tmp_path / "plain.json")
    assert os.listdir(tmp_path) == ["plain.json"]
    assert bz.load(str(tmp_path / "plain.json")) == g


def test_equality_sees_weight_changes_after_load(tmp_path):
    g = weighted_graph()
    bz.save(g, tmp_path / "m.json")
    back = bz.load(tmp_path / "m.json")
    back.weights["w"] = back.weights["w"] + np.float32(1)
    assert back != g and "weight 'w'" in graph_diff(g, back)


def test_region_bodies_and_constants_survive(tmp_path):
    body = bz.Graph("body")
    body.set_outputs([body.mul(body.input("in0", bz.Shape(("n",))), 0.5)])
    g = bz.Graph("outer")
    x = g.input("x", bz.Shape(("n",)))
    c = g.constant(np.arange(30, dtype=np.float16))
    g.set_outputs([g.elementwise_region(body, [x]), c])
    bz.save(g, tmp_path / "r.json")
    assert graph_diff(g, bz.load(tmp_path / "r.json")) is None


# -- damaged files ------------------------------------------------------------------------------
def _edit_json(fn):
    def apply(path):
        doc = json.loads(open(path).read())
        fn(doc)
        with open(path, "w") as f:
            json.dump(doc, f)
    return apply


def _nodes(doc):
    return doc["graph"]["nodes"]


def _write_sidecar(path, **arrays):
    np.savez(sidecar_path(path), **arrays)


def _npy_claiming(shape) -> bytes:
    """A .npy header declaring f32`shape` followed by no data."""
    head = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {tuple(shape)!r}, }}"
    head += " " * (63 - (len(head) + 10) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(head).to_bytes(2, "little") + head.encode()


def _sidecar_members(path, **members):
    """Rewrite the sidecar: its arrays, with `members` (name -> bytes) replacing or added."""
    import io
    import zipfile

    with np.load(sidecar_path(path)) as npz:
        arrays = {k: npz[k] for k in npz.files}
    with zipfile.ZipFile(sidecar_path(path), "w") as z:
        for k, a in arrays.items():
            if f"{k}.npy" in members:
                continue
            buf = io.BytesIO()
            np.save(buf, a)
            z.writestr(f"{k}.npy", buf.getvalue())
        for name, data in members.items():
            z.writestr(name, data)


CORRUPTIONS = {
    "truncated json": lambda p: open(p, "r+").truncate(os.path.getsize(p) // 2),
    "not json": lambda p: open(p, "w").write("<html>"),
    "wrong format": _edit_json(lambda d: d.update(format="onnx")),
    "newer version": _edit_json(lambda d: d.update(version=2)),
    "missing graph": _edit_json(lambda d: d.pop("graph")),
    "unknown op kind": _edit_json(lambda d: _nodes(d)[4].update(kind="frobnicate")),
    "bad attr type": _edit_json(lambda d: _nodes(d)[1]["attrs"].update(shape=12)),
    "unknown enum": _edit_json(lambda d: _nodes(d)[7].update(attrs={"fn": "gelux"})),
    "missing attr": _edit_json(lambda d: _nodes(d)[6].update(attrs={})),
    "extra attr": _edit_json(lambda d: _nodes(d)[4]["attrs"].update(alpha=1)),
    "input from later node": _edit_json(lambda d: _nodes(d)[4].update(inputs=[[0, 0], [6, 0]])),
    "input from unknown node": _edit_json(lambda d: _nodes(d)[4].update(inputs=[[0, 0], [99, 0]])),
    "input from itself": _edit_json(lambda d: _nodes(d)[4].update(inputs=[[0, 0], [4, 0]])),
    "bad output index": _edit_json(lambda d: _nodes(d)[4].update(inputs=[[0, 0], [1, 3]])),
    "malformed value": _edit_json(lambda d: _nodes(d)[4].update(inputs=[[0, 0], "w"])),
    "stored shape differs": _edit_json(lambda d: _nodes(d)[4].update(outputs=["f32[2, 3]"])),
    "inputs no longer type-check": _edit_json(
        lambda d: _nodes(d)[1].update(attrs={"name": "w", "shape": "f32[5, 3]"},
                                      outputs=["f32[5, 3]"])),
    "id not position": _edit_json(lambda d: _nodes(d)[2].update(id=7)),
    "duplicate node name": _edit_json(lambda d: _nodes(d)[2].update(name="x")),
    "graph output unknown": _edit_json(lambda d: d["graph"].update(outputs=[[42, 0]])),
    "inputs list a param": _edit_json(lambda d: d["graph"].update(inputs=[1])),
    "missing sidecar": lambda p: os.remove(sidecar_path(p)),
    "corrupt sidecar": lambda p: open(sidecar_path(p), "wb").write(b"PK\x03\x04 garbage"),
    "truncated sidecar": lambda p: open(sidecar_path(p), "r+b").truncate(100),
    "sidecar lacks an array": lambda p: _write_sidecar(p, w0=np.zeros((4, 3), np.float32)),
    "weight shape mismatch": _edit_json(
        lambda d: d["weights"]["entries"][0].update(shape=[3, 4])),
    "weight for no param": _edit_json(
        lambda d: d["weights"]["entries"][0].update(name="nope")),
    "entry name not a string": _edit_json(lambda d: d["weights"]["entries"][0].update(name=[])),
    "entry key not a string": _edit_json(lambda d: d["weights"]["entries"][0].update(key={})),
    "sidecar array not .npy": lambda p: _sidecar_members(p, **{"w0.npy": b"raw bytes"}),
    "sidecar declares a huge array": lambda p: _sidecar_members(
        p, **{"w0.npy": _npy_claiming((1 << 40,))}),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_damaged_files_raise_braze_errors_naming_the_file(tmp_path, case):
    path = str(tmp_path / "damaged_model.json")
    bz.save(weighted_graph(), path)
    CORRUPTIONS[case](path)
    with pytest.raises((bz.ParseError, bz.GraphError)) as e:
        bz.load(path)
    assert "damaged_model" in str(e.value)


def test_sidecar_arrays_are_checked_against_their_size_before_allocation(tmp_path):
    """Found by a hostile-file sweep: a sidecar member declaring f32[2**40] in a few bytes was
    allocated (MemoryError, or GiBs for 2**31), even when no entry used it; a member that is not
    .npy was an AttributeError, an entry whose name is a list a TypeError."""
    path = str(tmp_path / "m.json")
    bz.save(weighted_graph(), path)
    _sidecar_members(path, **{"unused.npy": _npy_claiming((1 << 40,)), "junk": b"?"})
    assert bz.load(path) == weighted_graph()  # members no entry names are not read
    bz.save(weighted_graph(), path)
    _sidecar_members(path, **{"w0.npy": _npy_claiming((1 << 31,))})
    with pytest.raises(bz.ParseError, match=r"'w0.npy' declares float32\[2147483648\] "
                       r"\(8589934592 bytes\) but holds 0 bytes"):
        bz.load(path)


def test_damaged_file_messages_say_what_is_wrong(tmp_path):
    path = str(tmp_path / "m.json")
    bz.save(weighted_graph(), path)
    _edit_json(lambda d: _nodes(d)[4].update(inputs=[[0, 0], [6, 0]]))(path)
    with pytest.raises(bz.GraphError, match="topological order"):
        bz.load(path)
    bz.save(weighted_graph(), path)
    _edit_json(lambda d: _nodes(d)[4].update(kind="frobnicate"))(path)
    with pytest.raises(bz.ParseError, match="node 4 .*unknown op kind 'frobnicate'"):
        bz.load(path)
    with pytest.raises(bz.ParseError, match="cannot read"):
        bz.load(tmp_path / "absent.json")


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(random_graphs(max_nodes=12))
def test_random_graphs_round_trip_through_files(tmp_path, g):
    weights = bz.init_params(g, seed=0)
    for name, arr in weights.items():
        g.set_weight(name, arr)
    path = tmp_path / "random.json"
    bz.save(g, path)
    back = bz.load(path)
    assert graph_diff(g, back) is None
    bz.verify(back)


def test_bodies_nested_past_the_recursion_limit_are_a_parse_error(tmp_path):
    """Found by a hostile-file sweep: 300 `if` bodies nested in one another (160 KB of JSON,
    which json reads) were a RecursionError from bz.load."""
    from braze.ir.ops.control import If

    body = bz.Graph("b")
    body.set_outputs([body.relu(body.input("x", bz.Shape((2,))))])
    g = bz.Graph("o")
    x = g.input("x", bz.Shape((2,)))
    g.set_outputs(list(g.add_node(If(then_graph=body, else_graph=body),
                                  [g.constant(np.array(True), bz.bool_), x])))
    bz.save(g, tmp_path / "if.json")
    doc = json.loads((tmp_path / "if.json").read_text())
    top = doc["graph"]
    top["nodes"][2]["attrs"]["then_graph"] = "@"  # each level's `if` runs the next level
    level, text = json.dumps(top), json.dumps(top["nodes"][2]["attrs"]["else_graph"])
    for _ in range(200):  # written as text: json.dumps itself cannot nest this deep
        text = level.replace('"@"', text)
    doc["graph"] = "@"
    (tmp_path / "deep.json").write_text(json.dumps(doc).replace('"@"', text))
    with pytest.raises(bz.ParseError, match="deep.json: .*nested too deeply"):
        bz.load(tmp_path / "deep.json")


def _load_steps(path) -> int:
    """Python and builtin calls made while loading `path` (a work count, not a time)."""
    import sys

    count = 0

    def tick(frame, event, arg):
        nonlocal count
        count += 1

    sys.setprofile(tick)
    try:
        bz.load(path)
    finally:
        sys.setprofile(None)
    return count


def test_loading_weights_is_linear_in_the_number_of_params(tmp_path):
    """Each stored weight rebuilt the name -> param table, so loading P weights took P^2 steps
    (8,000 params: 28 s)."""
    steps = []
    for n in (200, 400):
        g = bz.Graph("many")
        x = g.input("x", bz.Shape((2,)))
        for i in range(n):
            x = g.add(x, g.param(f"p{i}", bz.Shape((2,)), np.ones(2, np.float32)))
        g.set_outputs([x])
        bz.save(g, tmp_path / f"m{n}.json")
        steps.append(_load_steps(tmp_path / f"m{n}.json"))
    assert steps[1] < 2.3 * steps[0], steps
