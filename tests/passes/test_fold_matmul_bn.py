"""FoldMatMulBatchNorm: an inference batch norm after a linear layer (directly on a [N, C]
product, or after a reshape that flattens the token axes, as LeViT's Linear + BatchNorm1d
export) folds into the weight and bias, stored or computed at run time; then the bias fuses
into the matmul. A batch norm over another axis, or a non-2-D weight, does not fold and the
report says why. Numerics unchanged."""
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


def arr(*shape, positive=False):
    a = RNG.standard_normal(shape).astype(np.float32)
    return np.abs(a) + 0.5 if positive else a


def linear_bn(flatten: bool, bias: bool, stored: bool = True, c: int = 6):
    g = bz.Graph("linear_bn")
    x = g.input("x", bz.Shape(("batch", 5, 4)) if flatten else bz.Shape(("n", 4)))
    y = g.matmul(x, g.param("fc.weight", bz.Shape((4, c)), arr(4, c) if stored else None))
    if bias:
        y = g.add(y, g.param("fc.bias", bz.Shape((c,)), arr(c) if stored else None))
    if flatten:
        y = g.reshape(y, (-1, c))
    stats = [g.param(f"bn.{s}", bz.Shape((c,)), arr(c, positive=s == "var") if stored else None)
             for s in ("weight", "bias", "mean", "var")]
    y = g.batch_norm(y, *stats, eps=1e-3)
    if flatten:
        y = g.reshape(y, ("batch", 5, c))
    g.set_outputs([y])
    return g


def _params(g):
    return {n.op.name: arr(*n.outputs[0].dims, positive=n.op.name.endswith("var"))
            for n in g.params}


@pytest.mark.parametrize("flatten", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_batch_norm_after_a_linear_folds_into_its_weight_and_bias(flatten, bias):
    g = linear_bn(flatten, bias)
    res = FOLD.run(g, CPU)
    counts = res.graph.op_counts()
    assert "batch_norm" not in counts and counts["matmul"] == 1 and counts["add"] == 1
    assert g.count("batch_norm") == 1                            # the input is not mutated
    assert_equivalent(g, res.graph, symbols={"batch": 3, "n": 7}, rtol=1e-5, atol=1e-5)
    fused, _ = bz.fuse(g, "cpu")
    assert fused.count("batch_norm") == 0 and fused.count("fused_matmul_bias_act") == 1


def test_weights_computed_at_run_time_fold_as_graph_ops():
    g = linear_bn(flatten=True, bias=True, stored=False)
    res = FOLD.run(g, CPU)
    assert res.graph.count("batch_norm") == 0
    assert_equivalent(g, res.graph, symbols={"batch": 2}, params=_params(g), rtol=1e-5,
                      atol=1e-5)


def test_batch_norm_over_another_axis_does_not_fold_and_says_why():
    g = bz.Graph("bn_axis")
    x = g.input("x", bz.Shape((2, 6, 4)))
    y = g.matmul(x, g.param("w", bz.Shape((4, 4)), arr(4, 4)))      # [2, 6, 4]: axis 1 is 6
    stats = [g.param(f"bn.{s}", bz.Shape((6,)), arr(6, positive=s == "var"))
             for s in ("weight", "bias", "mean", "var")]
    g.set_outputs([g.batch_norm(y, *stats)])
    res = FOLD.run(g, CPU)
    assert not res.changed
    assert [m.reason for m in res.misses] == [MissReason.SHAPE_MISMATCH]
    assert "output axis" in res.misses[0].detail


@pytest.mark.parametrize("rule", ["bn", "scale"])
@pytest.mark.parametrize("stored", [True, False])
def test_a_single_value_bias_of_shape_1_folds_like_a_scalar(rule, stored):
    """x @ w + b with b [1] (an ONNX Add of a 1-element initializer) folds as b [] does; it
    was a SHAPE_MISMATCH whose hint offered no fix."""
    g = bz.Graph("bias_1")
    x = g.input("x", bz.Shape((5, 4)))
    y = g.matmul(x, g.param("w", bz.Shape((4, 6)), arr(4, 6) if stored else None))
    y = g.add(y, g.param("b", bz.Shape((1,)), arr(1) if stored else None))
    if rule == "bn":
        stats = [g.param(f"bn.{s}", bz.Shape((6,)), arr(6, positive=s == "var"))
                 for s in ("weight", "bias", "mean", "var")]
        y = g.batch_norm(y, *stats)
    else:
        y = g.mul(y, g.constant(arr(6)))
    g.set_outputs([y])
    res = FOLD.run(g, CPU)
    assert res.changed and not res.misses
    assert res.graph.count("batch_norm") == 0 and res.graph.count("matmul") == 1
    assert_equivalent(g, res.graph, rtol=1e-5, atol=1e-5)
