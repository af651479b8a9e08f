"""LowerControlFlow: `if` becomes both branches + where, `while` a bounded unroll of guarded
steps (a loop that finished keeps its values); nested control flow lowers in one pass; the
numbers are the interpreter's on the original graph; graphs without control flow are left
alone; an unbounded loop is a PassError naming the node; the input graph is never changed;
inline_subgraph_into shares or renames body params; rewrite_for_backend uses the lowering for a
target that claims no control flow."""
import numpy as np
import pytest
from lowering_helpers import op_counts

import braze as bz
from braze.errors import GraphError, PassError
from braze.op_examples import body_graph as body
from braze.testing import assert_equivalent


def S(*dims, dt=bz.f32):
    return bz.Shape(dims, dt)




def cond_model():
    then_g = body("then", [S(2, 5), S(5)], lambda b, x, y: (b.add(b.tanh(x), y), b.exp(y)))
    else_g = body("else", [S(2, 5), S(5)], lambda b, x, y: (b.mul(x, y), b.neg(y)))
    g = bz.Graph("cond_model")
    x, y = g.input("x", S(2, 5)), g.input("y", S(5))
    g.set_outputs(list(g.cond(g.gt(g.sum(y), 0.0), then_g, else_g, x, y)))
    return g


def counting_loop(max_iterations=8, nested=False):
    """v = 0.5 v + 1 (or, nested, an `if` picking that or v - 1) until i reaches n, a loop
    whose trip count depends on the input n."""
    carried = [S(dt=bz.i32), S(dt=bz.i32), S(3)]
    cond = body("more", carried, lambda b, i, n, v: b.lt(i, n))

    def step(b, i, n, v):
        half = body("half", [S(3)], lambda bb, u: bb.add(bb.mul(u, 0.5), 1.0))
        if not nested:
            new_v = b.add(b.mul(v, 0.5), 1.0)
        else:
            down = body("down", [S(3)], lambda bb, u: bb.sub(u, 1.0))
            new_v = b.cond(b.lt(b.sum(v), 4.0), half, down, v)
        return b.add(i, 1), n, new_v

    g = bz.Graph("loop")
    n, x = g.input("n", S(dt=bz.i32)), g.input("x", S(3))
    _, _, v = g.while_loop(cond, body("step", carried, step), g.constant(np.array(0, np.int32)),
                           n, x, max_iterations=max_iterations)
    g.set_outputs([v])
    return g


def test_if_lowers_to_where_over_both_branches():
    g = cond_model()
    res = bz.LowerControlFlow.run(g)
    assert res.changed
    assert op_counts(res.graph) == {"add": 1, "tanh": 1, "exp": 1, "mul": 1, "neg": 1,
                                    "where": 2, "reduce_sum": 1, "gt": 1}
    assert_equivalent(g, res.graph, seeds=range(6))


@pytest.mark.parametrize("n", [0, 1, 5, 8])
def test_while_unrolls_and_a_finished_loop_keeps_its_values(n):
    g = counting_loop()
    low = bz.LowerControlFlow(g)
    counts = op_counts(low)
    assert "while" not in counts and counts["lt"] == 8 and counts["where"] == 24
    assert counts["and"] == 7
    x = np.random.default_rng(n).normal(size=3).astype(np.float32)
    feeds = {"n": np.array(n, np.int32), "x": x}
    want = bz.interpret(g, feeds)[0]
    np.testing.assert_allclose(bz.interpret(low, feeds)[0], want, rtol=1e-6)
    ref = x
    for _ in range(n):
        ref = ref * np.float32(0.5) + np.float32(1)
    np.testing.assert_allclose(want, ref, rtol=1e-6)


def test_nested_control_flow_lowers_in_one_pass():
    g = counting_loop(nested=True)
    low = bz.LowerControlFlow(g)
    assert not {"if", "while"} & set(op_counts(low))
    for n, seed in [(0, 0), (3, 1), (6, 2), (8, 3)]:
        x = np.random.default_rng(seed).normal(size=3).astype(np.float32) * 3
        feeds = {"n": np.array(n, np.int32), "x": x}
        np.testing.assert_allclose(bz.interpret(low, feeds)[0], bz.interpret(g, feeds)[0],
                                   rtol=1e-6)


def test_inline_if_and_unroll_while_each_lower_one_kind():
    g = counting_loop(nested=True)
    unrolled = bz.unroll_while(g)
    assert op_counts(unrolled)["if"] == 8 and "while" not in op_counts(unrolled)
    assert bz.inline_if(g).count("while") == 1
    assert not {"if", "while"} & set(op_counts(bz.inline_if(unrolled)))
    assert bz.inline_if(counting_loop()) is not None


def test_each_kind_lowers_inside_the_bodies_of_the_other_kind():
    loop = counting_loop(nested=True)
    inlined = bz.inline_if(loop)
    step = inlined.node(inlined.outputs[0]).op.body_graph
    assert inlined.count("while") == 1 and step.count("if") == 0
    g = bz.Graph("loop_in_if")
    n, x = g.input("n", S(dt=bz.i32)), g.input("x", S(3))
    keep = body("keep", [S(dt=bz.i32), S(3)], lambda b, k, v: v)
    g.set_outputs([g.cond(g.gt(g.sum(x), 0.0), loop, keep, n, x)])
    unrolled = bz.unroll_while(g)
    branch = unrolled.node(unrolled.outputs[0]).op.then_graph
    assert unrolled.count("if") == 1 and branch.count("while") == 0
    for k, seed in [(2, 0), (5, 1)]:
        x = np.abs(np.random.default_rng(seed).normal(size=3)).astype(np.float32)
        feeds = {"n": np.array(k, np.int32), "x": x}
        for low, orig in ((unrolled, g), (inlined, loop)):
            np.testing.assert_allclose(bz.interpret(low, feeds)[0],
                                       bz.interpret(orig, feeds)[0], rtol=1e-6)


def test_graph_without_control_flow_is_unchanged():
    g = bz.Graph("plain")
    x = g.input("x", S(4))
    g.set_outputs([g.where(g.gt(x, 0.0), x, g.neg(x))])
    res = bz.LowerControlFlow.run(g)
    assert not res.changed and res.graph is g
    assert bz.inline_if(g) is g and bz.unroll_while(g) is g


def test_unbounded_while_is_an_error_naming_the_node():
    g = counting_loop(max_iterations=None)
    for lower in (bz.LowerControlFlow, bz.unroll_while):
        with pytest.raises(PassError) as err:
            lower(g)
        msg = str(err.value)
        assert "(while)" in msg and "test_lower_control_flow.py:" in msg
        assert "max_iterations=N" in msg


def test_input_graph_is_not_changed():
    g = counting_loop(nested=True)
    before = str(g)
    bz.LowerControlFlow(g)
    bz.inline_if(g)
    assert str(g) == before


def test_body_params_become_params_shared_across_steps_and_renamed_on_clashes():
    w = np.array([1.0, -2.0, 3.0], np.float32)
    step = bz.Graph("step")
    i, v = step.input("in0", S(dt=bz.i32)), step.input("in1", S(3))
    step.set_outputs([step.add(i, 1), step.mul(v, step.param("w", S(3), w))])
    cond = body("c", [S(dt=bz.i32), S(3)], lambda b, i, v: b.lt(i, 2))
    g = bz.Graph("outer")
    x = g.input("x", S(3))
    outer_w = g.param("w", S(3))  # a different tensor of the same name, supplied at run time
    _, v = g.while_loop(cond, step, g.constant(np.array(0, np.int32)), g.add(x, outer_w),
                        max_iterations=3)
    g.set_outputs([v])
    low = bz.LowerControlFlow(g)
    names = sorted(p.op.name for p in low.params)
    assert names == ["w", "w_1"] and "w" not in low.weights
    np.testing.assert_array_equal(low.weights["w_1"], w)
    params = {"w": np.full(3, 0.25, np.float32)}
    assert_equivalent(g, low, params=params)


def test_inline_subgraph_into_binds_inputs_by_position():
    sub = body("sub", [S(3), S(3)], lambda b, p, q: (b.sub(p, q), b.mul(p, q)))
    g = bz.Graph("target")
    x, y = g.input("x", S(3)), g.input("y", S(3))
    first = bz.inline_subgraph_into(g, sub, [y, x])
    outs = bz.inline_subgraph_into_outputs(g, sub, [x, y])
    g.set_outputs([first, *outs])
    xs, ys = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    got = bz.interpret(g, {"x": xs, "y": ys})
    for a, b in zip(got, [ys - xs, xs - ys, xs * ys]):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(GraphError, match="takes 2 inputs, got 1"):
        bz.inline_subgraph_into(g, sub, [x])


def test_rewrite_for_backend_lowers_control_flow_for_a_target_without_it():
    from braze.passes.targets import all_op_names

    g = counting_loop(nested=True)
    target = all_op_names() - {"if", "while"}
    low = bz.rewrite_for_backend(g, target)
    bz.legalize(low, target)
    assert not {"if", "while"} & set(op_counts(low))
    feeds = {"n": np.array(4, np.int32), "x": np.ones(3, np.float32)}
    np.testing.assert_allclose(bz.interpret(low, feeds)[0], bz.interpret(g, feeds)[0])


def test_unbounded_while_names_the_node_when_legalized():
    """A path that reaches the loop through its decomposition (rewrite_for_backend) names the
    node too: replace_nodes prefixes a builder's braze error with the node it rewrites. (The
    ONNX export writes such a loop as an ONNX Loop instead: tests/ir/test_control_flow.py.)"""
    g = counting_loop(max_iterations=None)
    small = bz.get_target("cpu").restrict({"add", "mul", "lt", "where", "and"})
    with pytest.raises(bz.BrazeError) as err:
        bz.rewrite_for_backend(g, small)
    assert "(while)" in str(err.value) and "test_lower_control_flow.py:" in str(err.value)
