"""Malformed and hostile ONNX models: each gets a braze error naming the file or node, never a
crash from deep inside. The fuzz tests mutate the seed models and a real BERT export (dropped
nodes, swapped or dangling inputs, corrupted shapes, dtypes, attributes and initializers, cycles,
truncated or flipped bytes) and assert that braze either imports a graph that verifies (and
fuses) or raises a BrazeError."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import braze as bz  # noqa: E402
from braze.errors import BrazeError  # noqa: E402
from braze.ir.verify import verify  # noqa: E402

FUZZ_SEEDS = range(60)


def _import_or_braze_error(data: bytes, what: str):
    """Import `data`; a graph must verify and fuse, any failure must be a BrazeError."""
    try:
        g = bz.import_onnx(data)
    except BrazeError as e:
        assert str(e), what
        return None
    except Exception as e:  # noqa: BLE001 - the point of the test
        pytest.fail(f"{what}: {type(e).__name__} escaped the importer: {e}")
    verify(g)
    try:
        bz.fuse(g, "cpu")
    except BrazeError as e:
        pytest.fail(f"{what}: bz.fuse raised on a graph that verifies: {e}")
    return g


# -- named malformations --------------------------------------------------------------------------
def _model(seed_models, name="attention"):
    m = onnx.ModelProto()
    m.ParseFromString(seed_models[name][0])
    return m


def test_truncated_bytes_name_the_problem(seed_models):
    data = seed_models["attention"][0]
    for cut in (1, 7, len(data) // 3, len(data) - 5):
        with pytest.raises(BrazeError):
            bz.import_onnx(data[:cut])


def test_bytes_that_are_not_onnx_are_refused(tmp_path):
    p = tmp_path / "notes.onnx"
    p.write_bytes(b"this is a text file, not a model\n" * 10)
    with pytest.raises(BrazeError, match="notes.onnx"):
        bz.import_onnx(str(p))
    with pytest.raises(BrazeError):
        bz.import_onnx(b"\x00\xff" * 64)


def test_missing_file_is_a_braze_error(tmp_path):
    with pytest.raises(BrazeError, match="nope.onnx"):
        bz.import_onnx(str(tmp_path / "nope.onnx"))


def test_missing_initializer_is_a_dangling_input(seed_models):
    m = _model(seed_models)
    victim = m.graph.initializer[0].name
    del m.graph.initializer[0]
    with pytest.raises(BrazeError, match=victim):
        bz.import_onnx(m)


def test_cycle_between_nodes_is_refused(seed_models):
    m = _model(seed_models)
    a, b = m.graph.node[1], m.graph.node[2]
    a.input[0] = b.output[0]           # a reads b, and b (transitively) reads a
    if a.output[0] not in b.input:
        b.input[0] = a.output[0]
    with pytest.raises(BrazeError):
        bz.import_onnx(m)


def test_duplicate_output_names_are_refused(seed_models):
    m = _model(seed_models)
    m.graph.node[1].output[0] = m.graph.node[0].output[0]
    with pytest.raises(BrazeError, match=m.graph.node[0].output[0]):
        bz.import_onnx(m)


def test_unknown_domain_lists_the_node(seed_models):
    m = _model(seed_models)
    m.graph.node[0].domain = "com.example.secret"
    with pytest.raises(BrazeError) as e:
        bz.import_onnx(m)
    assert "com.example.secret" in str(e.value) or m.graph.node[0].op_type in str(e.value)


def test_initializer_whose_bytes_do_not_match_its_dims(seed_models):
    m = _model(seed_models)
    t = next(t for t in m.graph.initializer if len(t.dims) >= 1 and t.dims[0] > 1)
    t.dims[0] += 3
    with pytest.raises(BrazeError, match=t.name):
        bz.import_onnx(m)


# -- fuzzing ---------------------------------------------------------------------------------------
def _names(m) -> list[str]:
    vals = [i.name for i in m.graph.input] + [t.name for t in m.graph.initializer]
    for n in m.graph.node:
        vals.extend(o for o in n.output if o)
    return vals


def _mutate(m, rng) -> str:
    """Apply one random mutation to `m` in place; returns its description."""
    g = m.graph
    kind = rng.choice(["drop_node", "swap_inputs", "dangling", "reroute", "input_dim",
                       "input_dtype", "init_dims", "init_dtype", "attr_int", "drop_attr",
                       "drop_output", "op_type", "extra_input", "init_raw"])
    nodes = list(g.node)
    if kind == "drop_node" and nodes:
        i = int(rng.integers(len(nodes)))
        del g.node[i]
        return f"dropped node {i}"
    if kind == "swap_inputs":
        cands = [n for n in nodes if len(n.input) >= 2]
        if cands:
            n = cands[int(rng.integers(len(cands)))]
            n.input[0], n.input[1] = n.input[1], n.input[0]
            return f"swapped inputs of {n.name}"
    if kind == "dangling" and nodes:
        n = nodes[int(rng.integers(len(nodes)))]
        if n.input:
            n.input[int(rng.integers(len(n.input)))] = "nowhere_" + str(int(rng.integers(99)))
            return f"dangling input on {n.name}"
    if kind == "reroute" and nodes:
        n = nodes[int(rng.integers(len(nodes)))]
        names = _names(m)
        if n.input and names:
            n.input[int(rng.integers(len(n.input)))] = names[int(rng.integers(len(names)))]
            return f"rerouted an input of {n.name}"
    if kind == "input_dim" and len(g.input):
        t = g.input[int(rng.integers(len(g.input)))].type.tensor_type
        if t.shape.dim:
            d = t.shape.dim[int(rng.integers(len(t.shape.dim)))]
            d.dim_value = int(rng.choice([0, 1, 3, 1 << 40]))
            return "changed an input dim"
    if kind == "input_dtype" and len(g.input):
        g.input[int(rng.integers(len(g.input)))].type.tensor_type.elem_type = \
            int(rng.choice([0, 2, 7, 8, 9, 11, 16, 99]))
        return "changed an input dtype"
    if kind in ("init_dims", "init_dtype", "init_raw") and len(g.initializer):
        t = g.initializer[int(rng.integers(len(g.initializer)))]
        if kind == "init_dims" and t.dims:
            t.dims[int(rng.integers(len(t.dims)))] = int(rng.choice([0, 1, 5, -2]))
        elif kind == "init_dtype":
            t.data_type = int(rng.choice([0, 6, 7, 10, 13, 99]))
        elif t.raw_data:
            t.raw_data = t.raw_data[: len(t.raw_data) // 2]
        return f"corrupted initializer {t.name} ({kind})"
    if kind in ("attr_int", "drop_attr"):
        cands = [n for n in nodes if len(n.attribute)]
        if cands:
            n = cands[int(rng.integers(len(cands)))]
            a = n.attribute[int(rng.integers(len(n.attribute)))]
            if kind == "drop_attr":
                n.attribute.remove(a)
            elif a.type == onnx.AttributeProto.INT:
                a.i = int(rng.choice([-7, 0, 5, 1 << 33]))
            elif a.type == onnx.AttributeProto.INTS and len(a.ints):
                a.ints[0] = int(rng.choice([-7, 0, 9]))
            else:
                a.type = onnx.AttributeProto.INT
            return f"{kind} {a.name} on {n.name}"
    if kind == "drop_output" and len(g.output) and nodes:
        n = nodes[int(rng.integers(len(nodes)))]
        if n.output:
            n.output[0] = ""
            return f"emptied the output of {n.name}"
    if kind == "op_type" and nodes:
        n = nodes[int(rng.integers(len(nodes)))]
        n.op_type = str(rng.choice(["Add", "Relu", "MatMul", "Reshape", "Softmax", "Bogus"]))
        return f"op_type of {n.name} -> {n.op_type}"
    if kind == "extra_input" and nodes:
        n = nodes[int(rng.integers(len(nodes)))]
        n.input.append(_names(m)[0])
        return f"extra input on {n.name}"
    return "no-op"


def _fuzz(data: bytes, seed: int, what: str) -> None:
    rng = np.random.default_rng(seed)
    m = onnx.ModelProto()
    m.ParseFromString(data)
    done = [_mutate(m, rng) for _ in range(int(rng.integers(1, 4)))]
    _import_or_braze_error(m.SerializeToString(), f"{what} seed {seed}: {done}")


@pytest.mark.parametrize("seed", FUZZ_SEEDS)
def test_mutated_seed_models_import_or_raise_a_braze_error(seed_models, seed):
    names = sorted(seed_models)
    _fuzz(seed_models[names[seed % len(names)]][0], seed, names[seed % len(names)])


@pytest.mark.parametrize("seed", range(12))
def test_flipped_and_truncated_bytes_import_or_raise_a_braze_error(seed_models, seed):
    rng = np.random.default_rng(1000 + seed)
    data = bytearray(seed_models[sorted(seed_models)[seed % len(seed_models)]][0])
    for _ in range(int(rng.integers(1, 6))):
        data[int(rng.integers(len(data)))] = int(rng.integers(256))
    if seed % 3 == 0:
        data = data[: int(rng.integers(1, len(data)))]
    _import_or_braze_error(bytes(data), f"byte mutation {seed}")


@pytest.mark.parametrize("seed", range(16))
def test_mutated_real_bert_export_imports_or_raises_a_braze_error(hf_zoo, seed):
    with open(hf_zoo.onnx("bert", "sdpa"), "rb") as f:
        data = f.read()
    _fuzz(data, 5000 + seed, "bert sdpa export")


def test_names_that_are_not_utf8_match_their_readers(tmp_path):
    """Found by a hostile-file sweep: protobuf hands back bytes for a string field that is not
    UTF-8. A dim_param like that was a TypeError, a graph name a bytes name that bz.save could
    not write, an initializer or external data location a misleading or non-braze error."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "QQw"], ["QQy"], name="QQmm")], "QQgraph",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["QQbatch", 4])],
        [helper.make_tensor_value_info("QQy", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "QQw")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    g = bz.import_onnx(m.SerializeToString().replace(b"QQ", b"Q\xa7"))
    assert g.name == "Q\ufffdgraph" and list(g.weights) == ["Q\ufffdw"]
    assert g.dynamic_symbols() == ["Q_batch"]
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(bz.interpret(g, {"x": x})[0], x @ w)
    bz.save(g, tmp_path / "g.json")
    assert bz.load(tmp_path / "g.json") == g
    t = m.graph.initializer[0]
    (tmp_path / "QQ.bin").write_bytes(t.raw_data)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value="QQ.bin")
    (tmp_path / "ext.onnx").write_bytes(m.SerializeToString().replace(b"QQ", b"Q\xa7"))
    with pytest.raises(BrazeError, match="external data file 'Q\ufffd.bin' of tensor"):
        bz.import_onnx(tmp_path / "ext.onnx")


def test_sparse_initializers_are_named_not_reported_missing():
    """Found by a hostile-file sweep: a model whose bias is a sparse initializer got "node add
    reads 'b', which no graph input, initializer or node produces"."""
    from onnx import TensorProto, helper, numpy_helper

    b = helper.make_sparse_tensor(numpy_helper.from_array(np.float32([1, 2]), "b"),
                                  numpy_helper.from_array(np.int64([0, 2]), "b_idx"), [3])
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["y"], name="add")], "sparse",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], sparse_initializer=[b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(bz.FrontendError, match=r"initializer\(s\) \['b'\] are sparse"):
        bz.import_onnx(m)
