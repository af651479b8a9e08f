"""FuseConvBiasAct through the views of a 1-D conv written as a 2-D one (ONNX Conv over
[N, C, L] and torch conv1d import as reshape -> conv2d -> reshape): act(reshape(conv)) and
wav2vec2's act(narrow(reshape(conv))) take the activation into the conv's epilogue, the views
after it; and through a conv's output turned back into tokens (SegFormer's Mix-FFN:
act(reshape(transpose(conv))), act(transpose(conv))). Fires (op counts), must-not-fire with
the reason (a view read elsewhere, an activation the target lacks), numerics through the
interpreter and the compiled kernels, the fuse -> unfuse round trip, and the imported ONNX
1-D conv."""
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


def conv1d_graph(act="gelu", bias=True, cut=False, view_reader=False, loss=False):
    """act(reshape(conv2d(reshape(x)))) over x [batch, 6, 23], kernel 5 stride 2 (+ narrow)."""
    rng = np.random.default_rng(0)
    g = bz.Graph("conv1d_act")
    x = g.input("x", bz.Shape(("batch", 6, 23)))
    w = g.param("w", bz.Shape((8, 6, 1, 5)), rng.standard_normal((8, 6, 1, 5)).astype(np.float32))
    b = g.param("b", bz.Shape((8,)), rng.standard_normal(8).astype(np.float32)) if bias else None
    y = g.conv2d(g.reshape(x, ("batch", 6, 1, 23)), w, b, stride=(1, 2), padding=(0, 2, 0, 2))
    y = g.reshape(y, ("batch", 8, 12))
    view = y
    if cut:
        y = g.narrow(y, 2, 0, 11)  # wav2vec2's "same pad": the last position dropped
    out = g.activation(y, act)
    outs = [g.sum(g.mul(out, out)) if loss else out]
    g.set_outputs(outs + ([g.neg(view)] if view_reader else []))
    return g


def mix_ffn_graph(reshape=True, perm_reader=False, loss=False, act="gelu"):
    """SegFormer's Mix-FFN middle: tokens [batch, 7 * 5, 16] -> NCHW -> depthwise 3x3 conv
    -> transpose back to NHWC (-> reshape to tokens) -> act."""
    rng = np.random.default_rng(1)
    g = bz.Graph("mix_ffn")
    t = g.input("t", bz.Shape(("batch", 35, 16)))
    w = g.param("w", bz.Shape((16, 1, 3, 3)), rng.standard_normal((16, 1, 3, 3)).astype(np.float32))
    b = g.param("b", bz.Shape((16,)), rng.standard_normal(16).astype(np.float32))
    x = g.reshape(g.transpose(t, (0, 2, 1)), ("batch", 16, 7, 5))
    y = g.transpose(g.conv2d(x, w, b, padding=1, groups=16), (0, 2, 3, 1))
    perm = y
    if reshape:
        y = g.reshape(y, ("batch", 35, 16))
    out = g.activation(y, act)
    outs = [g.sum(g.mul(out, out)) if loss else out]
    g.set_outputs(outs + ([g.neg(perm)] if perm_reader else []))
    return g


def fused_node(g):
    (node,) = [n for n in g.nodes if n.op.kind == "fused_conv_bias_act"]
    return node


@pytest.mark.parametrize("cut", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_the_activation_joins_the_conv_through_its_views(cut, bias):
    g = conv1d_graph(cut=cut, bias=bias)
    res = FUSE.run(g, CPU)
    counts = res.graph.op_counts()
    assert counts.pop("fused_conv_bias_act") == 1
    assert "gelu" not in counts and "conv2d" not in counts
    assert counts.get("narrow", 0) == int(cut) and counts["reshape"] == 2
    assert fused_node(res.graph).op.act is bz.UnaryFn.GELU
    assert_equivalent(g, res.graph, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("graph, view", [(lambda: conv1d_graph(view_reader=True), "reshape"),
                                         (lambda: mix_ffn_graph(perm_reader=True), "transpose")])
def test_a_view_read_elsewhere_keeps_the_activation_outside(graph, view):
    g = graph()
    res = FUSE.run(g, CPU)
    assert fused_node(res.graph).op.act is None and res.graph.count("gelu") == 1
    assert any(m.reason is MissReason.MULTI_CONSUMER and view in m.detail
               for m in res.misses)
    assert_equivalent(g, res.graph, rtol=1e-5, atol=1e-5)


def test_an_activation_the_target_lacks_is_a_near_miss_with_the_reason():
    g = conv1d_graph(act="relu6")
    res = FUSE.run(g, RewriteContext(target=TARGETS["onnxruntime"]))
    assert res.graph.count("relu6") == 1
    assert MissReason.UNSUPPORTED_EPILOGUE_ACTIVATION in [m.reason for m in res.misses]
    assert_equivalent(g, res.graph, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("graph, act", [(lambda: conv1d_graph(), "gelu"),
                                        (lambda: conv1d_graph(cut=True), "gelu"),
                                        *[(lambda a=a: mix_ffn_graph(act=a), a)
                                          for a in ("gelu", "silu", "relu")]])
def test_compiled_matches_the_interpreter(graph, act):
    g = graph()
    exe = bz.compile(g)
    feeds = bz.random_feeds(g, 2, symbols={"batch": 3})
    np.testing.assert_allclose(exe(feeds)[0], bz.interpret(g, feeds)[0], rtol=1e-5, atol=1e-5)
    (how,) = [r[3] for r in exe.dispatch_report().rows if r[1] == "fused_conv_bias_act"]
    assert act in how
    assert not [r for r in exe.dispatch_report().rows if r[1] == act]


@pytest.mark.parametrize("graph", [lambda: conv1d_graph(cut=True, loss=True),
                                   lambda: mix_ffn_graph(loss=True)])
def test_unfuse_round_trip_and_gradient(graph):
    g = graph()
    fused, _ = run_passes(g, [FUSE], CPU, verify=True, check_numerics=True)
    assert fused_node(fused).op.act is bz.UnaryFn.GELU
    plain = unfuse_fused_for_autodiff(fused)
    assert plain.count("fused_conv_bias_act") == 0
    assert_equivalent(g, plain, rtol=1e-5, atol=1e-5)
    feeds = bz.random_feeds(g, 1, symbols={"batch": 2})
    grads = [bz.interpret(bz.grad_with_loss(graph, ["w"]), feeds)[1] for graph in (g, plain)]
    assert np.abs(grads[0]).max() > 0
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-4, atol=1e-3)


def test_an_imported_onnx_conv1d_with_gelu_fuses(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(4, 8, 3, stride=2, bias=False)

        def forward(self, x):
            return torch.nn.functional.gelu(self.conv(x))

    torch.manual_seed(0)
    path = tmp_path / "conv1d.onnx"
    x = torch.randn(1, 4, 31)
    torch.onnx.export(Net().eval(), (x,), str(path), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"])
    g = bz.import_onnx(path)
    fused, report = bz.fuse(g, "cpu")
    assert fused.count("gelu") == 0 and fused_node(fused).op.act is bz.UnaryFn.GELU
    feeds = {"x": x.numpy()}
    np.testing.assert_allclose(bz.compile(g)(feeds)[0], bz.interpret(g, feeds)[0], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("reshape", [True, False])
def test_the_activation_joins_the_conv_through_a_transpose_back_to_tokens(reshape):
    g = mix_ffn_graph(reshape=reshape)
    res = FUSE.run(g, CPU)
    counts = res.graph.op_counts()
    assert counts.pop("fused_conv_bias_act") == 1
    assert "gelu" not in counts and "conv2d" not in counts
    assert counts["transpose"] == 2 and counts["reshape"] == 1 + int(reshape)
    assert fused_node(res.graph).op.act is bz.UnaryFn.GELU
    (reader,) = res.graph.users(fused_node(res.graph).value)
    assert reader.op.kind == "transpose"  # the layout change now follows the fused conv
    assert_equivalent(g, res.graph, rtol=1e-5, atol=1e-5)
