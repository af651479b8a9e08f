"""If / While: builders (g.cond, g.while_loop), shape inference and its errors, the interpreter's
semantics (only the taken branch runs; a loop stops when cond fails and fails past
max_iterations), equality / hashing, text IR and save/load round trips, and the rest of braze
(fuse, compile, export) on graphs holding control flow."""
import numpy as np
import pytest

import braze as bz
from braze.errors import GraphError, InterpretError, ShapeError
from braze.ir.ops.control import If, While
from braze.op_examples import body_graph as body


def S(*dims, dt=bz.f32):
    return bz.Shape(dims, dt)




def cond_model(n=5):
    then_g = body("then", [S(n), S(n)], lambda b, x, y: b.add(b.tanh(x), y))
    else_g = body("else", [S(n), S(n)], lambda b, x, y: b.mul(x, y))
    g = bz.Graph("cond_model")
    x, y = g.input("x", S(n)), g.input("y", S(n))
    g.set_outputs([g.cond(g.gt(g.sum(x), 0.0), then_g, else_g, x, y)])
    return g


def halving_loop(max_iterations=50, limit=1.0):
    """Halve v until its max |v| < limit, counting the steps."""
    carried = [S(dt=bz.i32), S(4)]
    cond = body("keep_going", carried, lambda b, i, v: b.ge(b.reduce(b.abs(v), "max"), limit))
    step = body("halve", carried, lambda b, i, v: (b.add(i, 1), b.mul(v, 0.5)))
    g = bz.Graph("halving")
    x = g.input("x", S(4))
    i, v = g.while_loop(cond, step, g.constant(np.array(0, np.int32)), x,
                        max_iterations=max_iterations)
    g.set_outputs([i, v])
    return g


def numpy_halving(x, limit=1.0):
    i = 0
    while np.abs(x).max() >= limit:
        x, i = x * np.float32(0.5), i + 1
    return i, x


# -- builders and inference --------------------------------------------------------------------
def test_cond_returns_one_value_and_tuples_for_several_outputs():
    g = cond_model()
    assert isinstance(g.outputs[0], bz.Value) and g.count("if") == 1
    two = body("two", [S(3)], lambda b, x: (b.neg(x), b.exp(x)))
    h = bz.Graph("h")
    x = h.input("x", S(3))
    out = h.cond(h.constant(np.array(True)), two, two, x)
    assert isinstance(out, tuple) and [h.shape_of(v) for v in out] == [S(3), S(3)]


def test_while_loop_returns_the_carried_values():
    g = halving_loop()
    assert [g.shape_of(v) for v in g.outputs] == [S(dt=bz.i32), S(4)]
    assert g.node(g.outputs[0]).op == While(g.node(g.outputs[0]).op.cond_graph,
                                            g.node(g.outputs[0]).op.body_graph, 50)


@pytest.mark.parametrize("make, message", [
    (lambda g, x, t, e: g.cond(g.reduce(x, "sum"), t, e, x), "predicate must be a bool scalar"),
    (lambda g, x, t, e: g.cond(g.gt(x, 0.0), t, e, x), "predicate must be a bool scalar"),
    (lambda g, x, t, e: g.cond(g.constant(np.array(True)), t, e, x, x), "takes 1 inputs"),
    (lambda g, x, t, e: g.cond(g.constant(np.array(True)), t, e, g.reshape(x, (3, 1))),
     "input 0 'in0' is f32[3], but position 0 of the operands is f32[3, 1]"),
    (lambda g, x, t, e: g.cond(g.constant(np.array(True)), t,
                               body("wide", [S(3)], lambda b, v: b.cast(v, bz.f64)), x),
     "branches must return the same types"),
])
def test_cond_inference_errors_name_the_node(make, message):
    g = bz.Graph("bad")
    x = g.input("x", S(3))
    t = body("t", [S(3)], lambda b, v: b.neg(v))
    with pytest.raises(ShapeError) as err:
        make(g, x, t, t)
    assert message in str(err.value) and "if node %" in str(err.value)
    assert "test_control_flow.py" in str(err.value)


@pytest.mark.parametrize("cond_fn, step_fn, message", [
    (lambda b, v: b.sum(v), lambda b, v: b.neg(v), "must return one bool scalar"),
    (lambda b, v: b.gt(v, 0.0), lambda b, v: b.neg(v), "must return one bool scalar"),
    (lambda b, v: b.gt(b.sum(v), 0.0), lambda b, v: b.cast(v, bz.f64),
     "must return the carried types f32[3], got f64[3]"),
    (lambda b, v: b.gt(b.sum(v), 0.0), lambda b, v: (v, v), "must return the carried types"),
])
def test_while_inference_errors_name_the_node(cond_fn, step_fn, message):
    g = bz.Graph("bad")
    x = g.input("x", S(3))
    with pytest.raises(ShapeError, match="while node %") as err:
        g.while_loop(body("c", [S(3)], cond_fn), body("b", [S(3)], step_fn), x,
                     max_iterations=3)
    assert message in str(err.value)


def test_bodies_must_be_graphs_with_outputs_and_bounds_non_negative():
    g = bz.Graph("bad")
    x = g.input("x", S(3))
    b = body("b", [S(3)], lambda gg, v: v)
    with pytest.raises(GraphError, match="then_graph must be a bz.Graph"):
        g.cond(g.constant(np.array(True)), "then", b, x)
    empty = bz.Graph("empty")
    empty.input("a0", S(3))
    with pytest.raises(GraphError, match="has no outputs"):
        g.while_loop(empty, b, x)
    with pytest.raises(GraphError, match="max_iterations must be a non-negative int"):
        g.while_loop(body("c", [S(3)], lambda gg, v: gg.gt(gg.sum(v), 0.0)), b, x,
                     max_iterations=-1)


# -- interpreter semantics ---------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_cond_runs_the_branch_the_predicate_picks(seed):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(2, 5)).astype(np.float32)
    got = bz.interpret(cond_model(), {"x": x, "y": y})[0]
    want = np.tanh(x) + y if x.sum() > 0 else x * y
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_cond_does_not_run_the_untaken_branch():
    boom = body("boom", [S(2)], lambda b, v: b.gather(v, b.constant(np.array([7], np.int64)),
                                                      0))
    fine = body("fine", [S(2)], lambda b, v: b.narrow(v, 0, 0, 1))
    g = bz.Graph("lazy")
    x, p = g.input("x", S(2)), g.input("p", S(dt=bz.bool_))
    g.set_outputs([g.cond(p, fine, boom, x)])
    xs = np.array([3.0, 4.0], np.float32)
    np.testing.assert_array_equal(bz.interpret(g, {"x": xs, "p": np.array(True)})[0], [3.0])
    with pytest.raises(InterpretError, match=r"if\).*else_graph 'boom'"):
        bz.interpret(g, {"x": xs, "p": np.array(False)})


@pytest.mark.parametrize("seed", range(4))
def test_while_stops_when_cond_fails(seed):
    x = (np.random.default_rng(seed).normal(size=4) * 10).astype(np.float32)
    i, v = bz.interpret(halving_loop(), {"x": x})
    want_i, want_v = numpy_halving(x)
    assert int(i) == want_i and 0 < want_i < 50
    np.testing.assert_array_equal(v, want_v)


def test_while_past_max_iterations_is_an_error_naming_the_node():
    g = halving_loop(max_iterations=3)
    x = np.array([100.0, 1, 2, 3], np.float32)  # needs 7 halvings
    with pytest.raises(InterpretError) as err:
        bz.interpret(g, {"x": x})
    msg = str(err.value)
    assert "(while)" in msg and "test_control_flow.py" in msg and "max_iterations=3" in msg
    i, _ = bz.interpret(g, {"x": np.array([7.0, 1, 2, 3], np.float32)})  # exactly 3
    assert int(i) == 3


def test_while_without_a_bound_interprets():
    g = halving_loop(max_iterations=None)
    x = np.array([1e6, 1, 2, 3], np.float32)
    assert int(bz.interpret(g, {"x": x})[0]) == numpy_halving(x)[0]


def test_bodies_with_their_own_weights_and_float64_mode():
    w = np.arange(3, dtype=np.float32)
    scaled = bz.Graph("scaled")
    a = scaled.input("a0", S(3))
    scaled.set_outputs([scaled.mul(a, scaled.param("w", S(3), w))])
    g = bz.Graph("w")
    x = g.input("x", S(3))
    g.set_outputs([g.cond(g.constant(np.array(True)), scaled, body("id", [S(3)],
                                                                   lambda b, v: v), x)])
    xs = np.ones(3, np.float32)
    np.testing.assert_array_equal(bz.interpret(g, {"x": xs})[0], w)
    out = bz.interpret(g, {"x": xs}, float64=True)[0]
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, w)


# -- identity, text IR, save/load --------------------------------------------------------------
def test_equal_bodies_make_equal_ops_with_equal_hashes():
    a, b = cond_model(), cond_model()
    op_a, op_b = a.node(a.outputs[0]).op, b.node(b.outputs[0]).op
    assert op_a is not op_b and op_a == op_b and hash(op_a) == hash(op_b)
    other = If(op_a.else_graph, op_a.then_graph)
    assert other != op_a


def test_text_ir_shows_the_bodies_and_round_trips():
    for g in (cond_model(), halving_loop()):
        text = str(g)
        assert "graph then(" in text or "graph halve(" in text
        back = bz.Graph.parse(text)
        assert back == g and str(back) == text


def test_save_load_round_trips_bodies_and_their_weights(tmp_path):
    w = np.linspace(-1, 1, 4).astype(np.float32)
    carried = [S(dt=bz.i32), S(4)]
    cond = body("c", carried, lambda b, i, v: b.lt(i, 3))
    step = bz.Graph("step")
    i, v = step.input("in0", carried[0]), step.input("in1", carried[1])
    step.set_outputs([step.add(i, 1), step.add(v, step.param("bias", S(4), w))])
    g = bz.Graph("saved")
    x = g.input("x", S(4))
    g.set_outputs([g.while_loop(cond, step, g.constant(np.array(0, np.int32)), x,
                                max_iterations=4)[1]])
    bz.save(g, tmp_path / "m.json")
    back = bz.load(tmp_path / "m.json")
    assert back == g
    assert np.array_equal(back.node(back.outputs[0]).op.body_graph.weights["bias"], w)
    xs = np.zeros(4, np.float32)
    np.testing.assert_allclose(bz.interpret(back, {"x": xs})[0], 3 * w, rtol=1e-6)


# -- the rest of braze ----------------------------------------------------------------------
def test_fuse_keeps_control_flow_and_compile_matches_the_interpreter():
    for g in (cond_model(), halving_loop()):
        fused, report = bz.fuse(g, "cpu")
        assert fused.count("if") + fused.count("while") == 1
        exe = bz.compile(g)
        for seed in range(3):
            feeds = bz.random_feeds(g, seed)
            feeds["x"] = feeds["x"] * np.float32(10)
            for got, want in zip(exe(feeds), bz.interpret(g, feeds), strict=True):
                assert got.shape == want.shape and got.dtype == want.dtype
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_compiled_bodies_follow_the_precision_policy():
    mm = body("mm", [S(8, 64), S(64, 8)], lambda b, x, w: b.matmul(x, w))
    g = bz.Graph("bf16_branch")
    x, w = g.input("x", S(8, 64)), g.input("w", S(64, 8))
    g.set_outputs([g.cond(g.gt(g.sum(x), 0.0), mm, mm, x, w), g.matmul(x, w)])
    rng = np.random.default_rng(0)
    feeds = {"x": (1 + rng.normal(size=(8, 64)) * 1e-3).astype(np.float32),
             "w": (1 + rng.normal(size=(64, 8)) * 1e-3).astype(np.float32)}
    in_branch, outside = bz.compile(g, precision="bf16")(feeds)
    assert np.abs(outside - bz.interpret(g, feeds)[1]).max() > 1e-3  # bf16 rounding shows
    np.testing.assert_array_equal(in_branch, outside)


def test_export_of_an_unbounded_loop_writes_an_onnx_loop(tmp_path):
    """No unrolled form exists without max_iterations: the export is an ONNX Loop that runs
    as long as the interpreter's loop does."""
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    g = halving_loop(max_iterations=None)
    path = bz.export_onnx(g, str(tmp_path / "m.onnx"))
    assert "Loop" in [n.op_type for n in onnx.load(path).graph.node]
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for x in (np.array([0.5, 0, 0, 0], np.float32), np.array([40, -3, 7, 1], np.float32)):
        for got, want in zip(sess.run(None, {"x": x}), bz.interpret(g, {"x": x})):
            np.testing.assert_array_equal(got, want)


BRANCH_WEIGHT = np.array([2.0, -1.0, 0.5], np.float32)


def branch_with_a_weight(name: str, loss: bool = False) -> bz.Graph:
    """cond(sum x > 0, -x, x * bw): the else branch holds a param with a stored value; with
    `loss`, the sum of the result."""
    scaled = bz.Graph("scaled")
    a = scaled.input("a0", S(3))
    scaled.set_outputs([scaled.mul(a, scaled.param("bw", S(3), BRANCH_WEIGHT))])
    g = bz.Graph(name)
    x = g.input("x", S(3))
    y = g.cond(g.gt(g.sum(x), 0.0), body("neg", [S(3)], lambda b, v: b.neg(v)), scaled, x)
    g.set_outputs([g.sum(y) if loss else y])
    return g


def test_export_writes_the_weights_of_params_held_in_bodies(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    g = branch_with_a_weight("body_weights")
    path = bz.export_onnx(g, str(tmp_path / "m.onnx"))
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for xs in (np.ones(3, np.float32), -np.ones(3, np.float32)):
        want = bz.interpret(g, {"x": xs})[0]
        np.testing.assert_allclose(sess.run(None, {"x": xs})[0], want, rtol=1e-6)


# -- autodiff -----------------------------------------------------------------------------------
def test_gradients_differentiate_only_the_branch_and_steps_that_ran():
    """d/dx of cond(min x > 0, log x, 2x) at x with a 0 is 2 everywhere, not NaN (0 * inf from
    the untaken log); a step past the loop's end whose sqrt is NaN adds nothing either."""
    g = bz.Graph("guarded")
    x = g.input("x", S(3))
    g.set_outputs([g.sum(g.cond(g.gt(g.reduce(x, "min"), 0.0),
                                body("log", [S(3)], lambda b, v: b.log(v)),
                                body("twice", [S(3)], lambda b, v: b.mul(v, 2.0)), x))])
    xs = np.array([-1.0, 2.0, 0.0], np.float32)
    grads = bz.grad_with_loss(g, "x")
    np.testing.assert_array_equal(bz.interpret(grads, {"x": xs})[1], 2.0)
    np.testing.assert_array_equal(bz.compile(grads)({"x": xs})[1], 2.0)
    carried = [S(dt=bz.i32), S(3)]
    loop = bz.Graph("once")
    v = loop.input("v", S(3))
    loop.set_outputs([loop.sum(loop.while_loop(
        body("first", carried, lambda b, i, u: b.lt(i, 1)),
        body("root", carried, lambda b, i, u: (b.add(i, 1), b.sub(b.sqrt(u), 2.0))),
        loop.constant(np.array(0, np.int32)), v, max_iterations=3)[1])])
    xs = np.array([1.0, 4.0, 9.0], np.float32)
    got = bz.interpret(bz.grad_with_loss(loop, "v"), {"v": xs})[1]
    np.testing.assert_allclose(got, 0.5 / np.sqrt(xs), rtol=1e-6)


def test_gradients_reach_params_held_in_a_branch():
    g = branch_with_a_weight("branch_weights", loss=True)
    _, dx, dw = bz.interpret(bz.grad_with_loss(g, ["x", "bw"]), {"x": -np.ones(3, np.float32)})
    np.testing.assert_array_equal(dx, BRANCH_WEIGHT)
    np.testing.assert_array_equal(dw, -1.0)


def _log_times_weight(name, n=3):
    b = bz.Graph(name)
    v = b.input("in0", S(n, dt=bz.f64))
    w = b.param("lw", S(n, dt=bz.f64))
    b.set_weight("lw", np.full(n, 3.0))
    b.set_outputs([b.mul(b.log(v), w)])
    return b


def test_gradients_skip_the_untaken_branch_when_bodies_hold_params():
    """A branch holding a param was differentiated through the decomposition (both branches and
    a where), so the untaken log(x) * w gave d/dx = 0 * inf = NaN at x = 0; its params are now
    lifted out of the body and the if keeps its own VJP."""
    twice = body("twice", [S(3, dt=bz.f64)], lambda b, v: b.mul(v, 2.0))
    g = bz.Graph("weighted_branch")
    x = g.input("x", S(3, dt=bz.f64))
    y = g.cond(g.gt(g.reduce(x, "min"), 0.0), _log_times_weight("log"), twice, x)
    g.set_outputs([g.sum(y)])
    xs = np.array([-1.0, 2.0, 0.0])
    _, dx, dw = bz.interpret(bz.grad_with_loss(g, ["x", "lw"]), {"x": xs})
    np.testing.assert_array_equal(dx, 2.0)
    np.testing.assert_array_equal(dw, 0.0)
    xs = np.array([1.0, 2.0, 4.0])
    _, dx, dw = bz.interpret(bz.grad_with_loss(g, ["x", "lw"]), {"x": xs})
    np.testing.assert_allclose(dx, 3.0 / xs)
    np.testing.assert_allclose(dw, np.log(xs))
    hv = bz.interpret(bz.hvp(g, ["x"]), {"x": xs, "tangent_x": np.ones(3)})[0]
    np.testing.assert_allclose(hv, -3.0 / xs ** 2)
    # nested one level deeper, and a loop whose body holds the param
    outer = bz.Graph("outer")
    v = outer.input("in0", S(3, dt=bz.f64))
    outer.set_outputs([outer.cond(outer.gt(outer.reduce(v, "min"), 0.0),
                                  _log_times_weight("log"), twice, v)])
    nested = bz.Graph("nested")
    x = nested.input("x", S(3, dt=bz.f64))
    nested.set_outputs([nested.sum(nested.cond(nested.gt(nested.sum(x), -5.0), outer, twice, x))])
    np.testing.assert_array_equal(bz.interpret(bz.grad_with_loss(nested, "x"),
                                               {"x": np.array([-1.0, 2.0, 0.0])})[1], 2.0)
    carried = [S(dt=bz.i32), S(3, dt=bz.f64)]
    step = bz.Graph("step")
    i, u = step.input("in0", carried[0]), step.input("in1", carried[1])
    sw = step.param("sw", carried[1])
    step.set_weight("sw", np.full(3, 0.5))
    step.set_outputs([step.add(i, 1), step.mul(step.sqrt(u), sw)])
    loop = bz.Graph("loop")
    x = loop.input("x", carried[1])
    loop.set_outputs([loop.sum(loop.while_loop(
        body("twice_only", carried, lambda b, i, u: b.lt(i, 2)), step,
        loop.constant(np.array(0, np.int32)), x, max_iterations=4)[1])])
    xs = np.array([1.0, 4.0, 9.0])
    _, dx, dsw = bz.interpret(bz.grad_with_loss(loop, ["x", "sw"]), {"x": xs})
    u1 = 0.5 * np.sqrt(xs)                       # two steps of u <- sw * sqrt(u), sw = 0.5
    np.testing.assert_allclose(dx, 0.5 * 0.5 / np.sqrt(u1) * 0.5 * 0.5 / np.sqrt(xs))
    np.testing.assert_allclose(dsw, np.sqrt(u1) + 0.5 * 0.5 / np.sqrt(u1) * np.sqrt(xs))


def test_ifs_nested_to_different_depths_hash_apart():
    """Bodies enter an op's hash by a summary; an if nested inside another entered by kind
    alone, so every level of a chain of nested ifs hashed alike and each inference-cache lookup
    compared whole chains (a 150-deep saved graph took 14 s to load)."""
    leaf = body("b", [S(3)], lambda b, v: b.neg(v))
    ops, inner = [], leaf
    for _ in range(6):
        outer = bz.Graph("b")
        x = outer.input("x", S(3))
        outer.set_outputs([outer.cond(outer.gt(outer.reduce(x, "min"), 0.0), inner, leaf, x)])
        ops.append(next(n.op for n in outer.nodes if n.op.kind == "if"))
        inner = outer
    assert len({hash(op) for op in ops}) == len(ops)
