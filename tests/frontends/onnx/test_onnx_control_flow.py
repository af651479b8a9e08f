"""If, Loop and Scan (ops/control.py, subgraph import in subgraphs.py) against ONNX Runtime on
random inputs, through the reference interpreter and bz.compile: captures of outer values,
shadowing, nested If in Loop, folded and data conditions, counted / conditional / zero-trip
loops, reverse Scan with scan axes != 0, and the refusals that name the node."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import braze as bz  # noqa: E402
from braze.errors import FrontendError  # noqa: E402

F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def vi(name, elem=F, dims=(None, None)):
    """A tensor's value info; onnx.checker wants a shape (of unknown dims at least)."""
    v = helper.make_tensor_value_info(name, elem, list(dims))
    v.type.tensor_type.shape.SetInParent()  # a scalar's shape is present, with no dims
    return v


def model(nodes, inputs, outputs, inits=(), opset=17, checked=True):
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    if checked:  # onnx.checker refuses shadowing (SSA across scopes); ONNX Runtime runs it
        onnx.checker.check_model(m)
    return m


def const(name, arr):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr)))


def ort_run(m, feeds):
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def check(m, feeds, **kw):
    """The import's interpreter and compiled outputs equal ONNX Runtime's; the graph."""
    want = ort_run(m, feeds)
    g = bz.import_onnx(m, **kw)
    for got in (bz.interpret(g, feeds), bz.compile(g, target="cpu")(feeds)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert np.asarray(a).shape == b.shape
            np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-5)
    return g


def kinds(g):
    return [n.op.kind for n in g.nodes]


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# -- If -------------------------------------------------------------------------------------------
def branch(name, nodes, outs):
    return helper.make_graph(nodes, name, [], outs)


def data_if_model():
    """y = if sum(x) > 0: tanh(x) * w else: x - w (w captured from the outer scope)."""
    then_nodes = [helper.make_node("Tanh", ["x"], ["t0"]),
                  helper.make_node("Mul", ["t0", "w"], ["t_out"])]
    else_nodes = [helper.make_node("Sub", ["x", "w"], ["e_out"])]
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], name="branchy",
                              then_branch=branch("then", then_nodes, [vi("t_out")]),
                              else_branch=branch("else", else_nodes, [vi("e_out")]))]
    inits = [numpy_helper.from_array(np.float32(0), "zero"),
             numpy_helper.from_array(rand(3, 4, seed=5), "w")]
    return model(nodes, [vi("x", F, [3, 4])], [vi("y", F, [3, 4])], inits)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_if_on_data_is_a_cond_with_captured_operands(seed):
    m = data_if_model()
    g = check(m, {"x": rand(3, 4, seed=seed) + (seed % 2) * 2 - 1})
    (node,) = [n for n in g.nodes if n.op.kind == "if"]
    assert len(node.inputs) == 3  # pred, x, w: the branches' captures are operands


def test_a_subgraph_input_shadows_the_outer_name():
    """The Scan body's state is named "w", like the outer weight; the body reads its state,
    the outer graph (and a body capture of "k") the outer values."""
    body = helper.make_graph([helper.make_node("Add", ["w", "x_t"], ["w_sum"]),
                              helper.make_node("Mul", ["w_sum", "k"], ["w_new"]),
                              helper.make_node("Identity", ["w_new"], ["y_t"])], "body",
                             [vi("w", F, [3]), vi("x_t", F, [3])],
                             [vi("w_new", F, [3]), vi("y_t", F, [3])])
    nodes = [helper.make_node("Mul", ["x0", "w"], ["s0"]),
             helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1),
             helper.make_node("Add", ["s", "w"], ["out"])]
    inits = [numpy_helper.from_array(rand(3, seed=4) + 5.0, "w"),
             numpy_helper.from_array(np.float32(0.5), "k")]
    m = model(nodes, [vi("x0", F, [3]), vi("xs", F, [4, 3])],
              [vi("out", F, [3]), vi("ys", F, [4, 3])], inits, checked=False)
    check(m, {"x0": rand(3), "xs": rand(4, 3, seed=1)})


def test_if_on_a_static_shape_imports_only_the_taken_branch():
    """torch's `if x.shape[1] > 2` as the TorchScript exporter writes it."""
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             const("one", np.int64(1)), const("two", np.int64(2)),
             helper.make_node("Gather", ["sh", "one"], ["d1"]),
             helper.make_node("Greater", ["d1", "two"], ["c"]),
             helper.make_node("If", ["c"], ["y"], name="shape_if",
                              then_branch=branch("then", [helper.make_node(
                                  "Relu", ["x"], ["a"], name="wide_relu")], [vi("a")]),
                              else_branch=branch("else", [helper.make_node(
                                  "Neg", ["x"], ["b"])], [vi("b")]))]
    m = model(nodes, [vi("x", F, [2, 5])], [vi("y", F, [2, 5])])
    g = check(m, {"x": rand(2, 5)})
    assert "if" not in kinds(g) and "neg" not in kinds(g)
    (relu,) = [n for n in g.nodes if n.op.kind == "unary"]
    assert relu.provenance == "shape_if.then_branch (condition True at import)/wide_relu"


def test_if_on_an_undecidable_symbolic_dim_stays_a_cond():
    """x.shape[0] > 4 with a symbolic dim: no guess from an example size."""
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             const("zero", np.int64(0)), const("four", np.int64(4)),
             helper.make_node("Gather", ["sh", "zero"], ["d0"]),
             helper.make_node("Greater", ["d0", "four"], ["c"]),
             helper.make_node("If", ["c"], ["y"],
                              then_branch=branch("then", [helper.make_node(
                                  "Relu", ["x"], ["a"])], [vi("a")]),
                              else_branch=branch("else", [helper.make_node(
                                  "Neg", ["x"], ["b"])], [vi("b")]))]
    m = model(nodes, [vi("x", F, ["n", 3])], [vi("y", F, ["n", 3])])
    g = bz.import_onnx(m)
    assert "if" in kinds(g)
    for n in (2, 7):
        x = rand(n, 3, seed=n)
        np.testing.assert_allclose(bz.interpret(g, {"x": x})[0], ort_run(m, {"x": x})[0])


def test_if_on_a_symbolic_dim_decided_for_every_size_folds():
    """x.shape[0] >= 0 holds for every n: folded, the else branch never imported."""
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             const("zero", np.int64(0)),
             helper.make_node("Gather", ["sh", "zero"], ["d0"]),
             helper.make_node("GreaterOrEqual", ["d0", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"],
                              then_branch=branch("then", [helper.make_node(
                                  "Relu", ["x"], ["a"])], [vi("a")]),
                              else_branch=branch("else", [helper.make_node(
                                  "Neg", ["x"], ["b"])], [vi("b")]))]
    m = model(nodes, [vi("x", F, ["n", 3])], [vi("y", F, ["n", 3])])
    g = bz.import_onnx(m)
    assert "if" not in kinds(g) and "neg" not in {n.op.fn.value for n in g.nodes
                                                   if n.op.kind == "unary"}
    for n in (2, 5):
        x = rand(n, 3, seed=n)
        np.testing.assert_allclose(bz.interpret(g, {"x": x})[0], ort_run(m, {"x": x})[0])


def test_branches_of_different_shapes_are_refused_naming_the_node():
    then = branch("then", [helper.make_node("ReduceSum", ["x"], ["a"], keepdims=1)], [vi("a")])
    other = branch("else", [helper.make_node("Neg", ["x"], ["b"])], [vi("b")])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], name="ragged", then_branch=then,
                              else_branch=other)]
    m = model(nodes, [vi("x", F, [3, 4])], [vi("y")],
              [numpy_helper.from_array(np.float32(0), "zero")])
    with pytest.raises(FrontendError, match=r"ragged \(If\).*output 0"):
        bz.import_onnx(m)


# -- Loop -----------------------------------------------------------------------------------------
def loop_body(nodes, carried, scans, cond_out="cond_out", scan_rank=2):
    ins = [vi("iter", I64, []), vi("cond_in", BOOL, []), *carried]
    outs = [vi(cond_out, BOOL, []),
            *[vi(f"{c.name}_new", F, [None] * len(c.type.tensor_type.shape.dim))
              for c in carried], *[vi(s, F, [None] * scan_rank) for s in scans]]
    return helper.make_graph(nodes, "body", ins, outs)


def counted_loop_model(trip, with_if=False):
    """acc = acc * 0.5 + x * iter (x captured), scan output acc per step; with_if: a nested
    If inside the body picks tanh / neg of acc by its sum's sign."""
    nodes = [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
             helper.make_node("Cast", ["iter"], ["itf"], to=F),
             helper.make_node("Mul", ["x", "itf"], ["xi"]),
             helper.make_node("Mul", ["acc", "half"], ["ah"]),
             helper.make_node("Add", ["ah", "xi"], ["pre"])]
    if with_if:
        nodes += [helper.make_node("ReduceSum", ["pre"], ["ps"], keepdims=0),
                  helper.make_node("Greater", ["ps", "zero"], ["pc"]),
                  helper.make_node("If", ["pc"], ["acc_new"], name="inner_if",
                                   then_branch=branch("t", [helper.make_node(
                                       "Tanh", ["pre"], ["tt"])], [vi("tt")]),
                                   else_branch=branch("e", [helper.make_node(
                                       "Mul", ["pre", "x"], ["ee"])], [vi("ee")]))]
    else:
        nodes.append(helper.make_node("Identity", ["pre"], ["acc_new"]))
    nodes.append(helper.make_node("Identity", ["acc_new"], ["row"]))
    body = loop_body(nodes, [vi("acc", F, [2, 3])], ["row"])
    outer = [const("M", np.int64(trip)),
             helper.make_node("Loop", ["M", "", "acc0"], ["acc_final", "rows"], name="loop",
                              body=body)]
    inits = [numpy_helper.from_array(np.float32(0.5), "half"),
             numpy_helper.from_array(np.float32(0.0), "zero")]
    return model(outer, [vi("x", F, [2, 3]), vi("acc0", F, [2, 3])],
                 [vi("acc_final", F, [2, 3]), vi("rows", F, [None] * 3)], inits)


@pytest.mark.parametrize("trip", [1, 4])
@pytest.mark.parametrize("with_if", [False, True])
def test_counted_loop_is_a_scan_stacking_its_scan_outputs(trip, with_if):
    m = counted_loop_model(trip, with_if)
    for seed in range(2):
        g = check(m, {"x": rand(2, 3, seed=seed), "acc0": rand(2, 3, seed=seed + 7)})
    assert "scan" in kinds(g) and "while" not in kinds(g)


def test_zero_trip_loop_returns_its_initial_values_and_empty_scans():
    m = counted_loop_model(0)
    g = check(m, {"x": rand(2, 3), "acc0": rand(2, 3, seed=1)})
    assert "scan" not in kinds(g)


def test_loop_whose_condition_is_false_at_the_start_runs_no_iteration():
    m = counted_loop_model(4)
    loop_node = m.graph.node[1]
    m.graph.node.insert(1, const("never", np.bool_(False)))
    loop_node.input[1] = "never"
    g = check(m, {"x": rand(2, 3), "acc0": rand(2, 3, seed=1)})
    assert "scan" not in kinds(g) and "while" not in kinds(g)


def test_loop_with_a_data_condition_is_a_bounded_while():
    """while sum(acc) < 10 and iter < M: acc = acc * 1.5 + 1; M = 20."""
    nodes = [helper.make_node("Mul", ["acc", "k"], ["a1"]),
             helper.make_node("Add", ["a1", "one"], ["acc_new"]),
             helper.make_node("ReduceSum", ["acc_new"], ["s"], keepdims=0),
             helper.make_node("Less", ["s", "ten"], ["cond_out"])]
    body = loop_body(nodes, [vi("acc", F, [4])], [])
    outer = [const("M", np.int64(20)),
             helper.make_node("ReduceSum", ["acc0"], ["s0"], keepdims=0),
             helper.make_node("Less", ["s0", "ten"], ["c0"]),
             helper.make_node("Loop", ["M", "c0", "acc0"], ["acc_final"], body=body)]
    inits = [numpy_helper.from_array(np.float32(v), n)
             for n, v in (("k", 1.5), ("one", 1.0), ("ten", 10.0))]
    m = model(outer, [vi("acc0", F, [4])], [vi("acc_final", F, [4])], inits)
    for start in (-3.0, 0.0, 20.0):  # 20: the condition is false at the first check
        g = check(m, {"acc0": np.full(4, start, np.float32) + rand(4)})
    (w,) = [n for n in g.nodes if n.op.kind == "while"]
    assert w.op.max_iterations == 20


def test_loop_with_scan_outputs_and_a_data_condition_is_refused():
    nodes = [helper.make_node("Add", ["acc", "one"], ["acc_new"]),
             helper.make_node("ReduceSum", ["acc_new"], ["s"], keepdims=0),
             helper.make_node("Less", ["s", "ten"], ["cond_out"]),
             helper.make_node("Identity", ["acc_new"], ["row"])]
    body = loop_body(nodes, [vi("acc", F, [4])], ["row"], scan_rank=1)
    outer = [const("M", np.int64(20)), const("c0", np.bool_(True)),
             helper.make_node("Loop", ["M", "c0", "acc0"], ["acc_final", "rows"],
                              name="ragged_loop", body=body)]
    inits = [numpy_helper.from_array(np.float32(v), n) for n, v in (("one", 1.0), ("ten", 10.0))]
    m = model(outer, [vi("acc0", F, [4])], [vi("acc_final", F, [4]), vi("rows", F, [None] * 2)],
              inits)
    with pytest.raises(FrontendError, match=r"ragged_loop \(Loop\).*data.*input_shapes="):
        bz.import_onnx(m)


def test_loop_over_a_symbolic_trip_count_runs_every_length():
    """for i in range(x.shape[0]): acc += x[i]; rows stacked (TorchScript's scripted loop)."""
    m = symbolic_loop_model()
    g = bz.import_onnx(m)
    assert "while" in kinds(g)
    exe = bz.compile(g, target="cpu")
    for n in (2, 5):
        feeds = {"x": rand(n, 3, seed=n), "acc0": rand(3, seed=9)}
        want = ort_run(m, feeds)
        for got in (bz.interpret(g, feeds), exe(feeds)):
            for a, b in zip(got, want):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


# -- Scan -----------------------------------------------------------------------------------------
def scan_model(in_axes, in_dirs, out_axes, out_dirs, x_dims=(5, 2, 3), states=True):
    """state += x_t * w (w captured); outputs state, x_t - state per step."""
    nodes = [helper.make_node("Mul", ["x_t", "w"], ["xw"]),
             helper.make_node("Add", ["s", "xw"], ["s_new"]),
             helper.make_node("Sub", ["x_t", "s_new"], ["y_t"])]
    step_dims = list(x_dims)
    del step_dims[in_axes[0] % 3]
    ins = ([vi("s", F, step_dims)] if states else []) + [vi("x_t", F, step_dims)]
    outs = ([vi("s_new", F, step_dims)] if states else []) + [vi("y_t", F, step_dims)]
    if not states:
        nodes[1] = helper.make_node("Add", ["xw", "xw"], ["s_new"])
    body = helper.make_graph(nodes, "scan_body", ins, outs)
    scan_ins = (["s0"] if states else []) + ["x"]
    scan_outs = (["s_final"] if states else []) + ["ys"]
    outer = [helper.make_node("Scan", scan_ins, scan_outs, name="scan", body=body,
                              num_scan_inputs=1, scan_input_axes=in_axes,
                              scan_input_directions=in_dirs, scan_output_axes=out_axes,
                              scan_output_directions=out_dirs)]
    inputs = [vi("x", F, list(x_dims))] + ([vi("s0", F, step_dims)] if states else [])
    outputs = ([vi("s_final", F, [None] * 2)] if states else []) + [vi("ys", F, [None] * 3)]
    inits = [numpy_helper.from_array(rand(*step_dims, seed=3), "w")]
    return model(outer, inputs, outputs, inits), step_dims


@pytest.mark.parametrize("in_axes,in_dirs,out_axes,out_dirs", [
    ([0], [0], [0], [0]), ([0], [1], [0], [0]), ([1], [0], [2], [1]), ([-1], [1], [1], [1])])
def test_scan_axes_and_directions(in_axes, in_dirs, out_axes, out_dirs):
    m, step = scan_model(in_axes, in_dirs, out_axes, out_dirs)
    g = check(m, {"x": rand(5, 2, 3), "s0": rand(*step, seed=1)})
    assert "scan" in kinds(g)


def test_scan_without_state_variables():
    m, _ = scan_model([0], [1], [0], [0], states=False)
    check(m, {"x": rand(5, 2, 3)})


def test_scan_over_a_symbolic_length_is_a_while():
    m, step = scan_model([0], [1], [0], [1], x_dims=("n", 2, 3))
    g = bz.import_onnx(m)
    assert "while" in kinds(g)
    for n in (2, 4):
        feeds = {"x": rand(n, 2, 3, seed=n), "s0": rand(*step, seed=1)}
        for a, b in zip(bz.interpret(g, feeds), ort_run(m, feeds)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


# -- subgraphs in general -------------------------------------------------------------------------
def test_unsupported_ops_inside_a_subgraph_are_listed():
    then = branch("then", [helper.make_node("Det", ["x"], ["a"], name="det_inside")], [vi("a")])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=then)]
    m = model(nodes, [vi("x", F, [3, 3])], [vi("y")],
              [numpy_helper.from_array(np.float32(0), "zero")])
    with pytest.raises(bz.UnsupportedOpsError, match="det_inside"):
        bz.import_onnx(m)


def test_fused_graph_with_control_flow_interprets_equal():
    m = counted_loop_model(3, with_if=True)
    g = bz.import_onnx(m)
    fused, _ = bz.fuse(g, target="cpu")
    feeds = {"x": rand(2, 3), "acc0": rand(2, 3, seed=2)}
    for a, b in zip(bz.interpret(fused, feeds), bz.interpret(g, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


# -- export back to ONNX --------------------------------------------------------------------------
def symbolic_loop_model():
    nodes = [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
             helper.make_node("Gather", ["x", "iter"], ["xi"], axis=0),
             helper.make_node("Add", ["acc", "xi"], ["acc_new"]),
             helper.make_node("Mul", ["acc_new", "acc_new"], ["row"])]
    body = loop_body(nodes, [vi("acc", F, [3])], ["row"], scan_rank=1)
    outer = [helper.make_node("Shape", ["x"], ["sh"]), const("z", np.int64(0)),
             helper.make_node("Gather", ["sh", "z"], ["n"]), const("t", np.bool_(True)),
             helper.make_node("Loop", ["n", "t", "acc0"], ["acc_final", "rows"], body=body)]
    return model(outer, [vi("x", F, ["n", 3]), vi("acc0", F, [3])],
                 [vi("acc_final", F, [3]), vi("rows", F, ["n", 3])])


EXPORT_CASES = {
    "if": (data_if_model, {"x": rand(3, 4)}),
    "loop_scan_if": (lambda: counted_loop_model(3, with_if=True),
                     {"x": rand(2, 3), "acc0": rand(2, 3, seed=1)}),
    "scan_reverse_axes": (lambda: scan_model([1], [1], [2], [1])[0],
                          {"x": rand(5, 2, 3), "s0": rand(5, 3, seed=1)}),
    "symbolic_loop": (symbolic_loop_model, {"x": rand(4, 3), "acc0": rand(3, seed=2)}),
}


@pytest.mark.parametrize("case", sorted(EXPORT_CASES))
def test_imported_control_flow_exports_back_and_runs_in_ort(case, tmp_path):
    """Bounded control flow is written as its decomposition, a while without a bound (the
    loop over a symbolic length) as an ONNX Loop; ORT runs the export like braze runs the
    graph, fused or not."""
    make, feeds = EXPORT_CASES[case]
    g = bz.import_onnx(make())
    want = bz.interpret(g, feeds)
    for graph in (g, bz.fuse(g, target="cpu")[0]):
        path = bz.export_onnx(graph, tmp_path / f"{case}.onnx", target="standard")
        got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    if case == "symbolic_loop":
        ops = [n.op_type for n in onnx.load(str(path)).graph.node]
        assert "Loop" in ops
        longer = {"x": rand(6, 3, seed=4), "acc0": feeds["acc0"]}
        got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, longer)
        for a, b in zip(got, bz.interpret(g, longer)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
