"""ConstantFolding: computations of constants and stored weights become one constant (or stored
param) each; run-time values, symbolic dims, lone params, unstored params and results over the
size cap stay computed (the cap shows in stats and misses); numerics hold on fresh inputs and the
input graph is never changed."""
import warnings

import numpy as np
import pytest

import braze as bz
from braze.passes.const_fold import ConstantFolding
from braze.rewrite import MissReason
from braze.testing import assert_equivalent

RNG = np.random.default_rng(0)


def weights(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_constant_subgraphs_fold_to_one_constant_each():
    g = bz.Graph("consts")
    x = g.input("x", bz.Shape(("b", 4)))
    c = g.constant(np.arange(4, dtype=np.float32))
    scale = g.div(g.exp(g.neg(c)), g.sqrt(g.constant(np.float32(2.0))))   # 5 ops on constants
    y = g.mul(x, scale)
    g.set_outputs([y, g.tanh(scale)])
    before = str(g)
    res = ConstantFolding().run(g)
    out = res.graph
    assert res.changed and str(g) == before
    assert out.op_counts() == {"mul": 1}
    assert out.count("constant") == 2                        # scale and tanh(scale)
    assert res.stats["ConstantFolding"].matches == 2
    assert res.stats["ConstantFolding"].near_misses == 0 and not res.misses
    assert_equivalent(g, out, symbols={"b": 3})


def test_stored_weights_fold_into_a_new_stored_param():
    g = bz.Graph("w")
    x = g.input("x", bz.Shape((2, 3)))
    w = g.param("w", bz.Shape((4, 3)), weights(4, 3))
    scale = g.param("scale", bz.Shape((4,)), weights(4))
    wt = g.mul(g.transpose(w, (1, 0)), scale)                 # weight prep on stored weights
    g.set_outputs([g.mm(x, wt)])
    out = ConstantFolding()(g)
    assert out.op_counts() == {"matmul": 1}
    (p,) = out.params
    assert p.op.name == "mul(w|scale)" and p.op.shape == bz.Shape((3, 4))
    np.testing.assert_allclose(out.weights[p.op.name], g.weights["w"].T * g.weights["scale"])
    assert set(out.weights) == {"mul(w|scale)"}               # the sources went with the folds
    assert_equivalent(g, out)


def test_fold_weights_off_keeps_stored_weights_as_run_time_values():
    g = bz.Graph("w")
    x = g.input("x", bz.Shape((2, 3)))
    w = g.param("w", bz.Shape((4, 3)), weights(4, 3))
    g.set_outputs([g.mm(x, g.transpose(g.mul(w, g.constant(np.float32(2))), (1, 0)))])
    res = ConstantFolding(fold_weights=False).run(g)
    assert not res.changed and res.graph is g


def test_run_time_values_and_unstored_params_never_fold():
    g = bz.Graph("runtime")
    x = g.input("x", bz.Shape((3, 4)))
    u = g.param("u", bz.Shape((4, 4)))                         # fed at run time
    c = g.constant(np.ones((4,), np.float32))
    y = g.add(g.mm(x, g.transpose(u, (1, 0))), g.exp(c))
    g.set_outputs([g.relu(y)])
    out = ConstantFolding()(g)
    assert out.op_counts() == {"transpose": 1, "matmul": 1, "add": 1, "relu": 1}
    assert [p.op.name for p in out.params] == ["u"]
    assert_equivalent(g, out)


def test_lone_params_and_constants_are_not_folds():
    g = bz.Graph("lone")
    x = g.input("x", bz.Shape((2, 4)))
    w = g.param("w", bz.Shape((4,)), weights(4))
    g.set_outputs([g.add(x, w), w, g.constant(np.float32(3))])
    res = ConstantFolding().run(g)
    assert not res.changed and res.graph is g
    assert res.stats["ConstantFolding"].attempts == 0


def test_symbolic_dims_are_run_time_values():
    g = bz.Graph("sym")
    x = g.input("x", bz.Shape(("seq", 4)))
    pos = g.cast(g.arange("seq"), bz.f32)                     # depends on the bound seq
    table = g.cast(g.arange(4), bz.f32)                       # static: folds
    y = g.add(x, g.reshape(pos, ("seq", 1)))
    g.set_outputs([g.mul(y, table)])
    out = ConstantFolding()(g)
    assert out.count("range") == 1 and out.count("cast") == 1
    assert out.count("constant") == 1
    assert_equivalent(g, out, symbols={"seq": 5})


def test_results_over_the_cap_stay_computed_and_say_why():
    g = bz.Graph("big")
    x = g.input("x", bz.Shape((64, 64)))
    col = g.constant(np.arange(64, dtype=np.float32).reshape(64, 1))
    row = g.constant(np.arange(64, dtype=np.float32).reshape(1, 64))
    grid = g.add(col, row)                                    # 4096 elements
    small = g.exp(g.neg(row))                                 # 64 elements
    g.set_outputs([g.mul(g.tanh(grid), x), g.add(x, small)])
    res = ConstantFolding(max_elements=1000).run(g)
    out = res.graph
    assert out.count("add") == 2 and out.count("tanh") == 1   # grid and tanh(grid) stay
    assert out.count("exp") == 0 and out.count("neg") == 0
    st = res.stats["ConstantFolding"]
    assert st.near_misses == 1 and st.matches == 1            # grid over the cap: tanh reads it
    (m,) = res.misses
    assert m.reason is MissReason.SIZE_LIMIT_EXCEEDED and m.pattern == "ConstantFolding"
    assert "4096 elements" in m.detail and "max_elements=1000" in m.detail
    assert "add" in m.context and "test_const_fold.py" in m.context
    assert_equivalent(g, out)
    assert ConstantFolding()(g).count("tanh") == 0            # the default cap folds it


def test_a_lone_expand_of_a_constant_stays_a_broadcast():
    g = bz.Graph("bcast")
    x = g.input("x", bz.Shape((8, 16)))
    z = g.expand(g.neg(g.constant(np.float32(1))), (8, 16))
    g.set_outputs([g.add(x, z), g.sum(g.exp(z), -1)])
    out = ConstantFolding()(g)
    assert out.op_counts() == {"expand": 1, "add": 1}         # -1 folded; sum(exp) folded
    consts = [n.op.value for n in out.nodes if n.op.kind == "constant"]
    assert sorted(c.shape for c in consts) == [(), (8,)]
    assert_equivalent(g, out)


def test_multi_output_ops_and_graph_outputs_fold():
    g = bz.Graph("multi")
    x = g.input("x", bz.Shape((2, 6)))
    c = g.constant(np.arange(12, dtype=np.float32).reshape(2, 6))
    a, b = g.split(g.exp(c), -1, [2, 4])
    g.set_outputs([g.mul(x, g.concat([b, a], -1)), a])
    out = ConstantFolding()(g)
    assert out.op_counts() == {"mul": 1}
    assert_equivalent(g, out)


def test_folding_keeps_names_and_provenance_and_is_idempotent():
    g = bz.Graph("names")
    x = g.input("x", bz.Shape((2, 4)))
    c = g.constant(np.ones((4,), np.float32))
    s = g.add_node(bz.ir.ops.Unary(bz.UnaryFn.EXP), (c,), name="scale")[0]
    g.set_outputs([g.mul(x, s)])
    out = ConstantFolding()(g)
    node = out.node_by_name("scale")
    assert node.op.kind == "constant" and "test_const_fold.py" in node.provenance
    assert ConstantFolding().run(out).graph is out


def test_random_graphs_keep_their_numbers():
    from hypothesis import given, settings

    from braze.testing import random_graphs

    @settings(max_examples=25, deadline=None)
    @given(random_graphs(max_nodes=10))
    def check(g):
        stored = bz.Graph.parse(str(g))
        for name, arr in bz.init_params(g, 3).items():
            stored.set_weight(name, arr)
        out = ConstantFolding()(stored)
        assert_equivalent(stored, out, symbols={"batch": 2, "seq": 3}, rtol=1e-4, atol=1e-5)

    check()


@pytest.mark.parametrize("cap", [0, 16])
def test_the_cap_counts_result_elements(cap):
    g = bz.Graph("cap")
    x = g.input("x", bz.Shape((4,)))
    s = g.exp(g.constant(np.float32(1)))                      # 1 element
    v = g.exp(g.constant(np.ones((4,), np.float32)))          # 4 elements
    g.set_outputs([g.add(g.mul(x, s), v)])
    res = ConstantFolding(max_elements=cap).run(g)
    assert res.graph.count("exp") == (2 if cap == 0 else 0)
    assert res.stats["ConstantFolding"].near_misses == (2 if cap == 0 else 0)
    assert_equivalent(g, res.graph)


def test_folding_gives_ieee_results_without_numpy_warnings():
    """T5's relative-position buckets take log(0) = -inf on purpose: folded, silently."""
    g = bz.Graph("ieee")
    x = g.input("x", bz.Shape((3,)))
    c = g.constant(np.array([0.0, 1.0, -1.0], np.float32))
    g.set_outputs([g.add(x, g.maximum(g.log(c), g.constant(np.float32(-5.0))))])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = ConstantFolding().run(g).graph
    assert out.op_counts() == {"add": 1}
    (folded,) = [n.op.value for n in out.nodes if n.op.kind == "constant"]
    np.testing.assert_array_equal(np.isnan(folded), [False, False, True])
    assert folded[0] == -5.0 and folded[1] == 0.0
