"""Dead code elimination and common subexpression elimination: what they drop or merge, what
they must keep (graph inputs, outputs, names, params in use), and unchanged numbers."""
import numpy as np
from hypothesis import given, settings

import braze as bz
from braze.ir.ops.region import ElementwiseRegion
from braze.passes.base import run_passes
from braze.passes.cleanup import (
    CSE_PASS,
    DCE_PASS,
    common_subexpression_elimination,
    dead_code_elimination,
)
from braze.passes.regions import MARK_ELEMENTWISE_REGIONS
from braze.passes.targets import TARGETS
from braze.rewrite import RewriteContext
from braze.testing import assert_equivalent, random_graphs

CPU = RewriteContext(target=TARGETS["cpu"])


# -- DCE ------------------------------------------------------------------------------------------
def graph_with_dead_code():
    g = bz.Graph("dead")
    x = g.input("x", bz.Shape(("batch", 4)))
    g.input("unused", bz.Shape((3,)))
    w = g.param("w", bz.Shape((4, 4)), np.eye(4, dtype=np.float32))
    g.param("w_dead", bz.Shape((4, 2)), np.ones((4, 2), np.float32))
    g.tanh(g.mm(x, w))                              # computed, never used
    y = g.relu(x)
    g.exp(y)                                        # dead consumer of a live value
    g.set_outputs([g.add(g.mm(y, w), 1.0)])
    return g


def test_dce_drops_dead_nodes_and_unused_params_but_keeps_inputs():
    g = graph_with_dead_code()
    before = str(g)
    out, changed = dead_code_elimination(g)
    assert changed and str(g) == before
    assert out.op_counts() == {"relu": 1, "matmul": 1, "add": 1}
    assert [n.name for n in out.inputs] == ["x", "unused"]
    assert [n.name for n in out.params] == ["w"] and set(out.weights) == {"w"}
    assert_equivalent(g, out)


def test_dce_on_a_clean_graph_changes_nothing():
    g, _ = dead_code_elimination(graph_with_dead_code())
    again, changed = dead_code_elimination(g)
    assert not changed and again is g


def test_dce_keeps_every_output_even_when_one_feeds_another():
    g = bz.Graph("outs")
    x = g.input("x", bz.Shape((2, 2)))
    h = g.sigmoid(x)
    g.set_outputs([g.neg(h), h, h])
    out, changed = dead_code_elimination(g)
    assert not changed
    assert_equivalent(g, out)


# -- CSE ------------------------------------------------------------------------------------------
def test_cse_merges_equal_ops_on_equal_inputs_transitively():
    g = bz.Graph("dup")
    x = g.input("x", bz.Shape((2, 3)))
    a = g.add_node(bz.ir.ops.Unary(bz.UnaryFn.EXP), (x,), name="first", provenance="p:1")[0]
    b = g.add_node(bz.ir.ops.Unary(bz.UnaryFn.EXP), (x,), name="second", provenance="p:2")[0]
    ya, yb = g.mul(a, 2.0), g.mul(2.0, b)           # equal after a and b merge
    g.set_outputs([g.add(ya, yb), yb])
    before = str(g)
    out, changed = common_subexpression_elimination(g)
    assert changed and str(g) == before
    assert out.op_counts() == {"exp": 1, "mul": 1, "add": 1}
    assert out.count("constant") == 1              # the two 2.0 constants are equal bytes
    (exp,) = [n for n in out.nodes if n.op.label == "exp"]
    assert (exp.name, exp.provenance) == ("first", "p:1")
    assert_equivalent(g, out)


def test_cse_keeps_different_ops_constants_inputs_and_params_apart():
    g = bz.Graph("distinct")
    x = g.input("x", bz.Shape((4,)))
    y = g.input("y", bz.Shape((4,)))
    p = g.param("p", bz.Shape((4,)))
    q = g.param("q", bz.Shape((4,)))
    one, two = g.constant(1.0), g.constant(2.0)
    outs = [g.add(x, one), g.add(x, two), g.sub(x, one), g.sub(one, x), g.add(y, p),
            g.add(y, q), g.cast(x, bz.f64), g.cast(x, bz.f16), g.leaky_relu(x, 0.1),
            g.leaky_relu(x, 0.2), g.add(x, g.constant(np.ones(1, np.float32)))]
    g.set_outputs(outs)
    out, changed = common_subexpression_elimination(g)
    assert not changed and out is g
    assert len(out.inputs) == 2 and len(out.params) == 2


def test_cse_merges_regions_with_equal_bodies_only():
    g = bz.Graph("regions")
    x = g.input("x", bz.Shape((2, 4)))
    w = g.param("w", bz.Shape((4, 4)))
    h = g.mm(x, w)
    r1 = g.mul(g.tanh(h), 3.0)
    r2 = g.mul(g.tanh(h), 3.0)
    r3 = g.mul(g.sigmoid(h), 3.0)
    g.set_outputs([r1, r2, r3])
    marked = MARK_ELEMENTWISE_REGIONS.run(g, CPU).graph
    assert marked.count(ElementwiseRegion) == 3
    out, changed = common_subexpression_elimination(marked)
    assert changed and out.count(ElementwiseRegion) == 2
    assert out.outputs[0] == out.outputs[1] != out.outputs[2]
    assert_equivalent(g, out)


def test_pass_objects_run_in_a_pipeline():
    g = bz.Graph("both")
    x = g.input("x", bz.Shape((3,)))
    a, b = g.exp(x), g.exp(x)
    g.log(a)                                        # dead
    g.set_outputs([g.add(a, b)])
    out, results = run_passes(g, [CSE_PASS, DCE_PASS], CPU, verify=True, check_numerics=True)
    assert [r.name for r in results] == ["CommonSubexpressionElimination", "DeadCodeElimination"]
    assert all(r.changed for r in results)
    assert out.op_counts() == {"exp": 1, "add": 1}


@settings(max_examples=40, deadline=None)
@given(random_graphs(max_nodes=12))
def test_random_graphs_keep_their_meaning(g):
    out, _ = run_passes(g, [CSE_PASS, DCE_PASS], CPU, verify=True)
    assert len(out.nodes) <= len(g.nodes) and len(out.inputs) == len(g.inputs)
    assert_equivalent(g, out)
