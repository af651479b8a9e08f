"""FuseResidualLN / FuseResidualRmsNorm with a residual that repeats over leading axes (ViT's
[1, S, D] position embeddings added to the [B, S, D] patch embeddings): it fuses, in either
operand order, with the full operand as the fused op's x; broadcasts the fused kernel cannot
run (the normalized axis, an inner axis, a sum larger than both addends, a per-feature bias)
are refused with the reason shown. The fused graph matches the interpreter, unfuses, compiles
to the native row kernel, differentiates, and exports to ONNX that ONNX Runtime runs."""
import numpy as np
import pytest

import braze as bz
from braze.errors import ShapeError
from braze.passes.base import RulePass, run_passes
from braze.passes.fusion.residual_norm import RULES
from braze.passes.targets import TARGETS
from braze.passes.unfuse import unfuse_fused_for_autodiff
from braze.rewrite import MissReason, RewriteContext
from braze.testing import assert_equivalent

CPU = RewriteContext(target=TARGETS["cpu"])
KIND = {False: "fused_residual_ln", True: "fused_residual_rms_norm"}


def fuse(g):
    return RulePass("FuseResidualNorm", RULES).run(g, CPU)


def embeddings_graph(pos_dims=(1, 7, 16), rms=False, pos_first=True, read_sum=True,
                     batch="batch"):
    """ViT-style: h = pos + patches; y = norm(h); returns y and (when `read_sum`) h + y, so the
    sum is read again as the next residual (the fused op must expose it at full shape)."""
    g = bz.Graph("vit_embeddings")
    x = g.input("patches", bz.Shape((batch, 7, 16)))
    pos = g.param("pos", bz.Shape(pos_dims))
    h = g.add(pos, x) if pos_first else g.add(x, pos)
    gamma = g.param("gamma", bz.Shape((16,)))
    y = g.rms_norm(h, gamma) if rms else g.layer_norm(h, gamma, g.param("beta", bz.Shape((16,))))
    g.set_outputs([y, g.add(h, y)] if read_sum else [y])
    return g


def fused_node(g):
    (node,) = [n for n in g.nodes if n.op.kind in KIND.values()]
    return node


@pytest.mark.parametrize("pos_dims", [(1, 7, 16), (7, 16)])
@pytest.mark.parametrize("pos_first", [True, False])
@pytest.mark.parametrize("rms", [False, True])
def test_leading_axis_residual_fires(pos_dims, pos_first, rms):
    g = embeddings_graph(pos_dims, rms, pos_first)
    res = fuse(g)
    assert res.graph.op_counts() == {KIND[rms]: 1, "add": 1}, res.misses
    assert not res.misses
    node = fused_node(res.graph)
    assert node.op.expose_sum
    x, residual = (res.graph.shape_of(v).dims for v in node.inputs[:2])
    assert (x, residual) == (("batch", 7, 16), pos_dims)        # the full operand is x
    assert node.outputs[1].dims == ("batch", 7, 16)             # the sum keeps the full shape
    assert_equivalent(g, res.graph, symbols={"batch": 3}, seeds=(3, 4))


def miss_of(g):
    res = fuse(g)
    assert not res.changed
    (miss,) = res.misses
    assert (miss.pattern, miss.reason) == ("FuseResidualLN", MissReason.SHAPE_MISMATCH)
    assert miss.hint
    return miss


def norm_of_sum(a_dims, b_dims, axis=-1):
    g = bz.Graph("bcast")
    s = g.add(g.input("a", bz.Shape(a_dims)), g.input("b", bz.Shape(b_dims)))
    g.set_outputs([g.layer_norm(s, axis=axis)])
    return g


def test_residual_broadcasting_the_hidden_axis_is_refused():
    miss = miss_of(norm_of_sum((2, 7, 16), (2, 7, 1)))
    assert "(2, 7, 1)" in miss.detail and "normalized axes" in miss.detail


def test_residual_broadcasting_an_inner_axis_is_refused():
    miss = miss_of(norm_of_sum((2, 7, 16), (2, 1, 16)))
    assert "(2, 1, 16)" in miss.detail and "inner" in miss.detail


def test_residual_that_would_enlarge_the_sum_is_refused():
    miss = miss_of(norm_of_sum((2, 1, 16), (1, 7, 16)))
    assert "neither addend has the sum's dims" in miss.detail


def test_residual_repeated_on_every_row_is_a_bias_and_refused():
    miss = miss_of(norm_of_sum((2, 7, 16), (1, 1, 16)))
    assert "a bias, not a residual" in miss.detail and "FuseMatMulBiasAct" in miss.hint
    assert "where a matmul makes the other addend" in miss.hint  # no matmul here: not assumed


def test_residual_matching_the_normalized_axes_of_a_wider_norm_fires():
    """LayerNorm over the last two axes (rows are [7, 16] blocks): a residual repeated over
    the batch still differs from row to row; one repeated on every row would be a bias."""
    g = norm_of_sum((2, 3, 7, 16), (3, 7, 16), axis=-2)
    res = fuse(g)
    assert res.graph.op_counts() == {"fused_residual_ln": 1} and not res.misses
    assert_equivalent(g, res.graph)


def test_fused_op_refuses_a_residual_larger_than_x():
    g = bz.Graph("bad")
    x = g.input("x", bz.Shape((1, 7, 16)))
    r = g.input("r", bz.Shape((2, 7, 16)))
    with pytest.raises(ShapeError, match="x must carry the sum's full shape"):
        g.fused_residual_ln(x, r)


@pytest.mark.parametrize("rms", [False, True])
def test_fuse_unfuse_round_trip(rms):
    g = embeddings_graph(rms=rms, batch=2)
    fused, _ = run_passes(g, [RulePass("FuseResidualNorm", RULES)], CPU,
                          verify=True, check_numerics=True)
    assert fused.count(KIND[rms]) == 1
    plain = unfuse_fused_for_autodiff(fused)
    assert plain.count(KIND[rms]) == 0 and plain.count("add") == g.count("add")
    assert_equivalent(g, plain)


@pytest.mark.parametrize("pos_dims,batch", [((1, 7, 16), 3), ((7, 16), 2), ((1, 7, 16), 70)])
@pytest.mark.parametrize("rms", [False, True])
def test_compiled_kernel_matches_the_interpreter(pos_dims, batch, rms):
    g = embeddings_graph(pos_dims, rms)
    fused, _ = bz.fuse(g, "cpu")
    assert fused.count(KIND[rms]) == 1
    params = bz.init_params(g, seed=5)
    exe = bz.compile(g, target="cpu", params=params)
    rng = np.random.default_rng(batch)
    feeds = {"patches": rng.standard_normal((batch, 7, 16)).astype(np.float32)}
    name = "RMSNorm" if rms else "LayerNorm"
    assert f"C row residual {name}, residual repeated over {batch} row blocks" in str(
        exe.dispatch_report(feeds))
    for got, want in zip(exe(feeds), bz.interpret(g, feeds, params), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_gradients_through_the_fused_op_match_the_plain_graph():
    def with_loss(graph):
        out = bz.Graph.parse(str(graph))
        y, h = out.outputs
        out.set_outputs([out.sum(out.mul(out.add(y, h), h))])
        return out

    g = embeddings_graph(batch=2)
    fused, _ = bz.fuse(g, "cpu")
    grads = [bz.grad_with_loss(with_loss(x), wrt=["pos", "patches", "gamma"])
             for x in (g, fused)]
    assert_equivalent(grads[0], grads[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("pos_dims", [(1, 7, 16), (7, 16)])
@pytest.mark.parametrize("target,contrib", [("onnxruntime", 1), ("standard", 0)])
@pytest.mark.parametrize("rms", [False, True])
def test_onnx_export_runs_in_onnxruntime(pos_dims, target, contrib, rms, tmp_path):
    import onnx
    import onnxruntime as ort

    g = embeddings_graph(pos_dims, rms)
    fused, _ = bz.fuse(g, "onnxruntime")
    assert fused.count(KIND[rms]) == 1
    params = bz.init_params(g, seed=2)
    path = bz.export_onnx(fused, tmp_path / "m.onnx", target=target, params=params)
    op_type = "SkipSimplifiedLayerNormalization" if rms else "SkipLayerNormalization"
    assert [n.op_type for n in onnx.load(str(path)).graph.node].count(op_type) == contrib
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {"patches": np.random.default_rng(9).standard_normal((3, 7, 16)).astype(np.float32)}
    for got, want in zip(sess.run(None, feeds), bz.interpret(g, feeds, params), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
