"""FuseSharedInputMatMul: Q/K/V (and gate/up) matmuls on one input become one wider matmul plus
narrows, biases folded when every branch has one; weights with known values are concatenated
once; incompatible or cyclic groups are refused with a reason."""
import numpy as np
import pytest

import braze as bz
from braze.passes.base import RulePass, run_passes
from braze.passes.fusion.shared_matmul import RULES
from braze.passes.targets import TARGETS
from braze.passes.unfuse import unfuse_fused_for_autodiff
from braze.rewrite import MissReason, RewriteContext
from braze.testing import assert_equivalent

CPU = RewriteContext(target=TARGETS["cpu"])
WIDTHS = {"q": 4, "k": 6, "v": 4}


def fuse(g, ctx=CPU):
    return RulePass("FuseSharedInputMatMul", RULES).run(g, ctx)


def qkv_graph(bias=True, values=False, seed=0):
    """x @ wq (+ bq), x @ wk (+ bk), x @ wv (+ bv); weights stored in g.weights if `values`."""
    rng = np.random.default_rng(seed)
    g = bz.Graph("qkv")
    x = g.input("x", bz.Shape(("batch", 5, 8)))
    outs = []
    for name, n in WIDTHS.items():
        w = g.param(f"{name}.weight", bz.Shape((8, n)),
                    rng.standard_normal((8, n)) if values else None)
        y = g.mm(x, w)
        if bias:
            b = g.param(f"{name}.bias", bz.Shape((n,)), rng.standard_normal(n) if values else None)
            y = g.add(y, b)
        outs.append(y)
    g.set_outputs(outs)
    return g


def narrows(g):
    return [(n.op.start, n.op.length) for n in g.nodes if n.op.kind == "narrow"]


@pytest.mark.parametrize("bias", [True, False])
def test_qkv_fuses_into_one_matmul_and_three_narrows(bias):
    g = qkv_graph(bias=bias)
    res = fuse(g)
    want = {"matmul": 1, "narrow": 3, "concat": 2 if bias else 1}
    if bias:
        want["add"] = 1
    assert res.graph.op_counts() == want
    assert narrows(res.graph) == [(0, 4), (4, 6), (10, 4)]  # Q, K, V keep their order
    (mm,) = [n for n in res.graph.nodes if n.op.kind == "matmul"]
    assert res.graph.shape_of(mm.inputs[1]).dims == (8, 14)
    assert res.stats["FuseSharedInputMatMul"].matches == 1 and not res.misses
    assert_equivalent(g, res.graph)


def test_input_graph_is_not_mutated():
    g = qkv_graph(values=True)
    before, weights = str(g), dict(g.weights)
    fuse(g)
    assert str(g) == before and g.weights.keys() == weights.keys()


def test_stored_weights_fold_into_one_param_at_compile_time():
    g = qkv_graph(bias=True, values=True)
    res = fuse(g)
    new = res.graph
    assert new.count("concat") == 0
    assert new.op_counts() == {"matmul": 1, "add": 1, "narrow": 3}
    names = ("q.weight", "k.weight", "v.weight")
    np.testing.assert_array_equal(new.weights["|".join(names)],
                                  np.concatenate([g.weights[n] for n in names], axis=-1))
    bnames = ("q.bias", "k.bias", "v.bias")
    np.testing.assert_array_equal(new.weights["|".join(bnames)],
                                  np.concatenate([g.weights[n] for n in bnames]))
    assert_equivalent(g, new)


def test_stored_weights_are_joined_when_first_read(monkeypatch):
    """Fusing joins no stored weights: the joined params are deferred and computed once, on
    first read (the driver's trial build and real build share one deferred join), then kept;
    what every reader sees is the concatenation."""
    import braze.ir.weights as weights

    joined, concatenate = [], np.concatenate

    def counting_concatenate(arrays, axis=0):
        joined.append(concatenate(arrays, axis=axis))
        return joined[-1]

    g = qkv_graph(bias=True, values=True)
    monkeypatch.setattr(weights.np, "concatenate", counting_concatenate)
    new = fuse(g).graph
    assert joined == []
    name = "q.weight|k.weight|v.weight"
    assert new.weights.is_deferred(name) and new.weights.is_deferred("q.bias|k.bias|v.bias")
    first = new.weights[name]
    assert len(joined) == 1 and first is joined[0] and new.weights[name] is first
    assert not new.weights.is_deferred(name)
    monkeypatch.undo()
    np.testing.assert_array_equal(
        first, np.concatenate([g.weights[n] for n in ("q.weight", "k.weight", "v.weight")], -1))
    assert_equivalent(g, new)


def test_constant_weights_fold_into_one_constant():
    g = bz.Graph("c")
    x = g.input("x", bz.Shape((3, 4)))
    rng = np.random.default_rng(1)
    ws = [rng.standard_normal((4, 5)).astype(np.float32) for _ in range(2)]
    g.set_outputs([g.mm(x, g.constant(w)) for w in ws])
    res = fuse(g)
    assert res.graph.op_counts() == {"matmul": 1, "narrow": 2}
    (mm,) = [n for n in res.graph.nodes if n.op.kind == "matmul"]
    np.testing.assert_array_equal(res.graph.node(mm.inputs[1]).op.value, np.concatenate(ws, -1))
    assert_equivalent(g, res.graph)


def test_matmul_returned_as_graph_output_is_provided_by_its_narrow():
    g = bz.Graph("out")
    x = g.input("x", bz.Shape((4, 8)))
    q, k = g.mm(x, g.param("wq", bz.Shape((8, 3)))), g.mm(x, g.param("wk", bz.Shape((8, 5))))
    g.set_outputs([g.gelu(q), q, k])
    res = fuse(g)
    assert res.graph.op_counts() == {"matmul": 1, "narrow": 2, "concat": 1, "gelu": 1}
    assert not res.misses
    assert_equivalent(g, res.graph)


def test_biases_stay_separate_when_a_matmul_is_also_returned():
    g = bz.Graph("out_bias")
    x = g.input("x", bz.Shape((4, 8)))
    ys = []
    for i, n in enumerate((3, 5)):
        mm = g.mm(x, g.param(f"w{i}", bz.Shape((8, n))))
        ys += [mm, g.add(mm, g.param(f"b{i}", bz.Shape((n,))))]
    g.set_outputs(ys)
    res = fuse(g)
    assert res.graph.op_counts() == {"matmul": 1, "narrow": 2, "concat": 1, "add": 2}
    assert_equivalent(g, res.graph)


def test_different_contracted_dim_is_a_shared_matmul_count_miss():
    g = bz.Graph("k")
    x = g.input("x", bz.Shape((4, 8)))
    a = g.mm(x, g.param("w1", bz.Shape((8, 16))))      # contracts x over K=8
    b = g.mm(g.param("w2", bz.Shape((3, 4))), x)       # contracts x over 4
    g.set_outputs([a, b])
    res = fuse(g)
    assert not res.changed
    (miss,) = res.misses
    assert miss.reason is MissReason.SHARED_MATMUL_COUNT and "right operand" in miss.detail


def test_rank3_weight_is_a_shape_mismatch():
    g = bz.Graph("r3")
    x = g.input("x", bz.Shape((4, 8)))
    a = g.mm(x, g.param("w1", bz.Shape((8, 16))))
    b = g.mm(x, g.param("w3", bz.Shape((2, 8, 16))))
    g.set_outputs([a, b])
    res = fuse(g)
    assert not res.changed
    (miss,) = res.misses
    assert miss.reason is MissReason.SHAPE_MISMATCH and "[2, 8, 16]" in miss.detail


def test_lone_matmul_is_not_a_near_miss():
    g = bz.Graph("lone")
    x = g.input("x", bz.Shape((4, 8)))
    g.set_outputs([g.relu(g.mm(x, g.param("w", bz.Shape((8, 2)))))])
    res = fuse(g)
    assert not res.changed and res.misses == []


def test_weight_computed_from_another_branch_is_never_fused():
    g = bz.Graph("cycle")
    x = g.input("x", bz.Shape((8, 8)))
    q = g.mm(x, g.param("wq", bz.Shape((8, 8))))
    k = g.mm(x, g.transpose(q))                       # k's weight needs q: fusing makes a cycle
    g.set_outputs([k])
    res = fuse(g)
    assert not res.changed and res.graph.count("matmul") == 2
    assert_equivalent(g, res.graph)


def test_cyclic_branch_is_left_out_and_the_rest_fuse():
    g = bz.Graph("cycle3")
    x = g.input("x", bz.Shape((8, 8)))
    q = g.mm(x, g.param("wq", bz.Shape((8, 8))))
    k = g.mm(x, g.transpose(q))
    v = g.mm(x, g.param("wv", bz.Shape((8, 4))))
    g.set_outputs([k, v])
    res = fuse(g)
    assert res.graph.op_counts() == {"matmul": 2, "narrow": 2, "concat": 1, "transpose": 1}
    assert_equivalent(g, res.graph)


def test_target_without_the_claim_does_not_fuse():
    res = fuse(qkv_graph(), RewriteContext(target=TARGETS["reference"]))
    assert not res.changed
    assert {m.reason for m in res.misses} == {MissReason.UNSUPPORTED_BY_TARGET}


def test_fuse_unfuse_round_trip_keeps_folded_weights():
    g = qkv_graph(bias=True, values=True)
    fused, _ = run_passes(g, [RulePass("FuseSharedInputMatMul", RULES)], CPU,
                          verify=True, check_numerics=True)
    plain = unfuse_fused_for_autodiff(fused)
    assert plain.op_counts() == {"matmul": 1, "add": 1, "narrow": 3}
    assert "q.weight|k.weight|v.weight" in plain.weights
    assert_equivalent(g, plain)
