"""FuseSwiGLU (halves of one h) and FuseSwiGLUDualMatmul (two projections of one x): fire in both
layouts and both silu spellings, match an independent NumPy silu(g) * u, refuse with a reason,
and unfuse back to primitives."""
import numpy as np
import pytest

import braze as bz
from braze.passes.base import RulePass, run_passes
from braze.passes.fusion.shared_matmul import RULES as SHARED_RULES
from braze.passes.fusion.swiglu import DUAL_RULES, RULES, SPLIT_RULES
from braze.passes.targets import TARGETS
from braze.passes.unfuse import unfuse_fused_for_autodiff
from braze.rewrite import MissReason, RewriteContext
from braze.testing import assert_equivalent

CPU = RewriteContext(target=TARGETS["cpu"])


def fuse(g, rules=RULES, ctx=CPU):
    return RulePass("FuseSwiGLU", rules).run(g, ctx)


def np_swiglu(gate, up):
    return gate / (1.0 + np.exp(-gate)) * up


def silu(g, v, form):
    return g.silu(v) if form == "silu" else g.mul(v, g.sigmoid(v))


def split_graph(gate_first=True, form="silu", n=6):
    """h = x @ w; silu(gate half) * up half, the gate half first or second."""
    g = bz.Graph("swiglu")
    x = g.input("x", bz.Shape(("batch", 8)))
    h = g.mm(x, g.param("w", bz.Shape((8, 2 * n))))
    first, second = g.narrow(h, -1, 0, n), g.narrow(h, -1, n, n)
    gate, up = (first, second) if gate_first else (second, first)
    g.set_outputs([g.mul(silu(g, gate, form), up)])
    return g


def dual_graph(form="silu", values=False, shared=True):
    rng = np.random.default_rng(0)
    g = bz.Graph("dual")
    x = g.input("x", bz.Shape(("batch", 8)))
    y = x if shared else g.input("y", bz.Shape(("batch", 8)))
    wg = g.param("wg", bz.Shape((8, 6)), rng.standard_normal((8, 6)) if values else None)
    wu = g.param("wu", bz.Shape((8, 6)), rng.standard_normal((8, 6)) if values else None)
    g.set_outputs([g.mul(g.mm(y, wu), silu(g, g.mm(x, wg), form))])
    return g


def fused_node(g):
    (node,) = [n for n in g.nodes if n.op.kind == "fused_swiglu"]
    return node


def check_against_numpy(before, after, split):
    """after(x) == silu(gate) * up computed with NumPy from the same x and weights."""
    feeds = bz.random_feeds(before, 3)
    params = bz.init_params(before, 3)
    (got,) = bz.interpret(after, feeds, params)
    if split:
        h = feeds["x"] @ params["w"]
        gate, up = split
        want = np_swiglu(h[:, gate[0]:gate[1]], h[:, up[0]:up[1]])
    else:
        want = np_swiglu(feeds["x"] @ params["wg"], feeds["x"] @ params["wu"])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# -- FuseSwiGLU ---------------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["silu", "sigmoid"])
@pytest.mark.parametrize("gate_first", [True, False])
def test_split_halves_fuse_in_both_layouts(gate_first, form):
    g = split_graph(gate_first, form)
    res = fuse(g, SPLIT_RULES)
    assert res.graph.op_counts() == {"matmul": 1, "fused_swiglu": 1}
    assert fused_node(res.graph).op.gate_first is gate_first
    halves = ((0, 6), (6, 12)) if gate_first else ((6, 12), (0, 6))
    check_against_numpy(g, res.graph, halves)
    assert_equivalent(g, res.graph)


def test_shared_matmul_then_swiglu_fuses_gate_and_up():
    g = dual_graph()
    passes = [RulePass("FuseSharedInputMatMul", SHARED_RULES), RulePass("FuseSwiGLU", SPLIT_RULES)]
    fused, _ = run_passes(g, passes, CPU, verify=True, check_numerics=True)
    assert fused.op_counts() == {"concat": 1, "matmul": 1, "fused_swiglu": 1}
    # the shared matmul orders branches by node order: up (read first) is the first half
    assert fused_node(fused).op.gate_first is False
    check_against_numpy(g, fused, None)


def test_unequal_halves_are_a_shape_mismatch():
    g = bz.Graph("uneven")
    x = g.input("x", bz.Shape((4, 8)))
    h = g.mm(x, g.param("w", bz.Shape((8, 12))))
    g.set_outputs([g.mul(g.silu(g.narrow(h, -1, 0, 4)), g.narrow(h, -1, 4, 4))])
    res = fuse(g, SPLIT_RULES)
    assert not res.changed
    (miss,) = res.misses
    assert miss.reason is MissReason.SHAPE_MISMATCH and "two equal halves" in miss.detail


@pytest.mark.parametrize("leak, reason", [
    ("gate_output", MissReason.GRAPH_OUTPUT),
    ("gate_reused", MissReason.MULTI_CONSUMER),
    ("silu_reused", MissReason.MULTI_CONSUMER),
])
def test_intermediate_used_elsewhere_blocks_fusion(leak, reason):
    g = bz.Graph("leak")
    x = g.input("x", bz.Shape((4, 8)))
    h = g.mm(x, g.param("w", bz.Shape((8, 12))))
    gate, up = g.narrow(h, -1, 0, 6), g.narrow(h, -1, 6, 6)
    act = g.silu(gate)
    out = g.mul(act, up)
    if leak == "gate_output":
        extra = gate
    elif leak == "gate_reused":
        extra = g.relu(gate)
    else:
        extra = g.exp(act)
    g.set_outputs([out, extra])
    res = fuse(g, SPLIT_RULES)
    assert res.graph.count("fused_swiglu") == 0
    assert [m.reason for m in res.misses] == [reason]


def test_halves_of_different_tensors_are_not_shared_input():
    g = bz.Graph("two_h")
    x = g.input("x", bz.Shape((4, 8)))
    h1 = g.mm(x, g.param("w1", bz.Shape((8, 12))))
    h2 = g.mm(x, g.param("w2", bz.Shape((8, 12))))
    g.set_outputs([g.mul(g.silu(g.narrow(h1, -1, 0, 6)), g.narrow(h2, -1, 6, 6))])
    res = fuse(g, SPLIT_RULES)
    assert not res.changed
    (miss,) = res.misses
    assert miss.reason is MissReason.NOT_SHARED_INPUT and "FuseSharedInputMatMul" in miss.hint


# -- FuseSwiGLUDualMatmul -----------------------------------------------------------------------
@pytest.mark.parametrize("form", ["silu", "sigmoid"])
def test_dual_matmul_fuses_with_a_concat_node_for_weights_without_values(form):
    g = dual_graph(form)
    res = fuse(g, DUAL_RULES)
    assert res.graph.op_counts() == {"concat": 1, "matmul": 1, "fused_swiglu": 1}
    assert fused_node(res.graph).op.gate_first is True
    check_against_numpy(g, res.graph, None)
    assert_equivalent(g, res.graph)


def test_dual_matmul_folds_stored_weights_into_one_param():
    g = dual_graph(values=True)
    res = fuse(g, DUAL_RULES)
    assert res.graph.op_counts() == {"matmul": 1, "fused_swiglu": 1}
    np.testing.assert_array_equal(res.graph.weights["wg|wu"],
                                  np.concatenate([g.weights["wg"], g.weights["wu"]], axis=-1))
    assert_equivalent(g, res.graph)


def test_dual_matmul_on_different_inputs_is_not_shared_input():
    g = dual_graph(shared=False)
    res = fuse(g, DUAL_RULES)
    assert not res.changed
    (miss,) = res.misses
    assert miss.pattern == "FuseSwiGLUDualMatmul" and miss.reason is MissReason.NOT_SHARED_INPUT
    assert "same tensor" in miss.hint


def test_dual_matmul_with_unequal_widths_is_a_shape_mismatch():
    g = bz.Graph("bcast")
    x = g.input("x", bz.Shape((4, 8)))
    gate = g.mm(x, g.param("wg", bz.Shape((8, 6))))
    up = g.mm(x, g.param("wu", bz.Shape((8, 1))))       # broadcasts in the mul
    g.set_outputs([g.mul(g.silu(gate), up)])
    res = fuse(g, DUAL_RULES)
    assert not res.changed
    assert [m.reason for m in res.misses] == [MissReason.SHAPE_MISMATCH]


@pytest.mark.parametrize("rules,dtype", [(DUAL_RULES, bz.i32), (SPLIT_RULES, bz.i32),
                                         (DUAL_RULES, bz.f32)])
def test_integer_gated_product_is_a_dtype_miss_whose_hint_fuses(rules, dtype):
    """relu(x @ wg) * (x @ wu) in integers: a DTYPE_MISMATCH naming the dtype (it was an
    INVALID_REPLACEMENT asking for a bug report); in a float dtype, as the hint says, it fuses."""
    g = bz.Graph("int_gated")
    x = g.input("x", bz.Shape((4, 8), dtype))
    if rules is DUAL_RULES:
        gate, up = (g.mm(x, g.param(n, bz.Shape((8, 6), dtype))) for n in ("wg", "wu"))
    else:
        h = g.mm(x, g.param("w", bz.Shape((8, 12), dtype)))
        gate, up = g.narrow(h, -1, 0, 6), g.narrow(h, -1, 6, 6)
    g.set_outputs([g.mul(g.relu(gate), up)])
    res = fuse(g, rules)
    if dtype.is_float:
        assert res.changed and not res.misses
        return
    (miss,) = res.misses
    assert not res.changed and miss.reason is MissReason.DTYPE_MISMATCH and "i32" in miss.detail
    assert "float" in miss.hint


def test_target_without_the_claim_does_not_fuse():
    ort = RewriteContext(target=TARGETS["onnxruntime"])
    for g in (split_graph(), dual_graph()):
        res = fuse(g, RULES, ort)
        assert not res.changed
        assert {m.reason for m in res.misses} == {MissReason.UNSUPPORTED_BY_TARGET}


@pytest.mark.parametrize("build", [lambda: split_graph(False, "sigmoid"), dual_graph])
def test_fuse_unfuse_round_trip(build):
    g = build()
    fused, _ = run_passes(g, [RulePass("FuseSwiGLU", RULES)], CPU, verify=True,
                          check_numerics=True)
    assert fused.count("fused_swiglu") == 1
    plain = unfuse_fused_for_autodiff(fused)
    assert plain.count("fused_swiglu") == 0
    assert (plain.count("silu"), plain.count("mul"), plain.count("narrow")) == (1, 1, 2)
    assert_equivalent(g, plain)
