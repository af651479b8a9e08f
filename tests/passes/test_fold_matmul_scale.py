"""FoldMatMulScale: a per-column scale after a linear layer (ConvNeXt's / DINOv2's LayerScale)
folds into the weight and bias, stored or computed at run time (a scale param fed at compile
time by graph ops); a scale that varies along another axis stays with the reason; numerics
unchanged through the fold and the cpu pipeline (where the bias then fuses into the matmul)."""
import numpy as np
import pytest

import braze as bz
from braze.passes.base import RulePass
from braze.passes.fusion import matmul_bn
from braze.passes.targets import TARGETS
from braze.rewrite import MissReason, RewriteContext
from braze.testing import assert_equivalent

CPU = RewriteContext(target=TARGETS["cpu"])
FOLD = RulePass("FoldConvBatchNorm", matmul_bn.RULES)
RNG = np.random.default_rng(0)


def layer_scale(scale_dims=(6,), bias=True, stored=True, scale_known=True, scale_first=True):
    g = bz.Graph("layer_scale")
    x = g.input("x", bz.Shape(("batch", 5, 4)))
    w = g.param("fc.weight", bz.Shape((4, 6)),
                RNG.standard_normal((4, 6)).astype(np.float32) if stored else None)
    y = g.matmul(x, w)
    if bias:
        y = g.add(y, g.param("fc.bias", bz.Shape((6,)),
                             RNG.standard_normal(6).astype(np.float32) if stored else None))
    s = g.param("gamma", bz.Shape(scale_dims),
                RNG.standard_normal(scale_dims).astype(np.float32) if scale_known else None)
    g.set_outputs([g.mul(s, y) if scale_first else g.mul(y, s)])
    return g


@pytest.mark.parametrize("scale_dims", [(6,), (1, 1, 6), (), (1,)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("scale_first", [True, False])
def test_a_known_column_scale_folds_into_the_linear_layer(scale_dims, bias, scale_first):
    g = layer_scale(scale_dims, bias, scale_first=scale_first)
    res = FOLD.run(g, CPU)
    assert res.graph.count("mul") == 0 and res.graph.count("matmul") == 1
    assert res.graph.count("add") == int(bias)
    assert_equivalent(g, res.graph, rtol=1e-5, atol=1e-5)


def test_weights_without_stored_values_are_scaled_by_graph_ops():
    g = layer_scale(stored=False)
    res = FOLD.run(g, CPU)
    (mm,) = [n for n in res.graph.nodes if n.op.kind == "matmul"]
    assert res.graph.node(mm.inputs[1]).op.fn.value == "mul"  # w * s, weight preparation
    params = bz.init_params(g, 1)
    feeds = bz.random_feeds(g, 2)
    np.testing.assert_allclose(bz.interpret(res.graph, feeds, params)[0],
                               bz.interpret(g, feeds, params)[0], rtol=1e-5, atol=1e-5)


def test_the_cpu_pipeline_folds_then_fuses_the_bias():
    g = layer_scale()
    fused, report = bz.fuse(g, "cpu")
    assert fused.op_counts() == {"fused_matmul_bias_act": 1}
    assert report.rule_stats["FoldMatMulScale"].matches == 1
    feeds = bz.random_feeds(g, 3)
    np.testing.assert_allclose(bz.compile(g)(feeds)[0], bz.interpret(g, feeds)[0],
                               rtol=1e-5, atol=1e-5)


def test_a_scale_along_another_axis_stays_with_the_reason():
    g = layer_scale((5, 1))
    res = FOLD.run(g, CPU)
    assert res.graph.count("mul") == 1
    assert [m.reason for m in res.misses] == [MissReason.SHAPE_MISMATCH]
    assert "other than the output columns" in res.misses[0].detail
    assert_equivalent(g, res.graph, rtol=1e-5, atol=1e-5)


def test_a_scale_that_adds_axes_stays_with_the_reason():
    g = layer_scale((1, 1, 1, 6))
    res = FOLD.run(g, CPU)
    assert res.graph.count("mul") == 1
    assert [m.reason for m in res.misses] == [MissReason.SHAPE_MISMATCH]
    assert "more axes" in res.misses[0].detail


@pytest.mark.parametrize("scale_dims", [(6,), (1, 1, 6), (), (1,)])
@pytest.mark.parametrize("stored", [True, False])
def test_a_scale_param_without_a_value_folds_by_graph_ops(scale_dims, stored):
    """A scale param fed at compile time folds as FoldMatMulBatchNorm's unstored stats do: w * s
    and cb * s are ops on weights alone (weight preparation); it had been skipped silently."""
    g = layer_scale(scale_dims, stored=stored, scale_known=False)
    res = FOLD.run(g, CPU)
    assert res.changed and not res.misses
    (mm,) = [n for n in res.graph.nodes if n.op.kind == "matmul"]
    assert res.graph.node(mm.inputs[1]).op.fn.value == "mul"  # w * s
    assert res.graph.node(res.graph.outputs[0]).op.fn.value == "add"  # x @ w' + cb * s
    params = bz.init_params(g, 4)
    for seed in (5, 6):
        feeds = bz.random_feeds(g, seed)
        np.testing.assert_allclose(bz.interpret(res.graph, feeds, params)[0],
                                   bz.interpret(g, feeds, params)[0], rtol=1e-5, atol=1e-5)
    fused, _ = bz.fuse(g, "cpu")
    assert fused.count("fused_matmul_bias_act") == 1
    feeds = bz.random_feeds(g, 7)
    np.testing.assert_allclose(bz.compile(g, params=params)(feeds)[0],
                               bz.interpret(g, feeds, params)[0], rtol=1e-5, atol=1e-5)


def test_a_scale_computed_from_an_input_is_no_fold():
    g = bz.Graph("input_scale")
    x = g.input("x", bz.Shape((5, 4)))
    s = g.exp(g.input("s", bz.Shape((6,))))
    g.set_outputs([g.mul(g.matmul(x, g.param("w", bz.Shape((4, 6)))), s)])
    res = FOLD.run(g, CPU)
    assert not res.changed and not res.misses


def test_a_product_with_an_activation_keeps_its_scale_with_the_reason():
    g = bz.Graph("act_product")
    x = g.input("x", bz.Shape((5, 4)))
    y = g.input("y", bz.Shape((4, 6)))
    s = g.param("gamma", bz.Shape((6,)), RNG.standard_normal(6).astype(np.float32))
    g.set_outputs([g.mul(g.matmul(x, y), s)])
    res = FOLD.run(g, CPU)
    assert res.graph.count("mul") == 1 and not res.changed
    assert [m.reason for m in res.misses] == [MissReason.WEIGHT_NOT_CONSTANT]
    assert "graph's inputs" in res.misses[0].detail


def test_a_weight_fed_as_input_gets_a_hint_that_makes_it_fold():
    """The miss's hint is about this fold (not shared-input fusion's concatenation), and
    following it - the weight declared as a param - folds the scale."""
    def build(as_param):
        g = bz.Graph("w_input")
        x = g.input("x", bz.Shape((5, 4)))
        w = g.param("w", bz.Shape((4, 6))) if as_param else g.input("w", bz.Shape((4, 6)))
        s = g.constant(RNG.standard_normal(6).astype(np.float32))
        g.set_outputs([g.mul(g.matmul(x, w), s)])
        return g

    res = FOLD.run(build(False), CPU)
    (miss,) = res.misses
    assert miss.reason is MissReason.WEIGHT_NOT_CONSTANT
    assert "shared-input" not in miss.hint and "g.param" in miss.hint
    g = build(True)
    res = FOLD.run(g, CPU)
    assert res.changed and res.graph.count("mul") == 1 and not res.misses  # w * s, hoisted
    assert_equivalent(g, res.graph)
