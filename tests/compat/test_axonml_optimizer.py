"""FusionOptimizer on op-type sequences: every FusionConfig field changes what fuses, the presets
differ as documented, and the stats come from the bytes-moved model (checked by hand)."""
import numpy as np
import pytest

from braze.compat.axonml import (
    DEFAULT_SHAPE,
    FusionConfig,
    FusionOptimizer,
    FusionPattern,
    OpShapes,
    OpType,
    estimate_speedup,
    optimize_graph,
)

T, F = OpType, FusionPattern


def analyze(ops, **cfg):
    opt = FusionOptimizer.with_config(FusionConfig(**cfg))
    return [(d.pattern, d.start, d.end) for d in opt.analyze(ops)]


# -- each config field changes the outcome ----------------------------------------------------
def test_fuse_linear():
    ops = [T.MatMul, T.Add, T.Relu]
    assert analyze(ops) == [(F.MatMulBiasRelu, 0, 3)]
    assert analyze(ops, fuse_linear=False) == [(F.AddRelu, 1, 3)]


def test_fuse_elementwise():
    ops = [T.MatMul, T.Add, T.Relu, T.Exp, T.Log]
    assert analyze(ops) == [(F.MatMulBiasRelu, 0, 3), (F.ElementwiseChain, 3, 5)]
    assert analyze(ops, fuse_elementwise=False) == [(F.MatMulBiasRelu, 0, 3)]
    assert analyze([T.Add, T.Relu], fuse_elementwise=False) == []


def test_fuse_conv():
    ops = [T.Conv, T.BatchNorm, T.Relu]
    assert analyze(ops) == [(F.ConvBatchNormRelu, 0, 3)]
    assert analyze(ops, fuse_conv=False) == []


def test_min_elementwise_chain():
    assert analyze([T.Exp, T.Log]) == [(F.ElementwiseChain, 0, 2)]
    assert analyze([T.Exp, T.Log], min_elementwise_chain=3) == []
    assert analyze([T.Exp, T.Log, T.Neg], min_elementwise_chain=3) == [(F.ElementwiseChain, 0, 3)]


def test_aggressive_adds_reduction_patterns():
    ops = [T.Exp, T.Sum, T.Div, T.Mean, T.Sub, T.Sqrt, T.Div]
    assert analyze(ops) == [(F.ElementwiseChain, 4, 7)]   # sub, sqrt, div
    assert analyze(ops, aggressive=True) == [(F.Softmax, 0, 3), (F.LayerNorm, 3, 7)]


def test_min_chain_must_be_positive():
    with pytest.raises(ValueError, match="min_elementwise_chain"):
        FusionConfig(min_elementwise_chain=0)


def test_conservative_versus_all_enabled():
    ops = [T.Conv, T.BatchNorm, T.Relu, T.Exp, T.Sum, T.Div, T.Exp, T.Log,
           T.MatMul, T.Add, T.Gelu, T.Neg, T.Abs, T.Sqrt]
    everything = FusionOptimizer.with_config(FusionConfig.all_enabled()).analyze(ops)
    careful = FusionOptimizer.with_config(FusionConfig.conservative()).analyze(ops)
    assert [(d.pattern, d.start, d.end) for d in everything] == [
        (F.ConvBatchNormRelu, 0, 3), (F.Softmax, 3, 6), (F.ElementwiseChain, 6, 8),
        (F.MatMulBiasGelu, 8, 11), (F.ElementwiseChain, 11, 14)]
    # no conv folding, no softmax; div, exp, log form a 3-op chain instead
    assert [(d.pattern, d.start, d.end) for d in careful] == [
        (F.ElementwiseChain, 5, 8), (F.MatMulBiasGelu, 8, 11), (F.ElementwiseChain, 11, 14)]
    assert FusionOptimizer().config == FusionConfig.all_enabled()


# -- stats from the bytes-moved model ----------------------------------------------------------
def test_stats_for_a_linear_layer_match_hand_counted_bytes():
    ops = [T.MatMul, T.Add, T.Relu]
    shapes = [OpShapes(((2, 3), (3, 4)), (2, 4)),   # x [2,3] @ w [3,4]
              OpShapes((-1, (4,)), (2, 4)),          # + bias [4]
              OpShapes((-1,), (2, 4))]               # relu
    patterns, stats = FusionOptimizer().optimize(ops, shapes)
    # unfused: matmul reads 24 + 48, writes 32; add reads 32 + 16, writes 32; relu 32 + 32
    unfused = (24 + 48 + 32) + (32 + 16 + 32) + (32 + 32)
    # fused: reads x, w, bias once, writes only the final [2,4]
    fused = 24 + 48 + 16 + 32
    assert (stats.bytes_unfused, stats.bytes_fused) == (unfused, fused) == (248, 120)
    assert stats.fusions_applied == 1 and stats.ops_eliminated == 2
    assert stats.estimated_speedup == pytest.approx(248 / 120)
    assert estimate_speedup(ops, patterns, shapes) == pytest.approx(248 / 120)


def test_plain_shape_means_every_tensor_has_that_shape():
    # add reads two [2,4] tensors and writes one (96 B); relu reads and writes one (64 B)
    _, stats = optimize_graph([T.Add, T.Relu], shapes=[(2, 4), (2, 4)])
    assert (stats.bytes_unfused, stats.bytes_fused) == (96 + 64, 64 + 32)
    assert stats.estimated_speedup == pytest.approx(160 / 96)


def test_default_size_is_documented_shape_in_f32():
    mb = int(np.prod(DEFAULT_SHAPE)) * 4
    _, stats = optimize_graph([T.Add, T.Relu])
    assert (stats.bytes_unfused, stats.bytes_fused) == (5 * mb, 3 * mb)
    _, f64 = FusionOptimizer().optimize([T.Add, T.Relu], itemsize=8)
    assert f64.bytes_unfused == 2 * stats.bytes_unfused


def test_member_output_read_after_the_group_is_still_written():
    # exp -> log fused, but the matmul after them reads both outputs
    ops = [T.Exp, T.Log, T.MatMul]
    shapes = [OpShapes(((2, 2),), (2, 2)), OpShapes((-1,), (2, 2)),
              OpShapes((-1, -2), (2, 2))]
    _, stats = optimize_graph(ops, shapes=shapes)
    assert stats.bytes_unfused == 32 + 32 + 48
    assert stats.bytes_fused == (16 + 16 + 16) + 48   # group writes log AND exp outputs


def test_no_fusion_means_speedup_one():
    _, stats = optimize_graph([T.MatMul, T.Softmax], shapes=[(4, 4), (4, 4)])
    assert stats == type(stats)(0, 0, 1.0, stats.bytes_unfused, stats.bytes_unfused)


def test_bad_shapes_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="one per op"):
        optimize_graph([T.Add, T.Relu], shapes=[(2, 4)])
    with pytest.raises(ValueError, match="not an earlier op"):
        optimize_graph([T.Relu], shapes=[OpShapes((-1,), (2,))])


@pytest.mark.parametrize("spans", [[(0, 5)], [(2, 1)], [(0, 2), (1, 3)]])
def test_estimate_speedup_refuses_groups_outside_or_overlapping(spans):
    from braze.compat.axonml import Detected, FusionPattern, OpType, estimate_speedup
    pats = [Detected(FusionPattern.AddRelu, a, b) for a, b in spans]
    with pytest.raises(ValueError, match="does not fit|overlaps"):
        estimate_speedup([OpType.Add, OpType.Relu, OpType.Add], patterns=pats)
