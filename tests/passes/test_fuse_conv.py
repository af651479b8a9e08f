"""FuseConvBiasAct and FoldConvBatchNorm: conv + per-channel bias + activation fuse into one
node, batch norms after convs fold into the conv's weights (once, in NumPy, when values are
known), each refusal says why, and a ResNet block ends up as fused convs with unchanged numbers."""
import numpy as np
import pytest

import braze as bz
from braze.models.resnet import resnet_basic_block
from braze.passes.base import RulePass, run_passes
from braze.passes.fusion import conv_bias_act, conv_bn
from braze.passes.regions import MARK_ELEMENTWISE_REGIONS
from braze.passes.targets import TARGETS
from braze.passes.unfuse import unfuse_fused_for_autodiff
from braze.rewrite import MissReason, RewriteContext
from braze.testing import assert_equivalent

CPU = RewriteContext(target=TARGETS["cpu"])
FOLD = RulePass("FoldConvBatchNorm", conv_bn.RULES)
FUSE = RulePass("FuseConvBiasAct", conv_bias_act.RULES)


def conv_graph(bias_dims=(1, 6, 1, 1), act="relu", conv_bias=False, bias_first=False, groups=1):
    g = bz.Graph("conv")
    x = g.input("x", bz.Shape(("batch", 4, 7, 7)))
    w = g.param("w", bz.Shape((6, 4 // groups, 3, 3)))
    cb = g.param("cb", bz.Shape((6,))) if conv_bias else None
    y = g.conv2d(x, w, cb, stride=2, padding=1, groups=groups)
    if bias_dims is not None:
        b = g.param("b", bz.Shape(bias_dims))
        y = g.add(b, y) if bias_first else g.add(y, b)
    if act:
        y = g.activation(y, act)
    g.set_outputs([y])
    return g


def fused_node(g):
    (node,) = [n for n in g.nodes if n.op.kind == "fused_conv_bias_act"]
    return node


# -- FuseConvBiasAct -----------------------------------------------------------------------------
@pytest.mark.parametrize("bias_first", [False, True])
@pytest.mark.parametrize("bias_dims", [(1, 6, 1, 1), (6, 1, 1)])
@pytest.mark.parametrize("act", ["relu", "silu", None])
def test_conv_bias_act_fires(bias_dims, act, bias_first):
    g = conv_graph(bias_dims, act, bias_first=bias_first)
    res = FUSE.run(g, CPU)
    assert res.graph.count("fused_conv_bias_act") == 1
    assert res.graph.count("conv2d") == res.graph.count("add") == res.graph.count("relu") == 0
    node = fused_node(res.graph)
    assert (node.op.act.value if node.op.act else None) == act
    assert node.op.stride == (2, 2) and node.op.padding == (1, 1, 1, 1)
    assert_equivalent(g, res.graph)


def test_conv_with_its_own_bias_and_an_added_bias_sums_them():
    g = conv_graph((6, 1, 1), "gelu", conv_bias=True, groups=2)
    res = FUSE.run(g, CPU)
    assert fused_node(res.graph).op.groups == 2
    assert_equivalent(g, res.graph)


def test_conv_without_any_bias_gets_a_zero_bias():
    g = conv_graph(None, "relu")
    res = FUSE.run(g, CPU)
    assert res.graph.op_counts() == {"fused_conv_bias_act": 1}
    bias = res.graph.nodes[fused_node(res.graph).inputs[2].node]
    assert bias.op.kind == "constant" and not bias.op.value.any()
    assert_equivalent(g, res.graph)


def test_a_conv_with_its_own_bias_becomes_the_fused_kind_a_bare_conv_does_not():
    biased = conv_graph(None, None, conv_bias=True)
    res = FUSE.run(biased, CPU)
    assert res.graph.op_counts() == {"fused_conv_bias_act": 1}
    assert fused_node(res.graph).op.act is None
    assert_equivalent(biased, res.graph)
    assert not FUSE.run(conv_graph(None, None), CPU).changed


@pytest.mark.parametrize("bias_dims", [(4,), (1, 1, 4, 1), (1, 1, 1, 1)])
def test_bias_not_per_channel_is_a_shape_mismatch(bias_dims):
    g = conv_graph(bias_dims, "relu")
    res = FUSE.run(g, CPU)
    assert res.graph.count("fused_conv_bias_act") == 0
    assert {m.reason for m in res.misses} == {MissReason.SHAPE_MISMATCH}
    assert_equivalent(g, res.graph)


def test_unsupported_activation_stays_outside_with_a_miss():
    target = TARGETS["cpu"].with_options(epilogue_activations=frozenset({bz.UnaryFn.RELU}))
    g = conv_graph((6, 1, 1), "tanh")
    res = FUSE.run(g, RewriteContext(target=target))
    assert res.graph.count("fused_conv_bias_act") == 1 and res.graph.count("tanh") == 1
    assert fused_node(res.graph).op.act is None
    assert [m.reason for m in res.misses] == [MissReason.UNSUPPORTED_EPILOGUE_ACTIVATION]
    assert_equivalent(g, res.graph)


def test_target_without_the_claim_does_not_fuse():
    res = FUSE.run(conv_graph(), RewriteContext(target=TARGETS["reference"]))
    assert not res.changed
    assert {m.reason for m in res.misses} == {MissReason.UNSUPPORTED_BY_TARGET}


def test_conv_read_twice_does_not_fuse():
    g = bz.Graph("two_readers")
    x = g.input("x", bz.Shape((1, 4, 5, 5)))
    w = g.param("w", bz.Shape((6, 4, 3, 3)))
    b = g.param("b", bz.Shape((6, 1, 1)))
    y = g.conv2d(x, w)
    g.set_outputs([g.relu(g.add(y, b)), g.mul(y, y)])
    res = FUSE.run(g, CPU)
    assert res.graph.count("fused_conv_bias_act") == 0
    assert MissReason.MULTI_CONSUMER in {m.reason for m in res.misses}


def test_non_add_channel_bias_is_explained():
    g = bz.Graph("shifted")
    x = g.input("x", bz.Shape((1, 4, 5, 5)))
    w = g.param("w", bz.Shape((6, 4, 3, 3)))
    s = g.param("s", bz.Shape((1, 6, 1, 1)))
    g.set_outputs([g.sub(g.conv2d(x, w), s)])
    res = FUSE.run(g, CPU)
    assert not res.changed
    assert [m.reason for m in res.misses] == [MissReason.NON_ADD_BIAS_CONSUMER]
    assert "conv(x) + (-b)" in res.misses[0].hint


def test_conv_bias_act_unfuse_round_trip():
    g = conv_graph((1, 6, 1, 1), "relu", conv_bias=True)
    fused, _ = run_passes(g, [FUSE], CPU, verify=True, check_numerics=True)
    plain = unfuse_fused_for_autodiff(fused)
    assert plain.count("fused_conv_bias_act") == 0 and plain.count("conv2d") == 1
    assert_equivalent(g, plain)


# -- FoldConvBatchNorm ---------------------------------------------------------------------------
def conv_bn_graph(conv_bias=False, groups=1, stored=True, seed=0):
    g = bz.Graph("conv_bn")
    x = g.input("x", bz.Shape((2, 4, 6, 6)))
    w = g.param("conv.weight", bz.Shape((6, 4 // groups, 3, 3)))
    cb = g.param("conv.bias", bz.Shape((6,))) if conv_bias else None
    stats = [g.param(f"bn.{s}", bz.Shape((6,))) for s in ("gamma", "beta", "mean", "var")]
    g.set_outputs([g.batch_norm(g.conv2d(x, w, cb, padding=1, groups=groups), *stats,
                                eps=1e-3)])
    if stored:
        for name, value in bz.init_params(g, seed).items():
            g.set_weight(name, value)
    return g


@pytest.mark.parametrize("conv_bias", [False, True])
@pytest.mark.parametrize("groups", [1, 2])
def test_fold_with_stored_weights_computes_new_weights_once(conv_bias, groups):
    g = conv_bn_graph(conv_bias, groups)
    res = FOLD.run(g, CPU)
    assert res.graph.op_counts() == {"conv2d": 1}
    (conv,) = [n for n in res.graph.nodes if n.op.kind == "conv2d"]
    assert conv.op.has_bias and conv.op.groups == groups
    w2, b2 = (res.graph.weights[res.graph.nodes[v.node].op.name] for v in conv.inputs[1:])
    gw = g.weights
    scale = gw["bn.gamma"] / np.sqrt(gw["bn.var"] + 1e-3)
    cb = gw["conv.bias"] if conv_bias else 0.0
    np.testing.assert_allclose(w2, gw["conv.weight"] * scale[:, None, None, None], rtol=1e-6)
    np.testing.assert_allclose(b2, (cb - gw["bn.mean"]) * scale + gw["bn.beta"], rtol=1e-5,
                               atol=1e-7)
    assert w2.dtype == np.float32 and b2.dtype == np.float32
    assert_equivalent(g, res.graph, rtol=1e-4, atol=1e-5)


def test_fold_without_stored_weights_emits_the_arithmetic():
    g = conv_bn_graph(stored=False)
    res = FOLD.run(g, CPU)
    assert res.graph.count("batch_norm") == 0 and res.graph.count("conv2d") == 1
    assert res.graph.count("rsqrt") == 1 and not res.graph.weights
    assert_equivalent(g, res.graph, rtol=1e-4, atol=1e-5)


def test_fold_refuses_when_the_conv_output_is_read_elsewhere():
    g = bz.Graph("two_readers")
    x = g.input("x", bz.Shape((1, 4, 5, 5)))
    w = g.param("w", bz.Shape((6, 4, 3, 3)))
    stats = [g.param(f"bn.{s}", bz.Shape((6,))) for s in ("gamma", "beta", "mean", "var")]
    y = g.conv2d(x, w)
    g.set_outputs([g.batch_norm(y, *stats), y])
    res = FOLD.run(g, CPU)
    assert not res.changed
    assert [m.reason for m in res.misses] == [MissReason.GRAPH_OUTPUT]


def test_fold_needs_the_target_to_enable_it():
    res = FOLD.run(conv_bn_graph(), RewriteContext(target=TARGETS["onnxruntime"].with_options(
        fusions=frozenset({"fused_conv_bias_act"}))))
    assert not res.changed
    assert [m.reason for m in res.misses] == [MissReason.UNSUPPORTED_BY_TARGET]


# -- both, on a ResNet basic block ---------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, None])
def test_resnet_block_folds_then_fuses(seed):
    g = resnet_basic_block(channels=4, hw=6, seed=seed)
    assert g.count("batch_norm") == 2
    fused, results = run_passes(g, [FOLD, FUSE, MARK_ELEMENTWISE_REGIONS], CPU, verify=True)
    counts = fused.op_counts()
    assert counts["fused_conv_bias_act"] == 2
    assert "batch_norm" not in counts and "conv2d" not in counts and "relu" not in counts
    first, second = [n for n in fused.nodes if n.op.kind == "fused_conv_bias_act"]
    assert first.op.act is bz.UnaryFn.RELU and second.op.act is None
    (region,) = [n for n in fused.nodes
                 if n.op.kind == "elementwise_region" and n.outputs[0].rank == 4]
    assert [s.op.label for s in region.op.steps] == ["add", "relu"]  # + identity, then relu
    # the identity add after the second conv is a residual, not a bias: no near miss at all
    assert results[1].misses == []
    assert_equivalent(g, fused, rtol=1e-4, atol=1e-5)
    assert_equivalent(g, unfuse_fused_for_autodiff(fused), rtol=1e-4, atol=1e-5)


# -- report quality: a residual is no bias, and hints never give wrong advice ---------------------
def residual_conv_graph(act="relu"):
    g = bz.Graph("conv_residual")
    x = g.input("x", bz.Shape((2, 6, 5, 5)))
    w = g.param("w", bz.Shape((6, 6, 3, 3)))
    y = g.add(g.conv2d(x, w, padding=1), x)
    g.set_outputs([g.activation(y, act) if act else y])
    return g


@pytest.mark.parametrize("act", ["relu", None])
def test_a_residual_add_after_a_conv_is_not_a_bias_near_miss(act):
    g = residual_conv_graph(act)
    res = FUSE.run(g, CPU)
    assert res.misses == []
    assert res.graph.count("conv2d") == 1 and res.graph.count("add") == 1
    _, report = bz.fuse(g, "cpu")
    assert not [m for m in report.misses if m.pattern == "FuseConvBiasAct"]
    assert_equivalent(g, res.graph)


def test_resnet_block_report_has_no_bias_advice_for_its_residual():
    _, report = bz.fuse(resnet_basic_block(channels=4, hw=6), "cpu")
    assert report.fused_counts["fused_conv_bias_act"] == 2
    assert not any("bias" in m.hint for m in report.misses)


def test_a_vector_along_another_axis_is_not_told_to_become_a_channel_bias():
    g = conv_graph((4,), "relu")                       # 4 values along the width, 6 channels
    (miss,) = FUSE.run(g, CPU).misses
    assert miss.reason is MissReason.SHAPE_MISMATCH
    assert "[6, 1, 1]" not in miss.hint and "another axis" in miss.hint
    assert "(4,)" in miss.detail


def test_a_channel_sized_vector_in_the_wrong_layout_gets_the_layout_hint():
    g = bz.Graph("conv_w6")
    x = g.input("x", bz.Shape((1, 6, 3, 6)))           # width 6 == channels 6: [6] broadcasts
    w = g.param("w", bz.Shape((6, 6, 1, 1)))
    g.set_outputs([g.relu(g.add(g.conv2d(x, w), g.param("b", bz.Shape((6,)))))])
    (miss,) = FUSE.run(g, CPU).misses
    assert miss.reason is MissReason.SHAPE_MISMATCH
    assert "if it is meant as one value per output channel" in miss.hint
    assert "[6, 1, 1]" in miss.hint


@pytest.mark.parametrize("op", ["mul", "div"])
def test_a_per_channel_scale_is_not_told_to_become_an_add(op):
    g = bz.Graph("scaled")
    x = g.input("x", bz.Shape((1, 4, 5, 5)))
    w = g.param("w", bz.Shape((6, 4, 3, 3)))
    s = g.param("s", bz.Shape((1, 6, 1, 1)))
    g.set_outputs([getattr(g, op)(g.conv2d(x, w), s)])
    assert FUSE.run(g, CPU).misses == []
