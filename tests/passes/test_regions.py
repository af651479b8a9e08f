"""Elementwise regions: marking groups connected elementwise ops (never losing a value read
outside), unfusing inlines them back, clipping splits them to the target's FusionLimits."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import braze as bz
from braze.ir.ops.region import ElementwiseRegion
from braze.passes.base import run_passes
from braze.passes.limits import FusionLimits, with_fusion_limits
from braze.passes.regions import (
    MARK_ELEMENTWISE_REGIONS,
    UNFUSE_ELEMENTWISE_REGIONS,
    ClipRegionsPass,
    clip_elementwise_regions,
)
from braze.passes.targets import TARGETS
from braze.passes.unfuse import unfuse_fused_for_autodiff
from braze.rewrite import MissReason, RewriteContext
from braze.testing import assert_equivalent, random_graphs

CPU = RewriteContext(target=TARGETS["cpu"])
GPU = RewriteContext(target=TARGETS["gpu"])


def mark(g, ctx=CPU):
    return MARK_ELEMENTWISE_REGIONS.run(g, ctx)


def regions(g):
    return [n for n in g.nodes if isinstance(n.op, ElementwiseRegion)]


def step_labels(node):
    return [s.op.label for s in node.op.steps]


def mlp_tail():
    """matmul -> add(broadcast bias) -> gelu -> mul(scalar): one region after the matmul."""
    g = bz.Graph("mlp")
    x = g.input("x", bz.Shape(("batch", 8)))
    w = g.param("w", bz.Shape((8, 16)))
    b = g.param("b", bz.Shape((16,)))
    g.set_outputs([g.mul(g.gelu(g.add(g.mm(x, w), b)), 0.5)])
    return g


def unary_chain(n, ops=("tanh", "sigmoid", "neg", "relu")):
    g = bz.Graph("chain")
    y = g.input("x", bz.Shape((3, 5)))
    for i in range(n):
        y = g.activation(y, ops[i % len(ops)])
    g.set_outputs([y])
    return g


def test_chain_with_broadcast_bias_fires_and_keeps_numbers():
    g = mlp_tail()
    res = mark(g)
    assert res.changed and res.graph.op_counts() == {"matmul": 1, "elementwise_region": 1}
    (r,) = regions(res.graph)
    assert step_labels(r) == ["add", "gelu", "mul"]
    assert r.op.n_inputs == 2 and r.op.n_outputs == 1  # matmul result and bias; 0.5 inlined
    assert res.graph.count("constant") == 0
    assert_equivalent(g, res.graph)


def test_where_compare_cast_join_one_region():
    g = bz.Graph("masked")
    x = g.input("x", bz.Shape((4, 6)))
    y = g.input("y", bz.Shape((1, 6)))
    z = g.where(g.lt(x, y), g.exp(x), g.sub(x, y))
    g.set_outputs([g.cast(g.clamp(g.leaky_relu(z, 0.1), -1.0, 2.0), bz.f64)])
    res = mark(g)
    assert res.graph.op_counts() == {"elementwise_region": 1}
    (r,) = regions(res.graph)
    assert sorted(step_labels(r)) == sorted(
        ["lt", "exp", "sub", "where", "leaky_relu", "clamp", "cast"])
    assert r.op.n_inputs == 2
    assert_equivalent(g, res.graph)


def test_fan_in_and_fan_out_inside_a_region():
    g = bz.Graph("silu_written_out")
    x = g.input("x", bz.Shape((2, 8)))
    b = g.param("b", bz.Shape((8,)))
    h = g.add(x, b)                        # read twice, both times inside the region
    g.set_outputs([g.add(g.mul(h, g.sigmoid(h)), g.log(g.abs(x)))])
    res = mark(g)
    (r,) = regions(res.graph)
    assert len(r.op.steps) == 6 and r.op.n_outputs == 1
    assert_equivalent(g, res.graph)


def test_member_read_by_a_non_member_becomes_a_region_output():
    g = bz.Graph("shared")
    x = g.input("x", bz.Shape((2, 8)))
    b = g.param("b", bz.Shape((8,)))
    w = g.param("w", bz.Shape((8, 8)))
    t = g.tanh(g.add(x, b))                    # read by the matmul and by the second chain
    g.set_outputs([g.mm(t, w), g.mul(g.sigmoid(t), 2.0)])
    res = mark(g)
    assert res.graph.op_counts() == {"elementwise_region": 2, "matmul": 1}
    first, second = regions(res.graph)
    assert step_labels(first) == ["add", "tanh"]
    assert step_labels(second) == ["sigmoid", "mul"]
    (mm,) = [n for n in res.graph.nodes if n.op.kind == "matmul"]
    assert mm.inputs[0].node == first.id and second.inputs == (first.value,)
    assert_equivalent(g, res.graph)


def test_graph_output_member_is_exposed_as_a_second_output():
    g = bz.Graph("pre_act")
    x = g.input("x", bz.Shape((2, 8)))
    b = g.param("b", bz.Shape((8,)))
    pre = g.add(x, b)
    g.set_outputs([g.gelu(pre), pre])
    res = mark(g)
    (r,) = regions(res.graph)
    assert r.op.n_outputs == 2
    assert set(res.graph.outputs) == set(r.values)
    assert_equivalent(g, res.graph)


def test_matmul_producer_is_not_absorbed_and_singletons_stay_plain():
    g = bz.Graph("m")
    x = g.input("x", bz.Shape((2, 8)))
    w = g.param("w", bz.Shape((8, 8)))
    g.set_outputs([g.mm(g.relu(g.mm(x, w)), w)])
    res = mark(g)
    assert not res.changed and res.graph is g
    assert g.op_counts() == {"matmul": 2, "relu": 1}


def test_input_graph_is_not_mutated_and_marking_is_idempotent():
    g = mlp_tail()
    before = str(g)
    once = mark(g)
    assert str(g) == before
    twice = mark(once.graph)
    assert not twice.changed and twice.graph is once.graph


def test_target_without_the_claim_keeps_the_graph_and_says_why():
    g = mlp_tail()
    res = mark(g, RewriteContext(target=TARGETS["reference"]))
    assert not res.changed and res.graph is g
    assert [m.reason for m in res.misses] == [MissReason.UNSUPPORTED_BY_TARGET]


def test_unfuse_round_trip():
    g = mlp_tail()
    marked = mark(g).graph
    plain = UNFUSE_ELEMENTWISE_REGIONS.run(marked, CPU).graph
    assert plain.op_counts() == g.op_counts()
    assert unfuse_fused_for_autodiff(marked).op_counts() == g.op_counts()
    assert_equivalent(g, plain)


def test_regions_compare_by_contents_not_length():
    a = mark(unary_chain(3, ("tanh", "sigmoid", "neg"))).graph
    b = mark(unary_chain(3, ("tanh", "relu", "neg"))).graph
    c = mark(unary_chain(3, ("tanh", "sigmoid", "neg"))).graph
    (ra,), (rb,), (rc,) = regions(a), regions(b), regions(c)
    assert len(ra.op.steps) == len(rb.op.steps) == 3
    assert ra.op != rb.op
    assert ra.op == rc.op and hash(ra.op) == hash(rc.op)


# -- clipping ------------------------------------------------------------------------------------
def test_clip_under_with_fusion_limits_max_steps():
    g = unary_chain(7)
    marked = mark(g).graph
    with with_fusion_limits(max_steps=2):
        res = ClipRegionsPass().run(marked, CPU)
    pieces = regions(res.graph)
    assert res.changed and [len(r.op.steps) for r in pieces] == [2, 2, 2]
    assert res.graph.count("relu") + res.graph.count("tanh") + res.graph.count("neg") \
        + res.graph.count("sigmoid") == 1  # the seventh step alone is inlined
    (miss,) = res.misses
    assert miss.reason is MissReason.REGION_LIMIT_EXCEEDED and "7 steps" in miss.detail
    assert_equivalent(g, res.graph)
    assert not ClipRegionsPass().run(marked, CPU).changed  # CPU is unbounded again


def test_clip_to_max_inputs_keeps_values_read_across_pieces():
    g = bz.Graph("many_inputs")
    x = g.input("x", bz.Shape((2, 4)))
    ps = [g.param(f"p{i}", bz.Shape((4,))) for i in range(5)]
    h = g.relu(g.add(x, ps[0]))
    y = h
    for p in ps[1:]:
        y = g.mul(g.add(y, p), h)             # h is read by every piece
    g.set_outputs([y, h])
    marked = mark(g).graph
    (r,) = regions(marked)
    assert r.op.n_inputs == 6
    out, changed, misses = clip_elementwise_regions(marked, FusionLimits(max_inputs=3))
    assert changed and [m.reason for m in misses] == [MissReason.REGION_LIMIT_EXCEEDED]
    assert regions(out) and all(n.op.n_inputs <= 3 for n in regions(out))
    assert_equivalent(g, out)


def test_gpu_target_default_limits():
    g = unary_chain(40)
    marked = mark(g, GPU).graph
    assert [len(r.op.steps) for r in regions(marked)] == [40]
    res = ClipRegionsPass().run(marked, GPU)
    assert [len(r.op.steps) for r in regions(res.graph)] == [32, 8]
    assert "max_steps=32" in res.misses[0].detail
    assert_equivalent(g, res.graph)


@pytest.mark.parametrize("limits", [FusionLimits(max_steps=1), FusionLimits(max_inputs=1)])
def test_pieces_too_small_for_a_region_are_inlined(limits):
    g = mlp_tail()
    out, changed, _ = clip_elementwise_regions(mark(g).graph, limits)
    assert changed and all(len(r.op.steps) >= 2 for r in regions(out))
    if limits.max_steps == 1:
        assert out.op_counts() == g.op_counts()
    assert_equivalent(g, out)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(max_nodes=14))
def test_random_graphs_keep_their_meaning_through_mark_clip_unfuse(g):
    with with_fusion_limits(max_steps=2, max_inputs=2):
        out, _ = run_passes(g, [MARK_ELEMENTWISE_REGIONS, ClipRegionsPass()], CPU, verify=True)
    assert_equivalent(g, out, rtol=1e-4, atol=1e-5)
    plain = unfuse_fused_for_autodiff(out)
    assert plain.count(ElementwiseRegion) == 0
    assert_equivalent(g, plain, rtol=1e-4, atol=1e-5)


def test_the_cpu_target_splits_a_region_too_long_to_compile_quickly():
    """A 600-op elementwise chain had become one region whose C kernel took seconds to build
    (16 s at 1,000 ops); the cpu target's limits (256 steps, 64 inputs) split it, saying so."""
    from braze.passes.targets import TARGETS

    assert TARGETS["cpu"].limits.max_steps == 256 and TARGETS["cpu"].limits.max_inputs == 64
    g = bz.Graph("chain")
    y = g.input("x", bz.Shape((4, 8)))
    for i in range(600):
        y = g.tanh(g.add(y, 0.01)) if i % 2 else g.mul(y, 0.999)
    g.set_outputs([y])
    fused, report = bz.fuse(g, "cpu")
    regions = [n for n in fused.nodes if n.op.kind == "elementwise_region"]
    assert len(regions) >= 4 and all(len(n.op.steps) <= 256 for n in regions)
    assert [m.reason.name for m in report.misses] == ["REGION_LIMIT_EXCEEDED"]
    feeds = bz.random_feeds(g, 0)
    np.testing.assert_allclose(bz.interpret(fused, feeds)[0], bz.interpret(g, feeds)[0],
                               rtol=1e-6, atol=1e-6)
