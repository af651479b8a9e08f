"""FuseMatMulBiasAct: fires on matmul -> add(bias) -> act in any operand order, refuses with a
reason where fusing would be wrong or unsupported, and keeps the numbers."""
import numpy as np
import pytest

import braze as bz
from braze.passes.base import RulePass, run_passes
from braze.passes.fusion.matmul_bias_act import RULES
from braze.passes.targets import TARGETS
from braze.passes.unfuse import unfuse_fused_for_autodiff
from braze.rewrite import MissReason, RewriteContext
from braze.testing import assert_equivalent

CPU = RewriteContext(target=TARGETS["cpu"])


def fuse(g, ctx=CPU):
    return RulePass("FuseMatMulBiasAct", RULES).run(g, ctx)


def linear_graph(act="gelu", bias_first=False, batch="batch"):
    g = bz.Graph("linear")
    x = g.input("x", bz.Shape((batch, 8)))
    w = g.param("w", bz.Shape((8, 16)))
    b = g.param("b", bz.Shape((16,)))
    mm = g.mm(x, w)
    y = g.add(b, mm) if bias_first else g.add(mm, b)
    if act:
        y = g.activation(y, act)
    g.set_outputs([y])
    return g


@pytest.mark.parametrize("bias_first", [False, True])
@pytest.mark.parametrize("act", ["gelu", "relu", "silu", "tanh", None])
def test_fires_in_either_operand_order(act, bias_first):
    g = linear_graph(act, bias_first)
    res = fuse(g)
    counts = res.graph.op_counts()
    assert counts == {"fused_matmul_bias_act": 1}
    (node,) = [n for n in res.graph.nodes if n.op.kind == "fused_matmul_bias_act"]
    assert node.op.has_bias and (node.op.act.value if node.op.act else None) == act
    assert res.stats["FuseMatMulBiasAct"].matches == 1
    assert_equivalent(g, res.graph)


def test_input_graph_is_not_mutated():
    g = linear_graph()
    before = str(g)
    fuse(g)
    assert str(g) == before


def test_matmul_then_activation_without_bias():
    g = bz.Graph("m")
    x = g.input("x", bz.Shape((4, 8)))
    w = g.param("w", bz.Shape((8, 3)))
    g.set_outputs([g.relu(g.mm(x, w))])
    res = fuse(g)
    (node,) = [n for n in res.graph.nodes if not n.op.source]
    assert node.op.kind == "fused_matmul_bias_act" and not node.op.has_bias
    assert_equivalent(g, res.graph)


def test_intermediate_graph_output_is_never_fused_away():
    g = bz.Graph("m")
    x = g.input("x", bz.Shape((4, 8)))
    w = g.param("w", bz.Shape((8, 3)))
    b = g.param("b", bz.Shape((3,)))
    pre = g.add(g.mm(x, w), b)
    g.set_outputs([g.gelu(pre), pre])
    res = fuse(g)
    # gelu stays outside; matmul + bias still fuse (the pre-activation value is provided)
    assert res.graph.op_counts() == {"fused_matmul_bias_act": 1, "gelu": 1}
    reasons = {(m.pattern, m.reason) for m in res.misses}
    assert ("FuseMatMulBiasAct", MissReason.GRAPH_OUTPUT) in reasons
    assert_equivalent(g, res.graph)


def test_multi_consumer_matmul_does_not_fuse():
    g = bz.Graph("m")
    x = g.input("x", bz.Shape((4, 8)))
    w = g.param("w", bz.Shape((8, 3)))
    b = g.param("b", bz.Shape((3,)))
    mm = g.mm(x, w)
    g.set_outputs([g.add(mm, b), g.mul(mm, mm)])
    res = fuse(g)
    assert res.graph.count("fused_matmul_bias_act") == 0
    (miss,) = [m for m in res.misses if m.reason is MissReason.MULTI_CONSUMER]
    assert "mul" in miss.detail and miss.hint


def test_bias_rank_too_high():
    g = bz.Graph("m")
    x = g.input("x", bz.Shape((4, 8)))
    w = g.param("w", bz.Shape((8, 3)))
    b = g.param("b", bz.Shape((1, 3)))                 # a bias, written with a leading 1
    g.set_outputs([g.relu(g.add(g.mm(x, w), b))])
    res = fuse(g)
    assert res.graph.count("fused_matmul_bias_act") == 0
    assert [m.reason for m in res.misses] == [MissReason.BIAS_RANK_TOO_HIGH]
    assert_equivalent(g, res.graph)


def test_non_add_bias_consumer_is_explained():
    g = bz.Graph("m")
    x = g.input("x", bz.Shape((4, 8)))
    w = g.param("w", bz.Shape((8, 3)))
    b = g.param("b", bz.Shape((3,)))
    g.set_outputs([g.sub(g.mm(x, w), b)])
    res = fuse(g)
    assert not res.changed
    assert [m.reason for m in res.misses] == [MissReason.NON_ADD_BIAS_CONSUMER]


def test_unsupported_epilogue_activation_is_a_miss_not_silence():
    target = TARGETS["cpu"].with_options(
        epilogue_activations=frozenset({bz.UnaryFn.RELU}))
    g = linear_graph("gelu")
    res = fuse(g, RewriteContext(target=target))
    assert res.graph.op_counts() == {"fused_matmul_bias_act": 1, "gelu": 1}
    (miss,) = res.misses
    assert miss.reason is MissReason.UNSUPPORTED_EPILOGUE_ACTIVATION and "gelu" in miss.detail
    assert_equivalent(g, res.graph)


def test_target_without_the_claim_does_not_fuse():
    res = fuse(linear_graph("relu"), RewriteContext(target=TARGETS["reference"]))
    assert not res.changed
    assert {m.reason for m in res.misses} == {MissReason.UNSUPPORTED_BY_TARGET}


def test_fuse_unfuse_round_trip_and_verify_numerics_per_pass():
    g = linear_graph("silu", bias_first=True)
    fused, results = run_passes(g, [RulePass("FuseMatMulBiasAct", RULES)], CPU,
                                verify=True, check_numerics=True)
    plain = unfuse_fused_for_autodiff(fused)
    assert plain.count("fused_matmul_bias_act") == 0 and plain.count("matmul") == 1
    assert_equivalent(g, plain)
    np.testing.assert_equal(results[0].changed, True)


@pytest.mark.parametrize("residual_dims", [(2, 4, 3), (4, 3)])
def test_a_residual_add_after_a_matmul_is_not_a_bias_near_miss(residual_dims):
    g = bz.Graph("m")
    x = g.input("x", bz.Shape((2, 4, 8)))
    r = g.input("r", bz.Shape(residual_dims))          # varies along the rows: no bias
    w = g.param("w", bz.Shape((8, 3)))
    g.set_outputs([g.relu(g.add(g.mm(x, w), r))])
    res = fuse(g)
    assert res.misses == [] and not res.changed
    _, report = bz.fuse(g, "cpu")
    assert not [m for m in report.misses if m.pattern == "FuseMatMulBiasAct"]


@pytest.mark.parametrize("op", ["mul", "div"])
def test_a_column_scale_is_not_told_to_become_an_add(op):
    g = bz.Graph("m")
    x = g.input("x", bz.Shape((4, 8)))
    w = g.param("w", bz.Shape((8, 3)))
    g.set_outputs([getattr(g, op)(g.mm(x, w), g.param("s", bz.Shape((3,))))])
    assert fuse(g).misses == []


def test_subtracted_bias_hint_says_how_to_write_it():
    g = bz.Graph("m")
    x = g.input("x", bz.Shape((4, 8)))
    w = g.param("w", bz.Shape((8, 3)))
    g.set_outputs([g.sub(g.mm(x, w), g.param("b", bz.Shape((3,))))])
    (miss,) = fuse(g).misses
    assert miss.reason is MissReason.NON_ADD_BIAS_CONSUMER and "x @ w + (-b)" in miss.hint
    bias_first = bz.Graph("m")                          # b - x @ w: no bias of the product
    x = bias_first.input("x", bz.Shape((4, 8)))
    w = bias_first.param("w", bz.Shape((8, 3)))
    bias_first.set_outputs([bias_first.sub(bias_first.param("b", bz.Shape((3,))),
                                           bias_first.mm(x, w))])
    assert fuse(bias_first).misses == []


def test_a_cast_between_the_product_and_its_bias_is_a_dtype_miss_whose_hint_fuses():
    """matmul -> cast(f16) -> add(f16 bias) -> act (a mixed-precision export) had fused
    nothing and said nothing; it is a DTYPE_MISMATCH naming the cast, and the hint's form
    (the operands cast instead of the product) fuses."""
    g = bz.Graph("m")
    x = g.input("x", bz.Shape((4, 8)))
    w = g.param("w", bz.Shape((8, 3)))
    b = g.param("b", bz.Shape((3,), bz.f16))
    g.set_outputs([g.relu(g.add(g.cast(g.mm(x, w), bz.f16), b))])
    res = fuse(g)
    assert not res.changed
    (miss,) = res.misses
    assert miss.reason is MissReason.DTYPE_MISMATCH and "cast" in miss.detail
    assert "cast the matmul's operands" in miss.hint
    hinted = bz.Graph("m")
    x = hinted.input("x", bz.Shape((4, 8)))
    w = hinted.param("w", bz.Shape((8, 3)))
    b = hinted.param("b", bz.Shape((3,), bz.f16))
    hinted.set_outputs([hinted.relu(hinted.add(
        hinted.mm(hinted.cast(x, bz.f16), hinted.cast(w, bz.f16)), b))])
    res = fuse(hinted)
    assert res.graph.count("fused_matmul_bias_act") == 1 and not res.misses
    assert_equivalent(hinted, res.graph, rtol=1e-2, atol=1e-2)


def test_a_cast_product_read_by_a_residual_add_is_no_bias_miss():
    g = bz.Graph("m")
    x = g.input("x", bz.Shape((4, 8)))
    r = g.input("r", bz.Shape((4, 3), bz.f16))
    g.set_outputs([g.add(g.cast(g.mm(x, g.param("w", bz.Shape((8, 3)))), bz.f16), r)])
    assert not fuse(g).misses
