"""FusionOptimizer.optimize_braze: braze's own passes fuse a small MLP graph as the config says,
the numbers stay the same, and the stats are the bytes moved by the graphs before and after."""
import pytest

import braze as bz
from braze.compat.axonml import FusionConfig, FusionOptimizer
from braze.passes.limits import FusionLimits
from braze.passes.targets import TARGETS
from braze.testing import assert_equivalent


def mlp(batch=4):
    g = bz.Graph("mlp")
    x = g.input("x", bz.Shape((batch, 8)))
    w = g.param("w", bz.Shape((8, 16)))
    b = g.param("b", bz.Shape((16,)))
    y = g.relu(g.add(g.mm(x, w), b))
    g.set_outputs([g.tanh(g.add(g.mul(y, 2.0), 1.0))])
    return g


def run(cfg=None, g=None, **kw):
    g = g or mlp()
    out, stats = FusionOptimizer(cfg).optimize_braze(g, **kw)
    assert_equivalent(g, out)
    return out, stats


def test_linear_epilogue_and_elementwise_region_with_hand_counted_bytes():
    g = mlp()
    before = str(g)
    out, stats = run(g=g)
    assert str(g) == before                                  # input graph untouched
    assert out.op_counts() == {"fused_matmul_bias_act": 1, "elementwise_region": 1}
    (region,) = [n for n in out.nodes if n.op.kind == "elementwise_region"]
    assert [s.op.label for s in region.op.steps] == ["mul", "add", "tanh"]
    # f32 bytes: x 128, w 512, b 64, every [4,16] activation 256, scalar constants 4
    unfused = ((128 + 512 + 256)          # matmul
               + (256 + 64 + 256)         # + b
               + (256 + 256)              # relu
               + (256 + 4 + 256) * 2      # * 2, + 1
               + (256 + 256))             # tanh
    fused = (128 + 512 + 64 + 256) + (256 + 256)   # constants live inside the region body
    assert (stats.bytes_unfused, stats.bytes_fused) == (unfused, fused) == (3528, 1472)
    assert stats.estimated_speedup == pytest.approx(3528 / 1472)
    assert (stats.fusions_applied, stats.ops_eliminated) == (2, 4)


def test_fuse_linear_off_leaves_the_matmul_and_regions_the_rest():
    out, stats = run(FusionConfig(fuse_linear=False))
    assert out.op_counts() == {"matmul": 1, "elementwise_region": 1}
    (region,) = [n for n in out.nodes if n.op.kind == "elementwise_region"]
    assert [s.op.label for s in region.op.steps] == ["add", "relu", "mul", "add", "tanh"]
    assert stats.fusions_applied == 1


def test_fuse_elementwise_off_keeps_the_tail_as_plain_ops():
    out, stats = run(FusionConfig(fuse_elementwise=False))
    assert out.op_counts() == {"fused_matmul_bias_act": 1, "mul": 1, "add": 1, "tanh": 1}
    assert (stats.fusions_applied, stats.ops_eliminated) == (1, 2)
    assert stats.bytes_fused == 960 + 516 + 516 + 512


def test_regions_shorter_than_min_chain_are_inlined_back():
    out, _ = run(FusionConfig(min_elementwise_chain=4))
    assert out.op_counts() == {"fused_matmul_bias_act": 1, "mul": 1, "add": 1, "tanh": 1}
    out, _ = run(FusionConfig(min_elementwise_chain=3))
    assert out.count("elementwise_region") == 1


def test_aggressive_keeps_regions_past_the_target_limits():
    tiny = TARGETS["cpu"].with_options(limits=FusionLimits(max_steps=2))
    out, _ = run(FusionConfig(), target=tiny)
    regions = [n.op for n in out.nodes if n.op.kind == "elementwise_region"]
    assert [len(r.steps) for r in regions] == [2] and out.count("tanh") == 1
    out, _ = run(FusionConfig(aggressive=True), target=tiny)
    regions = [n.op for n in out.nodes if n.op.kind == "elementwise_region"]
    assert [len(r.steps) for r in regions] == [3]


def test_symbolic_dims_need_sizes_for_the_cost_model():
    g = mlp("batch")
    out, stats = FusionOptimizer().optimize_braze(g, symbols={"batch": 4})
    assert (stats.bytes_unfused, stats.bytes_fused) == (3528, 1472)
    assert_equivalent(g, out, symbols={"batch": 5})
    with pytest.raises(bz.GraphError, match="symbolic dim 'batch'"):
        FusionOptimizer().optimize_braze(g)


def test_fuse_conv_folds_conv_bias_relu():
    g = bz.Graph("conv")
    x = g.input("x", bz.Shape((1, 2, 5, 5)))
    w = g.param("w", bz.Shape((3, 2, 3, 3)))
    b = g.param("b", bz.Shape((3,)))
    g.set_outputs([g.relu(g.conv2d(x, w, b))])
    out, stats = run(g=g)
    assert out.op_counts() == {"fused_conv_bias_act": 1}
    assert stats.fusions_applied == 1
    out, _ = run(FusionConfig(fuse_conv=False), g=g)
    assert out.op_counts() == {"conv2d": 1, "relu": 1}
