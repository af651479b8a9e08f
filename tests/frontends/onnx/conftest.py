"""Fixtures for the ONNX importer tests.

`onnx_case`: ONNX's own node conformance cases (onnx.backend.test.case.node), one test per case.
Generating them runs ONNX's reference implementations (~40 s, the pooling cases most of it), so
they are generated once per onnx version and kept in pytest's cache folder
(.pytest_cache/d/braze-onnx-node-cases), shared by the xdist workers through a file lock; a warm
run reads them in ~0.2 s. Each case is stored with its model already retargeted (see
`_retarget`) and its data sets as NumPy arrays.

`seed_models`: small ONNX models built with onnx.helper (a transformer-ish block with symbolic
batch / seq, a CNN block, shape arithmetic) for the fuzz and reliability tests."""
from __future__ import annotations

import fcntl
import functools
import os
import pickle
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest

CASE_FORMAT = 1              # bump when the stored record layout changes
OPSET_MIN, OPSET_MAX = 11, 21
RETARGET_FROM_MAX = 28       # newer cases (type-only opset bumps) are retried at opset 21


# -- ONNX node conformance cases ----------------------------------------------------------------
def _cache_dir(config) -> Path:
    cache = getattr(config, "cache", None)
    if cache is not None:
        return Path(cache.mkdir("braze-onnx-node-cases"))
    folder = Path(tempfile.gettempdir()) / f"braze-onnx-node-cases-{os.getuid()}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _default_opset(model) -> int | None:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return None


def _retarget(model):
    """`model` at opset 21 when its default-domain opset is 22..28 and the ONNX checker accepts
    it there (the bumps since 21 add element types: the cases test the same semantics); the
    model itself when its opset is <= 21; None otherwise."""
    import onnx

    v = _default_opset(model)
    if v is None or v <= OPSET_MAX:
        return model
    if v > RETARGET_FROM_MAX:
        return None
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = OPSET_MAX
    m.ir_version = min(m.ir_version, 10)
    try:
        onnx.checker.check_model(m, full_check=True)
    except Exception:  # noqa: BLE001 - not valid at opset 21: the case is newer than braze
        return None
    return m


def _arrays(values):
    from onnx import TensorProto, numpy_helper

    out = []
    for v in values:
        if isinstance(v, TensorProto):
            v = numpy_helper.to_array(v)
        out.append(v)
    return out


def _generate() -> list[dict]:
    """Every node test case in ONNX's default domain, as plain records."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    records = []
    for c in cases:
        if any(n.domain not in ("", "ai.onnx") for n in c.model.graph.node):
            continue
        opset = _default_opset(c.model)
        model = _retarget(c.model)
        if model is None:
            continue
        records.append({
            "name": c.name,
            "model": model.SerializeToString(),
            "opset": opset,
            "ops": sorted({n.op_type for n in model.graph.node}),
            "data_sets": [(_arrays(ins), _arrays(outs)) for ins, outs in c.data_sets],
            "rtol": c.rtol,
            "atol": c.atol,
        })
    return records


def load_node_cases(config) -> list[dict]:
    """The cached conformance records (generated on first use, under a lock)."""
    import onnx

    folder = _cache_dir(config)
    path = folder / f"cases-onnx{onnx.__version__}-v{CASE_FORMAT}.pkl"
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            try:
                with open(path, "rb") as f:
                    return pickle.load(f)
            except (OSError, EOFError, pickle.UnpicklingError):
                path.unlink(missing_ok=True)  # a broken cache file: regenerate it
        records = _generate()
        tmp = path.with_suffix(".partial")
        with open(tmp, "wb") as f:
            pickle.dump(records, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
        return records


def selected_node_cases(config) -> list[dict]:
    """Cases whose ops braze claims (SUPPORTED_OPS) at opsets 11..21 (after retargeting)."""
    from braze.frontends.onnx import SUPPORTED_OPS

    supported = set(SUPPORTED_OPS())
    out = []
    for rec in load_node_cases(config):
        opset = min(rec["opset"], OPSET_MAX)
        if OPSET_MIN <= opset <= OPSET_MAX and set(rec["ops"]) <= supported:
            out.append(rec)
    return out


@pytest.fixture(scope="session")
def node_case_names(request) -> list[str]:
    """Names of the selected conformance cases (those `onnx_case` runs)."""
    return [c["name"] for c in selected_node_cases(request.config)]


def pytest_generate_tests(metafunc):
    if "onnx_case" in metafunc.fixturenames:
        cases = selected_node_cases(metafunc.config)
        metafunc.parametrize("onnx_case", cases, ids=[c["name"] for c in cases])
    if "old_opset_case" in metafunc.fixturenames:
        from braze.frontends.onnx import SUPPORTED_OPS

        supported = set(SUPPORTED_OPS())
        cases = [c for c in load_node_cases(metafunc.config)
                 if c["opset"] < OPSET_MIN and set(c["ops"]) <= supported]
        metafunc.parametrize("old_opset_case", cases, ids=[c["name"] for c in cases])


# -- small seed models --------------------------------------------------------------------------
@pytest.fixture(scope="session")
def seed_models() -> dict[str, tuple]:
    """name -> (serialized ONNX model, feeds(rng, batch=2, seq=5) -> input arrays)."""
    return {name: (data, functools.partial(seed_feeds, name))
            for name, data in build_seed_models().items()}


def build_seed_models() -> dict[str, bytes]:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def init(name, arr):
        return numpy_helper.from_array(np.asarray(arr), name)

    def model(nodes, inputs, outputs, inits, opset=17):
        g = helper.make_graph(nodes, "seed", inputs, outputs, inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                                 ir_version=8).SerializeToString()

    f32 = TensorProto.FLOAT
    seeds = {}
    # a transformer-ish block: symbolic batch / seq, shape arithmetic into Reshape, attention
    d, h = 8, 2
    x = helper.make_tensor_value_info("x", f32, ["batch", "seq", d])
    mask = helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "seq"])
    y = helper.make_tensor_value_info("y", f32, ["batch", "seq", d])
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"], name="shape"),
        helper.make_node("Gather", ["shp", "i0"], ["b"], name="get_batch", axis=0),
        helper.make_node("Gather", ["shp", "i1"], ["s"], name="get_seq", axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"], name="unsq_b"),
        helper.make_node("Unsqueeze", ["s", "ax0"], ["s1"], name="unsq_s"),
        helper.make_node("Concat", ["b1", "s1", "heads"], ["tgt"], name="cat", axis=0),
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
        helper.make_node("Add", ["q", "bq"], ["qb"], name="q_bias"),
        helper.make_node("Reshape", ["qb", "tgt"], ["q4"], name="q_split"),
        helper.make_node("Transpose", ["q4"], ["qt"], name="q_heads", perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["q4"], ["kt"], name="k_heads", perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["qt", "kt"], ["sc"], name="scores"),
        helper.make_node("Mul", ["sc", "scale"], ["scs"], name="scale"),
        helper.make_node("Cast", ["mask"], ["mf"], name="mask_cast", to=f32),
        helper.make_node("Unsqueeze", ["mf", "ax12"], ["m4"], name="mask_unsq"),
        helper.make_node("Sub", ["one", "m4"], ["inv"], name="mask_inv"),
        helper.make_node("Mul", ["inv", "neg"], ["bias"], name="mask_bias"),
        helper.make_node("Add", ["scs", "bias"], ["sm_in"], name="mask_add"),
        helper.make_node("Softmax", ["sm_in"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "qt"], ["ctx"], name="context"),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], name="merge_t", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merge"], ["ctx2"], name="merge_heads"),
        helper.make_node("Add", ["ctx2", "x"], ["res"], name="residual"),
        helper.make_node("LayerNormalization", ["res", "gamma", "beta"], ["y"], name="ln",
                         axis=-1, epsilon=1e-5),
    ]
    inits = [
        init("i0", np.array(0, np.int64)), init("i1", np.array(1, np.int64)),
        init("ax0", np.array([0], np.int64)), init("ax12", np.array([1, 2], np.int64)),
        init("heads", np.array([h, d // h], np.int64)),
        init("merge", np.array([0, 0, d], np.int64)),
        init("wq", rng.standard_normal((d, d)).astype(np.float32) * 0.3),
        init("bq", rng.standard_normal(d).astype(np.float32) * 0.1),
        init("scale", np.array(1 / np.sqrt(d // h), np.float32)),
        init("one", np.array(1.0, np.float32)), init("neg", np.array(-1e4, np.float32)),
        init("gamma", np.ones(d, np.float32)), init("beta", np.zeros(d, np.float32)),
    ]
    seeds["attention"] = model(nodes, [x, mask], [y], inits)

    # a CNN block: conv, batch norm, relu, pool, flatten, gemm
    xi = helper.make_tensor_value_info("img", f32, [1, 3, 8, 8])
    yo = helper.make_tensor_value_info("logits", f32, [1, 5])
    nodes = [
        helper.make_node("Conv", ["img", "cw", "cb"], ["c"], name="conv", pads=[1, 1, 1, 1],
                         kernel_shape=[3, 3]),
        helper.make_node("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"],
                         name="bn"),
        helper.make_node("Relu", ["bn"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["gp"], name="gap"),
        helper.make_node("Flatten", ["gp"], ["fl"], name="flatten", axis=1),
        helper.make_node("Gemm", ["fl", "fw", "fb"], ["logits"], name="fc", transB=1),
    ]
    inits = [
        init("cw", rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.2),
        init("cb", rng.standard_normal(4).astype(np.float32) * 0.1),
        init("bn_s", rng.uniform(0.5, 1.5, 4).astype(np.float32)),
        init("bn_b", rng.standard_normal(4).astype(np.float32) * 0.1),
        init("bn_m", rng.standard_normal(4).astype(np.float32) * 0.1),
        init("bn_v", rng.uniform(0.5, 1.5, 4).astype(np.float32)),
        init("fw", rng.standard_normal((5, 4)).astype(np.float32) * 0.3),
        init("fb", rng.standard_normal(5).astype(np.float32) * 0.1),
    ]
    seeds["cnn"] = model(nodes, [xi], [yo], inits)

    # shape / mask arithmetic: position ids, a causal mask from Range, Expand, Slice, Split
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])
    emb_out = helper.make_tensor_value_info("out", f32, ["batch", "seq", 6])
    nodes = [
        helper.make_node("Shape", ["ids"], ["shp"], name="shape"),
        helper.make_node("Gather", ["shp", "i1"], ["s"], name="seq_len", axis=0),
        helper.make_node("Range", ["zero", "s", "step"], ["pos"], name="positions"),
        helper.make_node("Unsqueeze", ["pos", "ax0"], ["pos2"], name="pos_unsq"),
        helper.make_node("Expand", ["pos2", "shp"], ["posb"], name="pos_expand"),
        helper.make_node("Gather", ["tok", "ids"], ["te"], name="tok_emb", axis=0),
        helper.make_node("Gather", ["pemb", "posb"], ["pe"], name="pos_emb", axis=0),
        helper.make_node("Add", ["te", "pe"], ["e"], name="emb_add"),
        helper.make_node("Split", ["e", "split"], ["e1", "e2"], name="split", axis=2),
        helper.make_node("Tanh", ["e1"], ["t1"], name="tanh"),
        helper.make_node("Sigmoid", ["e2"], ["t2"], name="sigmoid"),
        helper.make_node("Concat", ["t1", "t2"], ["cat"], name="concat", axis=2),
        helper.make_node("Slice", ["cat", "st", "en", "ax2"], ["out"], name="slice"),
    ]
    inits = [
        init("i1", np.array(1, np.int64)), init("zero", np.array(0, np.int64)),
        init("step", np.array(1, np.int64)), init("ax0", np.array([0], np.int64)),
        init("tok", rng.standard_normal((11, 6)).astype(np.float32)),
        init("pemb", rng.standard_normal((32, 6)).astype(np.float32)),
        init("split", np.array([2, 4], np.int64)),
        init("st", np.array([0], np.int64)), init("en", np.array([6], np.int64)),
        init("ax2", np.array([2], np.int64)),
    ]
    seeds["embedding"] = model(nodes, [ids], [emb_out], inits)
    return seeds


def seed_feeds(name: str, rng, batch: int = 2, seq: int = 5) -> dict[str, np.ndarray]:
    """Random inputs for seed model `name`."""
    if name == "attention":
        mask = np.ones((batch, seq), np.int64)
        mask[0, -1] = 0
        return {"x": rng.standard_normal((batch, seq, 8)).astype(np.float32), "mask": mask}
    if name == "cnn":
        return {"img": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    return {"ids": rng.integers(0, 11, (batch, seq)).astype(np.int64)}


# -- helpers for hand-built models --------------------------------------------------------------
@pytest.fixture(scope="session")
def ort_run():
    """run(model, feeds) -> outputs of ONNX Runtime on the CPU."""
    ort = pytest.importorskip("onnxruntime")

    def run(model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        data = model if isinstance(model, bytes) else model.SerializeToString()
        options = ort.SessionOptions()
        options.log_severity_level = 3
        sess = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        return sess.run(None, feeds)

    return run


@pytest.fixture(scope="session")
def make_model():
    """make(nodes, inputs, outputs, initializers=(), opset=17) -> ModelProto; inputs and
    outputs are (name, TensorProto type, dims) triples (dims None: unknown)."""
    from onnx import helper

    def make(nodes, inputs, outputs, initializers=(), opset: int = 17, ir_version: int = 8):
        vi = [helper.make_tensor_value_info(n, t, d) for n, t, d in inputs]
        vo = [helper.make_tensor_value_info(n, t, d) for n, t, d in outputs]
        graph = helper.make_graph(list(nodes), "test", vi, vo, list(initializers))
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                 ir_version=ir_version)

    return make


@pytest.fixture(scope="session")
def matches_ort(ort_run):
    """check(model, feeds, input_shapes=None, rtol=1e-5, atol=1e-5) -> the imported graph,
    after asserting that braze's reference interpreter and its compiled CPU executable both
    give ONNX Runtime's outputs (shapes, dtypes and values) on `feeds`."""
    import braze as bz

    def check(model, feeds, *, input_shapes=None, rtol: float = 1e-5, atol: float = 1e-5):
        g = bz.import_onnx(model, input_shapes=input_shapes)
        want = ort_run(model, feeds)
        for how, got in (("interpret", bz.interpret(g, feeds)),
                         ("compile", bz.compile(g, "cpu")(feeds))):
            assert len(got) == len(want), how
            for i, (a, b) in enumerate(zip(got, want)):
                a = np.asarray(a)
                assert (a.shape, a.dtype) == (b.shape, b.dtype), (how, i, a.dtype, b.dtype)
                np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"{how} {i}")
        return g

    return check
