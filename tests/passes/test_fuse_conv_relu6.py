"""FuseConvBiasAct with ReLU6 written as clip(conv + b, 0, 6) (MobileNet v1 / v2's ONNX Clip):
fires as UnaryFn.RELU6, must-not-fire with the reason (other bounds, a target without the
epilogue, a pre-activation read elsewhere), numerics through the interpreter and the compiled
kernels (1x1, depthwise, dense), unfuse round trip, gradient, ONNX export run by ORT."""
import numpy as np
import pytest

import braze as bz
from braze.passes.base import RulePass, run_passes
from braze.passes.fusion import conv_bias_act
from braze.passes.targets import TARGETS
from braze.passes.unfuse import unfuse_fused_for_autodiff
from braze.rewrite import MissReason, RewriteContext
from braze.testing import assert_equivalent

CPU = RewriteContext(target=TARGETS["cpu"])
FUSE = RulePass("FuseConvBiasAct", conv_bias_act.RULES)


def conv_graph(lo=0.0, hi=6.0, kernel=3, groups=1, channels=8, extra_reader=False,
               added_bias=True, loss=False):
    rng = np.random.default_rng(0)
    g = bz.Graph("conv_relu6")
    x = g.input("x", bz.Shape(("batch", channels, 10, 9)))
    w = g.param("w", bz.Shape((channels, channels // groups, kernel, kernel)),
                (rng.standard_normal((channels, channels // groups, kernel, kernel)) * 2)
                .astype(np.float32))
    y = g.conv2d(x, w, padding=kernel // 2, groups=groups)
    if added_bias:
        y = g.add(y, g.param("b", bz.Shape((1, channels, 1, 1)),
                             rng.standard_normal((1, channels, 1, 1)).astype(np.float32)))
    out = g.clamp(y, lo, hi)
    g.set_outputs([g.sum(g.mul(out, out)) if loss else out] + ([g.neg(y)] if extra_reader else []))
    return g


def fused_node(g):
    (node,) = [n for n in g.nodes if n.op.kind == "fused_conv_bias_act"]
    return node


@pytest.mark.parametrize("added_bias", [True, False])
def test_clip_0_6_joins_the_conv_as_relu6(added_bias):
    g = conv_graph(added_bias=added_bias)
    res = FUSE.run(g, CPU)
    counts = res.graph.op_counts()
    assert counts.pop("fused_conv_bias_act") == 1 and "clamp" not in counts
    assert fused_node(res.graph).op.act is bz.UnaryFn.RELU6
    assert_equivalent(g, res.graph, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lo, hi", [(0.0, 5.0), (-1.0, 6.0), (0.0, 1.0)])
def test_other_bounds_stay_a_clamp_after_the_fused_conv(lo, hi):
    g = conv_graph(lo, hi)
    res = FUSE.run(g, CPU)
    assert fused_node(res.graph).op.act is None and res.graph.count("clamp") == 1
    assert_equivalent(g, res.graph, rtol=1e-5, atol=1e-5)


def test_a_target_without_the_relu6_epilogue_keeps_the_clip_with_a_miss():
    g = conv_graph()
    res = FUSE.run(g, RewriteContext(target=TARGETS["onnxruntime"]))
    assert fused_node(res.graph).op.act is None and res.graph.count("clamp") == 1
    assert [m.reason for m in res.misses] == [MissReason.UNSUPPORTED_EPILOGUE_ACTIVATION]
    assert "relu6" in res.misses[0].detail
    assert_equivalent(g, res.graph, rtol=1e-5, atol=1e-5)


def test_a_pre_activation_read_elsewhere_keeps_the_clip_outside():
    g = conv_graph(extra_reader=True)
    res = FUSE.run(g, CPU)
    assert fused_node(res.graph).op.act is None and res.graph.count("clamp") == 1
    assert_equivalent(g, res.graph, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel, groups", [(1, 1), (3, 8), (3, 1), (5, 8)])
def test_compiled_relu6_epilogues_match_the_interpreter(kernel, groups):
    g = conv_graph(kernel=kernel, groups=groups)
    fused, _ = bz.fuse(g, "cpu")
    assert fused_node(fused).op.act is bz.UnaryFn.RELU6
    exe = bz.compile(g)
    exe(bz.random_feeds(g, 0, symbols={"batch": 1}))
    (_, _, _, how), = [r for r in exe.dispatch_report().rows if r[1] == "fused_conv_bias_act"]
    assert "relu6" in how
    for batch in (1, 3):
        feeds = bz.random_feeds(g, batch, symbols={"batch": batch})
        want = bz.interpret(g, feeds)[0]
        assert (want == 0).any() and (want == 6).any()  # both bounds reached
        np.testing.assert_allclose(exe(feeds)[0], want, rtol=1e-5, atol=1e-4)


def test_relu6_in_a_region_and_at_half_precision_matches_the_reference():
    for dt in (bz.f32, bz.f16, bz.bf16):
        g = bz.Graph("relu6_region")
        x = g.input("x", bz.Shape((64, 33), dt))
        g.set_outputs([g.mul(g.activation(g.add(x, x), "relu6"), x)])
        feeds = {"x": (np.linspace(-8, 8, 64 * 33).reshape(64, 33)).astype(dt.np)}
        np.testing.assert_array_equal(bz.compile(g)(feeds)[0], bz.interpret(g, feeds)[0])


def test_relu6_unfuse_round_trip_and_gradient():
    g = conv_graph(loss=True)
    fused, _ = run_passes(g, [FUSE], CPU, verify=True, check_numerics=True)
    assert fused_node(fused).op.act is bz.UnaryFn.RELU6
    plain = unfuse_fused_for_autodiff(fused)
    assert plain.count("fused_conv_bias_act") == 0 and plain.count("relu6") == 1
    assert_equivalent(g, plain, rtol=1e-5, atol=1e-5)
    feeds = bz.random_feeds(g, 1, symbols={"batch": 2})
    grads = [bz.interpret(bz.grad_with_loss(graph, ["w"]), feeds)[1] for graph in (g, plain)]
    assert np.abs(grads[0]).max() > 0
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("target", ["standard", "onnxruntime"])
def test_the_fused_relu6_exports_and_onnx_runtime_runs_it(target, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    g = conv_graph()
    fused, _ = bz.fuse(g, "cpu")
    path = tmp_path / "relu6.onnx"
    bz.export_onnx(fused, path, target=target)
    feeds = bz.random_feeds(g, 1, symbols={"batch": 2})
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, feeds)[0], bz.interpret(g, feeds)[0],
                               rtol=1e-5, atol=1e-4)
