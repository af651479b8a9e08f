"""FoldConvAffine and the FoldConvBatchNorm extensions: a constant scale (and shift) after a conv
folds into its weights and bias, a batch norm folds through a bias add and into transposed
convs; non-constant or non-per-channel operands do not fold; numerics unchanged."""
import numpy as np
import pytest

import braze as bz
from braze.passes.base import RulePass, run_passes
from braze.passes.fusion import conv_bias_act, conv_bn
from braze.passes.targets import TARGETS
from braze.rewrite import MissReason, RewriteContext
from braze.testing import assert_equivalent

CPU = RewriteContext(target=TARGETS["cpu"])
FOLD = RulePass("FoldConvBatchNorm", conv_bn.RULES)
FUSE = RulePass("FuseConvBiasAct", conv_bias_act.RULES)
RNG = np.random.default_rng(0)


def arr(*shape, positive=False):
    a = RNG.standard_normal(shape).astype(np.float32)
    return np.abs(a) + 0.5 if positive else a


def conv(g, x, transpose=False, bias=True, groups=1, stored=True):
    """A conv2d (weight [6, 4/g, 3, 3]) or conv_transpose2d (weight [4, 6/g, 3, 3]) of x."""
    wshape = (4, 6 // groups, 3, 3) if transpose else (6, 4 // groups, 3, 3)
    w = g.param("conv.weight", bz.Shape(wshape), arr(*wshape) if stored else None)
    cb = g.param("conv.bias", bz.Shape((6,)), arr(6) if stored else None) if bias else None
    if transpose:
        return g.conv_transpose2d(x, w, cb, stride=2, padding=1, groups=groups)
    return g.conv2d(x, w, cb, padding=1, groups=groups)


def graph(build, transpose=False, **kw):
    g = bz.Graph("fold")
    x = g.input("x", bz.Shape((2, 4, 5, 5)))
    g.set_outputs([build(g, conv(g, x, transpose, **kw))])
    return g


def only_conv(g):
    (node,) = [n for n in g.nodes if n.op.kind in ("conv2d", "conv_transpose2d")]
    return node


# -- FoldConvAffine -----------------------------------------------------------------------------
SCALES = {"scalar": (), "one": (1,), "per_channel": (1, 6, 1, 1), "chw": (6, 1, 1)}


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("s_dims,t_dims", [("scalar", "scalar"), ("per_channel", "one"),
                                           ("chw", "per_channel"), ("one", None)])
def test_constant_scale_and_shift_fold_into_the_conv(transpose, bias, s_dims, t_dims):
    s = arr(*SCALES[s_dims])
    t = None if t_dims is None else arr(*SCALES[t_dims])

    def build(g, y):
        y = g.mul(g.constant(s), y)  # either operand order
        return y if t is None else g.add(y, g.constant(t))

    g = graph(build, transpose, bias=bias)
    res = FOLD.run(g, CPU)
    kind = "conv_transpose2d" if transpose else "conv2d"
    assert res.graph.op_counts() == {kind: 1}
    node = only_conv(res.graph)
    assert node.op.has_bias
    w2 = res.graph.weights[res.graph.node(node.inputs[1]).op.name]
    assert w2.dtype == np.float32 and res.graph.node(node.inputs[1]).op.name.startswith("conv")
    assert_equivalent(g, res.graph, rtol=1e-5, atol=1e-5)


def test_grouped_transposed_conv_scales_each_groups_output_channels():
    s = arr(1, 6, 1, 1)
    g = graph(lambda g, y: g.mul(y, g.constant(s)), transpose=True, groups=2)
    res = FOLD.run(g, CPU)
    assert res.graph.count("mul") == 0
    assert_equivalent(g, res.graph, rtol=1e-5, atol=1e-5)


def test_a_bias_alone_folds_into_a_transposed_conv_but_is_fuse_conv_bias_acts_for_conv2d():
    t = arr(1, 6, 1, 1)
    g = graph(lambda g, y: g.sigmoid(g.add(y, g.constant(t))), transpose=True, bias=False)
    res = FOLD.run(g, CPU)
    assert res.graph.op_counts() == {"conv_transpose2d": 1, "sigmoid": 1}
    assert only_conv(res.graph).op.has_bias
    assert_equivalent(g, res.graph, rtol=1e-5, atol=1e-5)
    assert not FOLD.run(graph(lambda g, y: g.add(y, g.constant(t))), CPU).changed


def test_weights_without_stored_values_fold_as_graph_ops():
    s, t = arr(1, 6, 1, 1), arr()
    g = graph(lambda g, y: g.add(g.mul(y, g.constant(s)), g.constant(t)), stored=False)
    res = FOLD.run(g, CPU)
    assert res.graph.count("conv2d") == 1 and res.graph.count("add") == 1  # on [6] vectors
    assert all(res.graph.shape_of(n.value).rank <= 4 and n.outputs[0].dims != (2, 6, 5, 5)
               for n in res.graph.nodes if n.op.kind in ("mul", "add"))
    params = bz.init_params(g, seed=3)
    assert_equivalent(g, res.graph, params=params, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("operand", ["input", "param_without_value", "spatial", "batch"])
def test_runtime_or_non_channel_operands_do_not_fold(operand):
    def build(g, y):
        if operand == "input":
            s = g.input("s", bz.Shape((1, 6, 1, 1)))
        elif operand == "param_without_value":
            s = g.param("s", bz.Shape((1, 6, 1, 1)))
        elif operand == "spatial":
            s = g.constant(arr(1, 1, 5, 5))
        else:
            s = g.constant(arr(2, 1, 1, 1))
        return g.mul(y, s)

    res = FOLD.run(graph(build), CPU)
    assert not res.changed and not res.misses


def test_scale_of_a_conv_read_elsewhere_does_not_fold_and_says_why():
    g = bz.Graph("two_readers")
    x = g.input("x", bz.Shape((1, 4, 5, 5)))
    y = conv(g, x)
    g.set_outputs([g.mul(y, g.constant(arr(1, 6, 1, 1))), g.relu(y)])
    res = FOLD.run(g, CPU)
    assert not res.changed
    assert [m.reason for m in res.misses] == [MissReason.MULTI_CONSUMER]


def test_fold_needs_the_target_to_enable_it():
    g = graph(lambda g, y: g.mul(y, g.constant(arr(1, 6, 1, 1))))
    ctx = RewriteContext(target=TARGETS["cpu"].with_options(fusions=frozenset()))
    res = FOLD.run(g, ctx)
    assert not res.changed
    assert [m.reason for m in res.misses] == [MissReason.UNSUPPORTED_BY_TARGET]


def test_learnable_affine_block_then_fuse_gives_one_node():
    """PP-OCRv4's conv -> * s + t -> hard-swish: one fused conv with a hard-swish epilogue."""
    def build(g, y):
        y = g.add(g.mul(y, g.constant(np.float32(1.3))), g.constant(np.float32(-0.2)))
        three, six = g.constant(np.float32(3.0)), g.constant(np.float32(6.0))
        return g.div(g.mul(y, g.clamp(g.add(y, three), 0.0, 6.0)), six)

    g = graph(build)
    fused, _ = run_passes(g, [FOLD, FUSE], CPU, verify=True)
    assert fused.op_counts() == {"fused_conv_bias_act": 1}
    assert only_fused(fused).op.act is bz.UnaryFn.HARD_SWISH
    assert_equivalent(g, fused, rtol=1e-5, atol=1e-5)


def only_fused(g):
    (node,) = [n for n in g.nodes if n.op.kind == "fused_conv_bias_act"]
    return node


# -- FoldConvBatchNorm through a bias add, and into transposed convs -----------------------------
def bn(g, y, stored=True):
    names = ("gamma", "beta", "mean", "var")
    vals = [arr(6), arr(6), arr(6), arr(6, positive=True)]
    stats = [g.param(f"bn.{n}", bz.Shape((6,)), v if stored else None)
             for n, v in zip(names, vals)]
    return g.batch_norm(y, *stats, eps=1e-3)


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("add_dims", [None, (1, 6, 1, 1), (6, 1, 1), (1,)])
@pytest.mark.parametrize("stored", [True, False])
def test_batch_norm_folds_through_a_bias_add(transpose, add_dims, stored):
    def build(g, y):
        if add_dims is not None:
            ab = g.param("ab", bz.Shape(add_dims), arr(*add_dims) if stored else None)
            y = g.add(y, ab)
        return bn(g, y, stored)

    g = graph(build, transpose, bias=True, stored=stored)
    res = FOLD.run(g, CPU)
    kind = "conv_transpose2d" if transpose else "conv2d"
    counts = res.graph.op_counts()
    assert counts[kind] == 1 and "batch_norm" not in counts
    if stored:
        assert counts == {kind: 1}
    params = None if stored else bz.init_params(g, seed=1)
    assert_equivalent(g, res.graph, params=params, rtol=1e-4, atol=1e-5)


def test_grouped_transposed_conv_batch_norm_fold():
    g = graph(lambda g, y: bn(g, y), transpose=True, groups=2, bias=False)
    res = FOLD.run(g, CPU)
    assert res.graph.op_counts() == {"conv_transpose2d": 1}
    assert_equivalent(g, res.graph, rtol=1e-4, atol=1e-5)


def test_bias_add_that_is_not_per_channel_blocks_the_fold_with_a_reason():
    g = graph(lambda g, y: bn(g, g.add(y, g.param("ab", bz.Shape((1, 6, 5, 5)),
                                                  arr(1, 6, 5, 5)))))
    res = FOLD.run(g, CPU)
    assert res.graph.count("batch_norm") == 1
    assert [m.reason for m in res.misses] == [MissReason.SHAPE_MISMATCH]
