"""AutoMixedPrecision: matmul / conv operands rounded to bf16, accumulation and norms /
softmax / residuals in f32; weights rounded once (weight preparation); the policy's numbers
are the interpreter's, and close to f32."""
import ml_dtypes
import numpy as np
import pytest

import braze as bz
import braze.models as models
from braze.ir.analysis import weight_prep_nodes
from braze.passes.precision import MIN_CONV_MACS, AutoMixedPrecision, apply_precision


def test_matmul_operands_are_rounded_and_the_rest_stays_f32():
    g = bz.Graph("mlp")
    x = g.input("x", bz.Shape((4, 16)))
    w = g.param("w", bz.Shape((16, 8)))
    b = g.param("b", bz.Shape((8,)))
    g.set_outputs([g.layer_norm(g.linear_fused(x, w, b, "gelu"))])
    out, count = apply_precision(g, "bf16")
    assert count == 1
    casts = [n for n in out.nodes if n.op.kind == "cast"]
    assert [c.op.dtype for c in casts] == [bz.bf16, bz.f32, bz.bf16, bz.f32]  # x and w only
    ln = next(n for n in out.nodes if n.op.kind == "layer_norm")
    assert out.shape_of(ln.inputs[0]).dtype == bz.f32
    assert len(weight_prep_nodes(out)) == 2                   # w's rounding runs once
    params = bz.init_params(g, 0)
    feeds = bz.random_feeds(g, 0)
    xr = feeds["x"].astype(ml_dtypes.bfloat16).astype(np.float32)
    wr = params["w"].astype(ml_dtypes.bfloat16).astype(np.float32)
    manual = bz.Graph("m")
    xi, wi = manual.input("x", bz.Shape((4, 16))), manual.input("w", bz.Shape((16, 8)))
    manual.set_outputs([manual.layer_norm(manual.linear_fused(xi, wi, manual.constant(
        params["b"]), "gelu"))])
    want = bz.interpret(manual, {"x": xr, "w": wr})[0]
    np.testing.assert_allclose(bz.interpret(out, feeds, params)[0], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("channels, groups, rounded", [(64, 1, True), (64, 2, True),
                                                      (64, 64, False), (3, 1, False),
                                                      (4, 1, True)])
def test_conv_operands_are_rounded_but_those_of_small_convs(channels, groups, rounded):
    """A conv of fewer than MIN_CONV_MACS multiply-adds per output (a depthwise one, a 3x3
    of 3 channels) is memory-bound: its operands stay f32; dense and grouped convs of more
    are rounded."""
    g = bz.Graph("convs")
    x = g.input("x", bz.Shape((1, channels, 9, 9)))
    w = g.param("w", bz.Shape((channels, channels // groups, 3, 3)))
    g.set_outputs([g.conv2d(x, w, None, 1, 1, 1, groups)])
    assert (9 * channels // groups >= MIN_CONV_MACS) is rounded
    out, count = apply_precision(g, "bf16")
    casts = [n for n in out.nodes if n.op.kind == "cast"]
    assert count == int(rounded) and len(casts) == 4 * int(rounded)
    params = bz.init_params(g, 0)
    feeds = bz.random_feeds(g, 0)
    same = np.array_equal(bz.interpret(out, feeds, params)[0], bz.interpret(g, feeds, params)[0])
    assert same is not rounded


@pytest.mark.parametrize("build", [lambda: models.bert_encoder(2, 64, 4, batch=2, seq=8),
                                   lambda: models.llama_tiny()], ids=["bert", "llama"])
def test_compiled_bf16_policy_is_close_to_f32(build):
    g = build()
    params = bz.init_params(g, 0)
    feeds = bz.random_feeds(g, 0)
    f32 = bz.interpret(g, feeds, params)[0]
    exe = bz.compile(g, params=params, precision="bf16")
    got = exe(feeds)[0]
    rel = np.abs(got - f32).max() / np.abs(f32).max()
    assert 0 < rel < 3e-2                                    # the accuracy cost is visible
    fused, _ = bz.fuse(g, "cpu")
    policy_graph, _ = apply_precision(fused, "bf16")
    # the kernels sum in another order than NumPy: an f32 difference in the last bit can flip
    # a bf16 rounding (one bf16 step, 2**-8 relative) for an element now and then
    want = bz.interpret(policy_graph, feeds, params)[0]
    assert np.abs(got - want).max() < 4e-3 * np.abs(want).max()


def test_pass_form_and_unknown_policy():
    g = models.bert_encoder(1, 32, 2, batch=1, seq=4)
    res = AutoMixedPrecision("bf16").run(g, None)
    assert res.changed and res.graph.count("cast") > 0
    with pytest.raises(bz.BrazeError, match="unknown precision"):
        apply_precision(g, "int3")


def _with_round_attention(g: bz.Graph, dtype) -> bz.Graph:
    """`g` with every fused attention block's round_attention set to `dtype`."""
    import dataclasses

    new = bz.Graph(g.name)
    vmap = {}
    for node in g.nodes:
        ins = [vmap[v] for v in node.inputs]
        if node.op.kind == "fused_attention_block":
            outs = new.add_node(dataclasses.replace(node.op, round_attention=dtype), ins)
        else:
            outs = new.clone_node(node, ins, g)
        vmap.update(zip(node.values, outs))
    new.weights = dict(g.weights)
    new.set_outputs([vmap[v] for v in g.outputs])
    return new


def test_attention_output_projection_operand_is_rounded_inside_the_block():
    """A fused attention block's output projection is a matmul: the policy rounds its
    operand (the attention result) through the block's round_attention, which the
    decomposition (unfuse, the interpreter) writes as the same two casts."""
    g = models.bert_encoder(1, 64, 4, batch=2, seq=8)
    fused, _ = bz.fuse(g, "cpu")
    policy_graph, _ = apply_precision(fused, "bf16")
    blocks = [n for n in policy_graph.nodes if n.op.kind == "fused_attention_block"]
    assert len(blocks) == 1 and blocks[0].op.round_attention == bz.bf16
    assert blocks[0].provenance == next(n for n in fused.nodes
                                        if n.op.kind == "fused_attention_block").provenance
    params = bz.init_params(g, 0)
    feeds = bz.random_feeds(g, 1)
    want = bz.interpret(policy_graph, feeds, params)[0]
    unfused = bz.unfuse_fused_for_autodiff(policy_graph)
    np.testing.assert_allclose(bz.interpret(unfused, feeds, params)[0], want, rtol=1e-5,
                               atol=1e-5)
    rounded_matmuls = [n for n in unfused.nodes if n.op.kind == "matmul"
                       and unfused.nodes[n.inputs[0].node].op.kind == "cast"]
    assert len(rounded_matmuls) == 4  # joined qkv, output projection, the MLP's two
    unrounded = bz.interpret(_with_round_attention(policy_graph, None), feeds, params)[0]
    assert np.abs(unrounded - want).max() > 1e-5 * np.abs(want).max()
    with pytest.raises(bz.BrazeError, match="round_attention must be a float dtype"):
        _with_round_attention(fused, bz.i32)


def test_whole_transformer_layers_are_unfused_so_their_matmuls_are_rounded():
    """A fused transformer layer holds matmuls the policy lowers: it is decomposed first, never
    left silently in f32, and computes what the policy makes of the unfused blocks."""
    g = models.bert_encoder(2, 64, 4, batch=2, seq=8)
    fused, _ = bz.fuse(g, "cpu", transformer_layer=True)
    assert fused.count("fused_transformer_layer") == 2
    policy_graph, count = apply_precision(fused, "bf16")
    assert policy_graph.count("fused_transformer_layer") == 0
    assert count == 10  # per layer: joined qkv, the attention core, the output projection and
    # the MLP's two matmuls
    params = bz.init_params(g, 0)
    feeds = bz.random_feeds(g, 0)
    layers_graph, _ = apply_precision(bz.fuse(g, "cpu")[0], "bf16")
    np.testing.assert_allclose(bz.interpret(policy_graph, feeds, params)[0],
                               bz.interpret(layers_graph, feeds, params)[0], rtol=1e-5,
                               atol=1e-5)
    exe = bz.compile(fused, params=params, precision="bf16", fuse=False)
    got = exe(feeds)[0]
    want = bz.interpret(policy_graph, feeds, params)[0]
    assert np.abs(got - want).max() < 4e-3 * np.abs(want).max()
    f32 = bz.interpret(g, feeds, params)[0]
    assert np.abs(got - f32).max() > 10 * np.abs(got - want).mean()


def _patch_graph(kernel, stride, padding=0, hw=(16, 12), act="gelu"):
    g = bz.Graph("patches")
    x = g.input("x", bz.Shape(("batch", 3, *hw)))
    w = g.param("w", bz.Shape((24, 3, *kernel)))
    b = g.param("b", bz.Shape((24,)))
    y = g.fused_conv_bias_act(x, w, b, stride, padding, act=act)
    n, c, h, wd = g.shape_of(y).dims
    g.set_outputs([g.transpose(g.reshape(y, (n, c, h * wd)), (0, 2, 1))])  # ViT's flatten
    return g


@pytest.mark.parametrize("kernel, act", [((4, 4), "gelu"), ((2, 3), None)])
def test_a_patch_embedding_conv_becomes_a_bf16_matmul(kernel, act):
    """kernel = stride, no padding: patches @ the weight as a matrix, which the bf16 GEMM
    runs; the numbers are the policy's, at two batch sizes."""
    from braze.passes.precision import patch_size

    g = _patch_graph(kernel, kernel, act=act)
    out, count = apply_precision(g, "bf16")
    assert count == 1 and out.count("fused_conv_bias_act") == 0
    (mm,) = [n for n in out.nodes if n.op.kind == "fused_matmul_bias_act"]
    assert [out.nodes[v.node].op.kind for v in mm.inputs[:2]] == ["cast", "cast"]
    assert patch_size(g, next(n for n in g.nodes if n.op.kind == "fused_conv_bias_act")) \
        == kernel
    params = bz.init_params(g, 1)
    exe = bz.compile(g, params=params, precision="bf16", threads=2)
    rows = exe.dispatch_report(bz.random_feeds(g, 0, {"batch": 2})).rows
    assert not [r for r in rows if r[1] in ("conv2d", "fused_conv_bias_act")]
    for batch in (1, 3):
        feeds = bz.random_feeds(g, batch, {"batch": batch})
        (got,), (want,) = exe(feeds), bz.interpret(exe.graph, feeds, params)
        assert np.abs(got - want).max() < 4e-3 * np.abs(want).max()
        (f32,) = bz.interpret(g, feeds, params)
        assert np.abs(got - f32).max() < 3e-2 * np.abs(f32).max()


@pytest.mark.parametrize("kernel, stride, padding, hw", [
    ((3, 3), (3, 3), 1, (16, 12)),     # padded
    ((4, 4), (2, 2), 0, (16, 12)),     # overlapping
    ((4, 4), (4, 4), 0, (18, 12)),     # rows left over
    ((1, 1), (1, 1), 0, (16, 12)),     # a 1x1 conv: no patches to gather
])
def test_other_convs_stay_convs(kernel, stride, padding, hw):
    g = _patch_graph(kernel, stride, padding, hw)
    out, _ = apply_precision(g, "bf16")
    assert out.count("fused_conv_bias_act") == 1
