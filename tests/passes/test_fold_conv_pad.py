"""FoldConvPad: a zero pad of the spatial axes before a conv2d (TF-style "same" padding as its
own node) folds into the conv's padding; other fills, modes and axes stay with the reason;
numerics unchanged through the fold, the whole cpu pipeline and unfuse."""
import numpy as np
import pytest

import braze as bz
from braze.passes.base import RulePass
from braze.passes.fusion import conv_pad
from braze.passes.targets import TARGETS
from braze.passes.unfuse import unfuse_fused_for_autodiff
from braze.rewrite import MissReason, RewriteContext
from braze.testing import assert_equivalent

CPU = RewriteContext(target=TARGETS["cpu"])
FOLD = RulePass("FoldConvPad", conv_pad.RULES)


def graph(pads, value=0.0, mode="constant", conv_padding=0, stride=1, groups=1, bias=True,
          extra_reader=False):
    rng = np.random.default_rng(0)
    g = bz.Graph("pad_conv")
    x = g.input("x", bz.Shape((2, 4, 9, 8)))
    w = g.param("w", bz.Shape((8, 4 // groups, 3, 3)),
                rng.standard_normal((8, 4 // groups, 3, 3)).astype(np.float32))
    b = g.param("b", bz.Shape((8,)), rng.standard_normal(8).astype(np.float32)) if bias else None
    p = g.pad(x, pads, value, mode)
    y = g.conv2d(p, w, b, stride=stride, padding=conv_padding, groups=groups)
    g.set_outputs([g.relu(y)] + ([p] if extra_reader else []))
    return g


@pytest.mark.parametrize("pads, conv_padding, stride, groups, bias", [
    (((0, 0), (0, 0), (0, 1), (0, 1)), 0, 2, 1, True),    # TF "same", stride 2: bottom / right
    (((0, 0), (0, 0), (1, 1), (1, 1)), 0, 1, 4, False),   # depthwise, symmetric
    (((0, 0), (0, 0), (2, 0), (0, 3)), (1, 1, 1, 1), 1, 1, True),  # added to the conv's own
])
def test_a_zero_spatial_pad_folds_into_the_conv(pads, conv_padding, stride, groups, bias):
    g = graph(pads, conv_padding=conv_padding, stride=stride, groups=groups, bias=bias)
    res = FOLD.run(g, CPU)
    assert res.graph.count("pad") == 0 and res.graph.count("conv2d") == 1
    (conv,) = [n for n in res.graph.nodes if n.op.kind == "conv2d"]
    own = (conv_padding,) * 4 if isinstance(conv_padding, int) else conv_padding
    (top, bottom), (left, right) = pads[2:]
    assert conv.op.padding == (own[0] + top, own[1] + left, own[2] + bottom, own[3] + right)
    assert_equivalent(g, res.graph, rtol=1e-5, atol=1e-5)


def test_the_cpu_pipeline_folds_then_fuses_and_unfuse_round_trips():
    g = graph(((0, 0), (0, 0), (0, 1), (0, 1)), stride=2)
    fused, report = bz.fuse(g, "cpu")
    assert fused.op_counts() == {"fused_conv_bias_act": 1}
    assert report.rule_stats["FoldConvPad"].matches == 1
    feeds = bz.random_feeds(g, 3)
    want = bz.interpret(g, feeds)[0]
    np.testing.assert_allclose(bz.interpret(fused, feeds)[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(bz.compile(g)(feeds)[0], want, rtol=1e-4, atol=1e-5)
    back = unfuse_fused_for_autodiff(fused)
    assert back.count("fused_conv_bias_act") == 0 and back.count("conv2d") == 1
    np.testing.assert_allclose(bz.interpret(back, feeds)[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw, reason, detail", [
    (dict(value=1.0), MissReason.PATTERN_MISMATCH, "fills with the value 1.0"),
    (dict(mode="reflect"), MissReason.PATTERN_MISMATCH, "fills with reflect"),
    (dict(mode="edge"), MissReason.PATTERN_MISMATCH, "fills with edge"),
])
def test_a_pad_that_is_not_zeros_stays_with_the_reason(kw, reason, detail):
    g = graph(((0, 0), (0, 0), (1, 1), (1, 1)), **kw)
    res = FOLD.run(g, CPU)
    assert res.graph.count("pad") == 1
    assert [m.reason for m in res.misses] == [reason]
    assert detail in res.misses[0].detail
    assert_equivalent(g, res.graph)


def test_a_pad_of_the_channel_axis_stays_with_the_reason():
    g = bz.Graph("pad_c")
    x = g.input("x", bz.Shape((2, 3, 6, 6)))
    w = g.param("w", bz.Shape((5, 4, 3, 3)), np.ones((5, 4, 3, 3), np.float32))
    g.set_outputs([g.conv2d(g.pad(x, ((0, 0), (0, 1), (1, 1), (1, 1))), w)])
    res = FOLD.run(g, CPU)
    assert res.graph.count("pad") == 1
    assert [m.reason for m in res.misses] == [MissReason.AXIS_MISMATCH]
    assert "batch or channel axis" in res.misses[0].detail


def test_a_pad_that_is_also_a_graph_output_is_not_folded_away():
    g = graph(((0, 0), (0, 0), (0, 1), (0, 1)), extra_reader=True)
    res = FOLD.run(g, CPU)
    assert res.graph.count("pad") == 1 and not res.changed
    assert [m.reason for m in res.misses] == [MissReason.GRAPH_OUTPUT]
