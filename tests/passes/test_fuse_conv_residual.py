"""FuseConvResidual: act(fused_conv_bias_act(x, w, b) + r) becomes one FusedConvBiasAct with a
residual input (a ResNet block's shortcut add and ReLU in its last conv's epilogue). Fires on
builder graphs and the ResNet block, refuses with a reason (broadcast residual, the conv's
output read elsewhere or returned, an activation the target lacks), keeps the numbers, unfuses
back, compiles and exports (ONNX Runtime's FusedConv with its Z input, plain ONNX)."""
import numpy as np
import onnxruntime as ort
import pytest

import braze as bz
from braze.export.onnx import to_onnx_model
from braze.models.resnet import resnet_basic_block
from braze.passes.base import RulePass, run_passes
from braze.passes.fusion import conv_bias_act, conv_residual
from braze.passes.targets import TARGETS
from braze.passes.unfuse import unfuse_fused_for_autodiff
from braze.rewrite import MissReason, RewriteContext
from braze.testing import assert_equivalent

CPU = RewriteContext(target=TARGETS["cpu"])
FUSE = [RulePass("FuseConvBiasAct", conv_bias_act.RULES),
        RulePass("FuseConvResidual", conv_residual.RULES)]


def residual_graph(act="relu", residual_dims=None, extra_reader=None, stride=1):
    """act(conv(x, w) + b + r): r has the conv output's dims unless `residual_dims` says."""
    g = bz.Graph("conv_residual")
    x = g.input("x", bz.Shape(("batch", 6, 8, 8)))
    w = g.param("w", bz.Shape((6, 6, 3, 3)))
    b = g.param("b", bz.Shape((6, 1, 1)))
    out_hw = 8 // stride
    r = g.input("r", bz.Shape(residual_dims or ("batch", 6, out_hw, out_hw)))
    y = g.add(g.conv2d(x, w, padding=1, stride=stride), b)
    s = g.add(y, r)
    outs = [g.activation(s, act) if act else s]
    if extra_reader == "output":
        outs.append(y)
    elif extra_reader == "mul":
        outs.append(g.mul(y, y))
    g.set_outputs(outs)
    return g


def fuse(g, ctx=CPU):
    out, results = run_passes(g, FUSE, ctx, verify=True)
    return out, [m for r in results for m in r.misses]


def fused_nodes(g):
    return [n for n in g.nodes if n.op.kind == "fused_conv_bias_act"]


@pytest.mark.parametrize("act", ["relu", "silu", None])
@pytest.mark.parametrize("stride", [1, 2])
def test_residual_add_and_activation_join_the_conv(act, stride):
    g = residual_graph(act, stride=stride)
    fused, misses = fuse(g)
    counts = fused.op_counts()
    assert counts.pop("fused_conv_bias_act") == 1
    assert counts == {"reshape": 1}  # the [6, 1, 1] bias as a [6] vector (weight preparation)
    (node,) = fused_nodes(fused)
    assert node.op.residual and (node.op.act.value if node.op.act else None) == act
    assert [fused.nodes[v.node].op.kind for v in node.inputs[::3]] == ["input", "input"]
    assert misses == []
    for sym in ({"batch": 1}, {"batch": 3}):
        assert_equivalent(g, fused, symbols=sym, seeds=(5, 6))


def test_a_conv_without_any_bias_fuses_with_a_zero_bias():
    """relu(conv2d(x, w) + r): FuseConvBiasAct leaves a bias-less conv with no activation
    after it alone; the residual rule takes it."""
    g = bz.Graph("no_bias")
    x = g.input("x", bz.Shape((2, 4, 6, 6)))
    r = g.input("r", bz.Shape((2, 8, 6, 6)))
    y = g.conv2d(x, g.param("w", bz.Shape((8, 4, 3, 3))), padding=1)
    g.set_outputs([g.relu(g.add(r, y))])
    fused, misses = fuse(g)
    assert fused.op_counts() == {"fused_conv_bias_act": 1}
    (node,) = fused_nodes(fused)
    assert node.op.residual and node.op.act is bz.UnaryFn.RELU and misses == []
    assert_equivalent(g, fused)


def test_resnet_block_shortcut_fuses_into_the_second_conv():
    g = resnet_basic_block(channels=4, hw=6)
    fused, report = bz.fuse(g, "cpu")
    counts = fused.op_counts()
    assert counts["fused_conv_bias_act"] == 2
    assert not {"conv2d", "batch_norm", "add", "relu"} & set(counts)  # the rest: BN folding
    first, second = fused_nodes(fused)
    assert not first.op.residual and first.op.act is bz.UnaryFn.RELU
    assert second.op.residual and second.op.act is bz.UnaryFn.RELU
    assert report.fused_counts["fused_conv_bias_act"] == 2
    assert_equivalent(g, fused, rtol=1e-4, atol=1e-5)


def test_two_conv_branches_fuse_one_as_the_others_residual():
    """A downsampling block adds two conv branches: one conv takes the other as residual."""
    g = bz.Graph("two_branches")
    x = g.input("x", bz.Shape((2, 4, 9, 9)))
    a = g.conv2d(x, g.param("wa", bz.Shape((8, 4, 3, 3))), g.param("ba", bz.Shape((8,))),
                 stride=2, padding=1)
    s = g.conv2d(x, g.param("ws", bz.Shape((8, 4, 1, 1))), g.param("bs", bz.Shape((8,))),
                 stride=2)
    g.set_outputs([g.relu(g.add(a, s))])
    fused, _ = fuse(g)
    assert fused.op_counts() == {"fused_conv_bias_act": 2}
    assert sum(n.op.residual for n in fused_nodes(fused)) == 1
    assert_equivalent(g, fused)


def test_a_broadcast_residual_stays_an_add_with_the_reason():
    g = residual_graph("relu", residual_dims=(1, 6, 8, 1))
    fused, misses = fuse(g)
    assert fused.count("add") == 1 and not fused_nodes(fused)[0].op.residual
    assert [m.reason for m in misses] == [MissReason.SHAPE_MISMATCH]
    assert "(1, 6, 8, 1)" in misses[0].detail and "residual" in misses[0].hint
    assert_equivalent(g, fused, symbols={"batch": 2})


@pytest.mark.parametrize("reader, reason", [("output", MissReason.GRAPH_OUTPUT),
                                            ("mul", MissReason.MULTI_CONSUMER)])
def test_a_conv_output_read_elsewhere_is_never_fused_away(reader, reason):
    """The conv's own result is returned or read again: fusing would drop it (ONNX Runtime's
    optimizer fuses across such a graph output)."""
    g = residual_graph("relu", extra_reader=reader)
    fused, misses = fuse(g)
    assert not any(n.op.residual for n in fused_nodes(fused))
    assert fused.count("add") == 1
    assert reason in {m.reason for m in misses}
    assert_equivalent(g, fused, symbols={"batch": 2})


def test_an_activation_the_target_lacks_leaves_it_outside():
    target = TARGETS["cpu"].with_options(epilogue_activations=frozenset({bz.UnaryFn.RELU}))
    g = residual_graph("tanh")
    fused, misses = fuse(g, RewriteContext(target=target))
    (node,) = fused_nodes(fused)
    assert node.op.residual and node.op.act is None and fused.count("tanh") == 1
    assert MissReason.UNSUPPORTED_EPILOGUE_ACTIVATION in {m.reason for m in misses}
    (miss,) = [m for m in misses if m.reason is MissReason.UNSUPPORTED_EPILOGUE_ACTIVATION]
    assert "matmul epilogue" not in miss.hint and "conv" in miss.hint  # not matmul's alone
    assert_equivalent(g, fused, symbols={"batch": 2})


def test_the_option_turns_it_off():
    fused, _ = bz.fuse(residual_graph(), "cpu", conv_residual=False)
    assert not any(n.op.residual for n in fused_nodes(fused))


def test_unfuse_round_trip():
    g = residual_graph("relu")
    fused, _ = fuse(g)
    plain = unfuse_fused_for_autodiff(fused)
    assert plain.count("fused_conv_bias_act") == 0 and plain.count("conv2d") == 1
    assert plain.count("add") >= 1 and plain.count("relu") == 1
    assert_equivalent(g, plain, symbols={"batch": 2})


def test_fused_op_checks_the_residual_type():
    g = bz.Graph("bad")
    x = g.input("x", bz.Shape((1, 3, 5, 5)))
    w = g.param("w", bz.Shape((4, 3, 3, 3)))
    b = g.param("b", bz.Shape((4,)))
    r = g.input("r", bz.Shape((1, 4, 5, 5)))           # the output is [1, 4, 3, 3]
    with pytest.raises(bz.BrazeError, match="residual"):
        g.fused_conv_bias_act(x, w, b, residual=r)


@pytest.mark.parametrize("precision", [None, "bf16"])
def test_compiled_matches_the_interpreter(precision):
    g = resnet_basic_block(channels=8, hw=10)
    params = bz.init_params(g, 3)
    exe = bz.compile(g, params=params, precision=precision, threads=2)
    rows = exe.dispatch_report(bz.random_feeds(g, 0)).rows
    assert any("residual + relu" in r[3] for r in rows), rows
    for seed in (1, 2):
        feeds = bz.random_feeds(g, seed)
        (got,), (want,) = exe(feeds), bz.interpret(exe.graph, feeds, params)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("target, contrib", [("onnxruntime", True), ("standard", False)])
def test_export_runs_in_onnx_runtime(target, contrib):
    g = resnet_basic_block(channels=4, hw=6)
    params = bz.init_params(g, 0)
    fused, _ = bz.fuse(g, "onnxruntime")
    assert any(n.op.residual for n in fused_nodes(fused))
    model = to_onnx_model(fused, target, params=params)
    with_z = [n for n in model.graph.node if n.op_type == "FusedConv" and len(n.input) == 4]
    assert bool(with_z) == contrib
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = bz.random_feeds(g, 2)
    (got,) = sess.run(None, feeds)
    (want,) = bz.interpret(g, feeds, params)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(), (8,), (6, 1, 1)])
def test_a_single_value_or_vector_is_no_residual_near_miss(shape):
    """hard-swish's `conv + 3` (its conv read again by the product) and a per-channel or
    misaligned vector are FuseConvBiasAct's to explain: FuseConvResidual reports nothing for
    them (it had called the hard-swish a multi-consumer residual)."""
    g = bz.Graph("hswish_three")
    x = g.input("x", bz.Shape((2, 6, 8, 8)))
    y = g.conv2d(x, g.param("w", bz.Shape((6, 6, 3, 3))), padding=1)
    v = g.constant(np.full(shape, 2.0, np.float32))  # not 3: no hard-swish, both stay apart
    g.set_outputs([g.div(g.mul(y, g.clamp(g.add(y, v), 0.0, 6.0)), 6.0)])
    fused, misses = fuse(g)
    assert not [m for m in misses if m.pattern == "FuseConvResidual"]
    assert_equivalent(g, fused)
