"""Symbolic shape folding at import: shape computations over dim_param inputs (batch, seq) fold
into reshape / expand / narrow / range dims written with those symbols, leave no Shape-derived
arithmetic in the graph, and the graph runs at several sizes matching ONNX Runtime."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import braze as bz  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64
SIZES = [(2, 5), (3, 9)]  # (batch, seq) pairs every symbolic graph runs at


def ints(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def kinds(g) -> dict[str, int]:
    return g.op_counts()


def node_of(g, kind):
    (n,) = [n for n in g.nodes if n.op.kind == kind]
    return n


def check_sizes(g, model, ort_run, feeds_for):
    for batch, seq in SIZES:
        feeds = feeds_for(batch, seq)
        got = bz.interpret(g, feeds)
        want = ort_run(model, feeds)
        for a, b in zip(got, want, strict=True):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_shape_gather_unsqueeze_concat_reshape_keeps_symbols(make_model, ort_run):
    """x[batch, seq, 8] -> Reshape(x, concat(shape[0], shape[1], 2, 4)) is one reshape to
    (batch, seq, 2, 4): the shape arithmetic folds away."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "i0"], ["b"], name="gather_b", axis=0),
        helper.make_node("Gather", ["s", "i1"], ["q"], name="gather_s", axis=0),
        helper.make_node("Unsqueeze", ["b", "ax"], ["b1"], name="unsq_b"),
        helper.make_node("Unsqueeze", ["q", "ax"], ["q1"], name="unsq_s"),
        helper.make_node("Concat", ["b1", "q1", "heads"], ["tgt"], name="cat", axis=0),
        helper.make_node("Reshape", ["x", "tgt"], ["y"], name="split_heads"),
    ]
    inits = [ints("i0", 0), ints("i1", 1), ints("ax", [0]), ints("heads", [2, 4])]
    m = make_model(nodes, [("x", F, ["batch", "seq", 8])], [("y", F, None)], inits)
    g = bz.import_onnx(m)
    assert kinds(g) == {"reshape": 1}
    assert node_of(g, "reshape").outputs[0].dims == ("batch", "seq", 2, 4)
    assert g.shape_of(g.outputs[0]).dims == ("batch", "seq", 2, 4)
    rng = np.random.default_rng(0)
    check_sizes(g, m, ort_run, lambda b, s: {
        "x": rng.standard_normal((b, s, 8)).astype(np.float32)})


def test_flatten_gives_a_product_of_symbols(make_model, ort_run):
    m = make_model([helper.make_node("Flatten", ["x"], ["y"], name="flat", axis=2)],
                   [("x", F, ["batch", "seq", 8])], [("y", F, None)])
    g = bz.import_onnx(m)
    assert g.shape_of(g.outputs[0]).dims == ("batch*seq", 8)
    rng = np.random.default_rng(1)
    check_sizes(g, m, ort_run, lambda b, s: {
        "x": rng.standard_normal((b, s, 8)).astype(np.float32)})


def test_reshape_minus_one_merges_symbols(make_model, ort_run):
    """Reshape(x, [-1, 8]) of [batch, seq, 8] is (batch*seq, 8); Reshape back with the
    folded Shape restores (batch, seq, 8)."""
    nodes = [
        helper.make_node("Reshape", ["x", "flat"], ["f"], name="merge"),
        helper.make_node("Relu", ["f"], ["r"], name="relu"),
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Reshape", ["r", "s"], ["y"], name="unmerge"),
    ]
    m = make_model(nodes, [("x", F, ["batch", "seq", 8])], [("y", F, None)],
                   [ints("flat", [-1, 8])])
    g = bz.import_onnx(m)
    dims = [n.outputs[0].dims for n in g.nodes if n.op.kind == "reshape"]
    assert dims == [("batch*seq", 8), ("batch", "seq", 8)]
    rng = np.random.default_rng(2)
    check_sizes(g, m, ort_run, lambda b, s: {
        "x": rng.standard_normal((b, s, 8)).astype(np.float32)})


def test_masks_and_position_ids_from_symbolic_seq(make_model, ort_run):
    """The patterns HF exports build masks and positions with: ConstantOfShape(shape) of ones,
    Range(0, seq) position ids expanded to [batch, seq], a causal mask from Range + Less, all
    with a symbolic seq; the graph runs at two sizes."""
    one = numpy_helper.from_array(np.array([1], np.int64), "one_value")
    nodes = [
        helper.make_node("Shape", ["ids"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "i1"], ["seq"], name="seq_len", axis=0),
        helper.make_node("ConstantOfShape", ["s"], ["ones"], name="ones", value=one),
        helper.make_node("Range", ["zero", "seq", "step"], ["pos"], name="positions"),
        helper.make_node("Unsqueeze", ["pos", "ax0"], ["pos2"], name="pos_unsq"),
        helper.make_node("Expand", ["pos2", "s"], ["pos_ids"], name="pos_expand"),
        helper.make_node("Mul", ["pos_ids", "ones"], ["masked_pos"], name="mask_pos"),
        helper.make_node("Unsqueeze", ["pos", "ax1"], ["col"], name="col"),
        helper.make_node("Less", ["pos2", "col"], ["future"], name="causal"),
        helper.make_node("Cast", ["future"], ["future_f"], name="to_float", to=F),
        helper.make_node("Mul", ["future_f", "neg"], ["causal_bias"], name="bias"),
    ]
    inits = [ints("i1", 1), ints("zero", 0), ints("step", 1), ints("ax0", [0]),
             ints("ax1", [1]), numpy_helper.from_array(np.array(-1e4, np.float32), "neg")]
    m = make_model(nodes, [("ids", I64, ["batch", "seq"])],
                   [("masked_pos", I64, None), ("causal_bias", F, None)], inits)
    g = bz.import_onnx(m)
    assert kinds(g) == {"expand": 2, "range": 1, "reshape": 2, "mul": 2,
                        "lt": 1, "cast": 1}  # sources (2 constants) not counted
    assert node_of(g, "range").op.length == "seq"
    assert g.shape_of(g.outputs[0]).dims == ("batch", "seq")
    assert g.shape_of(g.outputs[1]).dims == ("seq", "seq")
    rng = np.random.default_rng(3)
    check_sizes(g, m, ort_run, lambda b, s: {"ids": rng.integers(0, 9, (b, s))})


def test_slice_with_symbolic_ends(make_model, ort_run):
    """x[:, :seq-1] with the end computed from Shape, and x[:, 1:INT_MAX]: narrows of symbolic
    length, no data-dependent slicing."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "i1"], ["seq"], name="seq_len", axis=0),
        helper.make_node("Sub", ["seq", "one"], ["end"], name="end"),
        helper.make_node("Unsqueeze", ["end", "ax0"], ["end1"], name="end_1d"),
        helper.make_node("Slice", ["x", "zero1", "end1", "ax1"], ["head"], name="drop_last"),
        helper.make_node("Slice", ["x", "one1", "big", "ax1"], ["tail"], name="drop_first"),
        helper.make_node("Add", ["head", "tail"], ["y"], name="add"),
    ]
    inits = [ints("i1", 1), ints("one", 1), ints("ax0", [0]), ints("zero1", [0]),
             ints("ax1", [1]), ints("one1", [1]), ints("big", [np.iinfo(np.int64).max])]
    m = make_model(nodes, [("x", F, ["batch", "seq", 4])], [("y", F, None)], inits)
    g = bz.import_onnx(m)
    narrows = [n for n in g.nodes if n.op.kind == "narrow"]
    assert len(narrows) == 2
    assert all(n.outputs[0].dims == ("batch", "seq-1", 4) for n in narrows)
    assert set(kinds(g)) == {"narrow", "add"}
    rng = np.random.default_rng(4)
    check_sizes(g, m, ort_run, lambda b, s: {
        "x": rng.standard_normal((b, s, 4)).astype(np.float32)})


def test_unknown_dims_get_fresh_symbols_and_overrides_apply(make_model):
    m = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                   [("x", F, [None, "?", 3])], [("y", F, None)])
    g = bz.import_onnx(m)
    assert g.inputs[0].op.shape.dims == ("x_dim0", "x_dim1", 3)
    g = bz.import_onnx(m, input_shapes={"x": (2, "seq", 3)})
    assert g.inputs[0].op.shape.dims == (2, "seq", 3)


def test_size_folds_to_a_symbolic_product(make_model, ort_run):
    """Size(x) feeding arithmetic stays exact: y = x * Size(x) as a float."""
    nodes = [
        helper.make_node("Size", ["x"], ["n"], name="size"),
        helper.make_node("Cast", ["n"], ["nf"], name="cast", to=F),
        helper.make_node("Mul", ["x", "nf"], ["y"], name="scale"),
    ]
    m = make_model(nodes, [("x", F, ["batch", "seq"])], [("y", F, None)])
    g = bz.import_onnx(m)
    assert "sym_const" in kinds(g)
    rng = np.random.default_rng(5)
    check_sizes(g, m, ort_run, lambda b, s: {
        "x": rng.standard_normal((b, s)).astype(np.float32)})


def test_slice_from_a_negative_symbolic_start(make_model, ort_run):
    """x[:, -seq:] (XLM's cache trim, the whole axis) and x[:, -seq:-1] (all but the last): a
    start below 0 for every binding counts from the end, as ONNX says, and becomes static."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "i1"], ["seq"], name="seq_len", axis=0),
        helper.make_node("Neg", ["seq"], ["minus_seq"], name="neg"),
        helper.make_node("Unsqueeze", ["minus_seq", "ax0"], ["start"], name="start_1d"),
        helper.make_node("Slice", ["x", "start", "big", "ax1"], ["all"], name="trim"),
        helper.make_node("Slice", ["x", "start", "minus1", "ax1"], ["tail"], name="drop_last"),
        helper.make_node("ReduceSum", ["all", "ax1"], ["total"], name="sum", keepdims=1),
        helper.make_node("Add", ["tail", "total"], ["y"], name="add"),
    ]
    inits = [ints("i1", 1), ints("minus1", [-1]), ints("ax0", [0]), ints("ax1", [1]),
             ints("big", [np.iinfo(np.int64).max])]
    m = make_model(nodes, [("x", F, ["batch", "seq", 4])], [("y", F, None)], inits)
    g = bz.import_onnx(m)
    (narrow,) = [n for n in g.nodes if n.op.kind == "narrow"]  # the trim is the identity
    assert narrow.op.start == 0 and narrow.outputs[0].dims == ("batch", "seq-1", 4)
    rng = np.random.default_rng(6)
    check_sizes(g, m, ort_run, lambda b, s: {
        "x": rng.standard_normal((b, s, 4)).astype(np.float32)})


def test_tile_by_a_symbolic_count(make_model, ort_run):
    """DeBERTa tiles its position projections [H, P, D] by (batch, 1, 1): repeats computed from
    a Shape become an expand over a new axis and a merge to (batch*H, P, D)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "i0"], ["b"], name="batch", axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"], name="batch_1d"),
        helper.make_node("Concat", ["b1", "ones"], ["reps"], name="reps", axis=0),
        helper.make_node("Tile", ["p", "reps"], ["tiled"], name="tile"),
        helper.make_node("ReduceSum", ["tiled", "ax1"], ["y"], name="sum", keepdims=0),
    ]
    inits = [ints("i0", 0), ints("ax0", [0]), ints("ones", [1, 1]), ints("ax1", [1]),
             numpy_helper.from_array(np.arange(24, dtype=np.float32).reshape(2, 3, 4), "p")]
    m = make_model(nodes, [("x", F, ["batch", "seq"])], [("y", F, None)], inits)
    g = bz.import_onnx(m)
    assert g.shape_of(g.outputs[0]).dims == ("2*batch", 4)
    check_sizes(g, m, ort_run, lambda b, s: {"x": np.zeros((b, s), np.float32)})


def test_range_from_a_symbolic_start(make_model, ort_run):
    """Funnel's relative positions Range(-seq, seq, 1): an arange of length 2*seq from 0,
    shifted by -seq at run time."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "i1"], ["seq"], name="seq_len", axis=0),
        helper.make_node("Neg", ["seq"], ["minus_seq"], name="neg"),
        helper.make_node("Range", ["minus_seq", "seq", "one"], ["pos"], name="positions"),
        helper.make_node("Cast", ["pos"], ["y"], name="to_float", to=F),
    ]
    inits = [ints("i1", 1), ints("one", 1)]
    m = make_model(nodes, [("x", F, ["batch", "seq"])], [("y", F, None)], inits)
    g = bz.import_onnx(m)
    assert g.shape_of(g.outputs[0]).dims == ("2*seq",)
    check_sizes(g, m, ort_run, lambda b, s: {"x": np.zeros((b, s), np.float32)})



def _float_range_model(make_model, start, delta, limit_scale=1):
    """Range(start, float(limit_scale * seq), delta) in f32: what both torch.onnx exporters write
    for `torch.arange(seq, dtype=torch.float32)` (sinusoidal position embeddings)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "i1"], ["seq"], name="seq_len", axis=0),
        helper.make_node("Mul", ["seq", "k"], ["limit_i"], name="scale_limit"),
        helper.make_node("Cast", ["limit_i"], ["limit"], name="limit_f", to=F),
        helper.make_node("Range", ["start", "limit", "delta"], ["pos"], name="positions"),
    ]
    inits = [ints("i1", 1), ints("k", limit_scale),
             numpy_helper.from_array(np.array(start, np.float32), "start"),
             numpy_helper.from_array(np.array(delta, np.float32), "delta")]
    return make_model(nodes, [("x", F, ["batch", "seq"])], [("pos", F, None)], inits)


@pytest.mark.parametrize("start, delta, limit_scale, length", [
    (0.0, 1.0, 1, "seq"),          # torch.arange(seq, dtype=float32)
    (2.0, 1.0, 1, "seq - 2"),
    (0.5, 1.0, 1, "seq"),          # a fractional start rounds the count up: ceil(seq - 0.5)
    (1.0, 2.0, 2, "seq"),          # ceil((2*seq - 1) / 2)
    (0.0, 3.0, 3, "seq"),
    (12.5, -1.0, 1, "13 - seq"),   # counting down: ceil(12.5 - seq)
])
def test_float_range_with_a_symbolic_limit(make_model, matches_ort, start, delta, limit_scale,
                                           length):
    m = _float_range_model(make_model, start, delta, limit_scale)
    for batch, seq in SIZES:
        x = np.zeros((batch, seq), np.float32)
        g = matches_ort(m, {"x": x})
    assert node_of(g, "range").op.length == bz.Shape((length,)).dims[0]


def test_float_range_from_a_symbolic_start_counts_down(make_model, matches_ort):
    """Range(float(seq), 0.0, -1.0): seq values from seq down to 1."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "i1"], ["seq"], name="seq_len", axis=0),
        helper.make_node("Cast", ["seq"], ["start"], name="start_f", to=F),
        helper.make_node("Range", ["start", "zero", "minus_one"], ["pos"], name="positions"),
    ]
    inits = [ints("i1", 1), numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(-1.0, np.float32), "minus_one")]
    m = make_model(nodes, [("x", F, ["batch", "seq"])], [("pos", F, None)], inits)
    for batch, seq in SIZES:
        g = matches_ort(m, {"x": np.zeros((batch, seq), np.float32)})
    assert g.shape_of(g.outputs[0]).dims == ("seq",)


@pytest.mark.parametrize("start, delta, limit_scale", [(0.0, 0.5, 1), (0.0, 2.0, 1)])
def test_float_range_whose_count_is_not_a_dim_is_refused(make_model, start, delta,
                                                          limit_scale):
    """ceil(seq / 0.5) needs a fractional step, ceil(seq / 2) rounds: neither is a dim."""
    m = _float_range_model(make_model, start, delta, limit_scale)
    with pytest.raises(bz.FrontendError, match=r"node positions \(Range\).*whole-number delta"
                       r".*arange\(n\) \* step.*input_shapes="):
        bz.import_onnx(m)


@pytest.mark.parametrize("dynamo", [False, True])
def test_float_arange_of_a_dynamic_dim_from_both_exporters(dynamo, ort_run, tmp_path):
    """torch.arange(seq, dtype=torch.float32) exported by the TorchScript and dynamo
    exporters imports and matches PyTorch and ONNX Runtime at two sequence lengths."""
    torch = pytest.importorskip("torch")

    class Positions(torch.nn.Module):
        def forward(self, x):
            pos = torch.arange(x.shape[1], dtype=torch.float32)
            return x + torch.sin(pos)[None, :, None]

    m, x = Positions().eval(), torch.randn(2, 6, 4)
    path = str(tmp_path / f"positions_{dynamo}.onnx")
    if dynamo:
        dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
        torch.onnx.export(m, (x,), path, input_names=["x"], dynamo=True,
                          dynamic_shapes={"x": dims}, verbose=False)
    else:
        torch.onnx.export(m, (x,), path, input_names=["x"], dynamo=False, opset_version=17,
                          dynamic_axes={"x": {0: "batch", 1: "seq"}})
    g = bz.import_onnx(path)
    exe = bz.compile(g, "cpu")
    model = open(path, "rb").read()
    for batch, seq in SIZES:
        xs = np.random.default_rng(seq).normal(size=(batch, seq, 4)).astype(np.float32)
        want = m(torch.from_numpy(xs)).numpy()
        np.testing.assert_allclose(ort_run(model, {"x": xs})[0], want, rtol=1e-6, atol=1e-6)
        for got in (bz.interpret(g, {"x": xs})[0], exe({"x": xs})[0]):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_inputs_whose_equal_dims_have_different_names_get_a_hint(make_model, ort_run):
    """The dynamo exporter names input_ids' dims (s72, s70) and attention_mask's (s43, s53)
    apart: reshaping the mask to ids' batch fails, the error says how to name them alike, and
    naming them alike imports and runs."""
    nodes = [
        helper.make_node("Shape", ["ids"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "i0"], ["b"], name="gather_b", axis=0),
        helper.make_node("Unsqueeze", ["b", "ax"], ["b1"], name="unsq_b"),
        helper.make_node("Concat", ["b1", "rest"], ["tgt"], name="cat", axis=0),
        helper.make_node("Reshape", ["mask", "tgt"], ["m2"], name="mask_view"),
        helper.make_node("Add", ["ids", "m2"], ["y"], name="add"),
    ]
    inits = [ints("i0", 0), ints("ax", [0]), ints("rest", [-1])]
    m = make_model(nodes, [("ids", F, ["s72", "s70"]), ("mask", F, ["s43", "s53"])],
                   [("y", F, None)], inits)
    with pytest.raises(bz.FrontendError, match=r"mask_view.*give them one name: "
                                               r"import_onnx\(\.\.\., input_shapes="):
        bz.import_onnx(m)
    g = bz.import_onnx(m, input_shapes={"ids": ("batch", "seq"), "mask": ("batch", "seq")})
    check_sizes(g, m, ort_run, lambda b, s: {
        "ids": np.ones((b, s), np.float32), "mask": np.full((b, s), 2.0, np.float32)})


def test_a_cache_mask_named_apart_from_past_plus_seq_gets_the_hint(make_model, matches_ort):
    """A decode step exported with the mask's length named on its own ("total") adds the mask
    to keys of length past+seq (Bloom's ALiBi): the broadcast error names the two symbolic dims
    and says how to declare the mask (it had no hint: only reshape errors got one), and
    declaring it 'past+seq' imports and runs."""
    nodes = [
        helper.make_node("Concat", ["past", "new"], ["keys"], name="cache", axis=1),
        helper.make_node("Unsqueeze", ["mask", "ax"], ["m3"], name="unsq"),
        helper.make_node("Add", ["keys", "m3"], ["y"], name="alibi_add"),
    ]
    m = make_model(nodes, [("past", F, ["batch", "past", 4]), ("new", F, ["batch", "seq", 4]),
                           ("mask", F, ["batch", "total"])], [("y", F, None)], [ints("ax", [2])])
    with pytest.raises(bz.FrontendError, match=r"alibi_add.*past\+seq vs total: symbolic.*"
                                               r"input_shapes=.*'past\+seq'"):
        bz.import_onnx(m)
    rng = np.random.default_rng(0)
    matches_ort(m, {"past": rng.normal(size=(2, 3, 4)).astype(np.float32),
                    "new": rng.normal(size=(2, 2, 4)).astype(np.float32),
                    "mask": rng.normal(size=(2, 5)).astype(np.float32)},
                input_shapes={"mask": ("batch", "past+seq")})
