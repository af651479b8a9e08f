"""FuseAttentionBlock on attention over two inputs: encoder-decoder cross-attention (q of x; k, v
of x_kv, S_kv != S) and MobileBERT's separate value input (q, k of x; v of x_kv). It fires
(one block, projections joined per input), refuses layouts and masks no block reads (with the
reason), and keeps the numbers: interpreter, fuse -> unfuse, autodiff, compiled executor, ONNX
Runtime."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest

import braze as bz
from braze.ir.ops.attention import MaskKind, rope_tables
from braze.ir.ops.fused import FusedAttentionBlock, QkvInputs, RopeMode
from braze.ir.ops.norm import RmsNorm
from braze.passes.base import RulePass
from braze.passes.fusion.attention_block import RULES
from braze.passes.precision import apply_precision
from braze.passes.targets import TARGETS
from braze.passes.unfuse import unfuse_fused_for_autodiff
from braze.rewrite import MissReason, RewriteContext
from braze.runtime.kernels import Dispatch, attention_native
from braze.testing import assert_equivalent

CPU = RewriteContext(target=TARGETS["cpu"])
B, S, S_KV, E, E_KV = 2, 5, 7, 32, 24
SOURCES = {"cross": "xkk", "separate_v": "xxk"}  # per q, k, v: x or x_kv ("k")


def fuse(g):
    return RulePass("FuseAttentionBlock", RULES).run(g, CPU)


def blocks(g):
    return [n for n in g.nodes if n.op.kind == "fused_attention_block"]


def reasons(res):
    return {m.reason for m in res.misses if m.pattern == "FuseAttentionBlock"}


def two_input_graph(layout="cross", *, heads=4, kv_heads=4, dim=8, v_dim=None, bias="qkv",
                    mask=None, kind=None, reads_k=False, sources=None, loss=False):
    """Attention of x [B, S, E] over x_kv [B, S_kv, E_KV] written as primitives: each of q, k, v
    projects the input `sources` names ("x" or "k" per role); `bias` names the roles with a
    projection bias; `mask` "padding" adds a [B, 1, 1, S_kv] additive mask input; `loss`
    returns mean(y * y) instead of y. S_kv is S_KV != S when k and v read x_kv, else S."""
    g = bz.Graph("two_inputs")
    src = dict(zip("qkv", sources or SOURCES[layout]))
    s_kv = S_KV if src["k"] == src["v"] == "k" else S  # k and v have one length
    x = g.input("x", bz.Shape((B, S, E)))
    x_kv = g.input("x_kv", bz.Shape((B, s_kv, E_KV)))
    hs = {"q": heads, "k": kv_heads, "v": kv_heads}
    ds = {"q": dim, "k": dim, "v": v_dim or dim}
    t = {}
    for r in "qkv":
        inp, e, s = (x, E, S) if src[r] == "x" else (x_kv, E_KV, s_kv)
        p = g.mm(inp, g.param(f"w_{r}", bz.Shape((e, hs[r] * ds[r]))))
        if r in bias:
            p = g.add(p, g.param(f"b_{r}", bz.Shape((hs[r] * ds[r],))))
        t[r] = g.transpose(g.reshape(p, (B, s, hs[r], ds[r])), (0, 2, 1, 3))
    m = g.input("mask", bz.Shape((B, 1, 1, s_kv))) if mask else None
    ctx = g.attention(t["q"], t["k"], t["v"], m, kind=kind or ("custom" if mask else None))
    y = g.mm(g.reshape(g.transpose(ctx, (0, 2, 1, 3)), (B, S, heads * ds["v"])),
             g.param("w_o", bz.Shape((heads * ds["v"], E))))
    y = g.add(y, g.param("b_o", bz.Shape((E,))))
    if loss:
        y = g.mean(g.mul(y, y))
    g.set_outputs([y, g.mul(t["k"], 2.0)] if reads_k else [y])
    return g


def padding_feeds(g, seed):
    """Fresh random inputs; the mask (if any) hides each batch row's last keys with -1e9."""
    rng = np.random.default_rng(seed)
    feeds = {n.op.name: rng.standard_normal(n.outputs[0].dims).astype(np.float32)
             for n in g.inputs if n.op.name != "mask"}
    if any(n.op.name == "mask" for n in g.inputs):
        s_k = next(n for n in g.inputs if n.op.name == "mask").outputs[0].dims[-1]
        mask = np.zeros((B, 1, 1, s_k), np.float32)
        for i, kept in enumerate((s_k, s_k - 3)):
            mask[i, ..., kept:] = -1e9
        feeds["mask"] = mask
    return feeds


def assert_same_outputs(g, other, params, run_other=None, tol=1e-5):
    for seed in (0, 1):
        feeds = padding_feeds(g, seed)
        want = bz.interpret(g, feeds, params)
        got = run_other(feeds) if run_other else bz.interpret(other, feeds, params)
        for w, o in zip(want, got):
            np.testing.assert_allclose(o, w, rtol=tol, atol=tol)


# -- fires --------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["cross", "separate_v"])
@pytest.mark.parametrize("mask", [None, "padding"])
def test_fires_and_joins_projections_per_input(layout, mask):
    g = two_input_graph(layout, mask=mask)
    res = fuse(g)
    (node,) = blocks(res.graph)
    op = node.op
    assert op.qkv_inputs is QkvInputs(layout) and op.has_qkv_bias and op.has_out_bias
    joined = [j for _, j in op.qkv_inputs.projections]
    assert joined == (["q", "kv"] if layout == "cross" else ["qk", "v"])
    roles = dict(zip(op.input_roles(), node.inputs))
    assert res.graph.nodes[roles["x_kv"].node].op.name == "x_kv"
    assert res.graph.shape_of(roles[f"w_{joined[1]}"]).dims[0] == E_KV
    c = res.graph.op_counts()
    assert c["fused_attention_block"] == res.stats["FuseAttentionBlock"].matches == 1
    assert not any(c.get(k) for k in ("attention", "transpose", "reshape", "matmul", "narrow"))
    assert not res.misses
    assert_same_outputs(g, res.graph, bz.init_params(g, seed=3))


def test_grouped_kv_heads_and_biases_on_one_input_only():
    g = two_input_graph("cross", heads=4, kv_heads=2, bias="kv")
    res = fuse(g)
    (node,) = blocks(res.graph)
    assert node.op.num_kv_heads == 2 and node.op.has_qkv_bias
    assert_equivalent(g, res.graph)


def test_builder_block_means_its_primitives_and_refuses_causal():
    g = two_input_graph("cross", mask="padding")
    p = bz.init_params(g, seed=4)
    h = bz.Graph("builder")
    ins = {n.op.name: h.input(n.op.name, n.outputs[0]) for n in g.inputs}
    joined = {"wq": p["w_q"], "bq": p["b_q"], "wkv": np.concatenate([p["w_k"], p["w_v"]], 1),
              "bkv": np.concatenate([p["b_k"], p["b_v"]]), "wo": p["w_o"], "bo": p["b_o"]}
    w = {k: h.param(k, bz.Shape(v.shape)) for k, v in joined.items()}
    y = h.fused_attention_block(ins["x"], w["wq"], w["wo"], w["bq"], w["bo"], num_heads=4,
                                x_kv=ins["x_kv"], w_x_kv=w["wkv"], b_x_kv=w["bkv"],
                                mask=ins["mask"])
    h.set_outputs([y])
    op = h.nodes[y.node].op
    assert (op.qkv_inputs, op.num_kv_heads, op.head_dim) == (QkvInputs.CROSS, 4, 8)
    assert op.input_roles() == ("x", "x_kv", "w_q", "b_q", "w_kv", "b_kv", "w_o", "b_o", "mask")
    for seed in (0, 1):
        feeds = padding_feeds(g, seed)
        np.testing.assert_allclose(bz.interpret(h, feeds, joined)[0],
                                   bz.interpret(g, feeds, p)[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(bz.ShapeError, match="keys come from x_kv"):
        h.fused_attention_block(ins["x"], w["wq"], w["wo"], num_heads=4, x_kv=ins["x_kv"],
                                w_x_kv=w["wkv"], mask_kind="causal")


# -- must not fire ------------------------------------------------------------------------------
@pytest.mark.parametrize("knob, reason, detail", [
    (dict(sources="xkx"), MissReason.NOT_SHARED_INPUT, "q, k, v read"),
    (dict(v_dim=4), MissReason.SHAPE_MISMATCH, "heads x head_dim"),
    (dict(reads_k=True), MissReason.MULTI_CONSUMER, ""),
])
def test_refuses_with_the_reason(knob, reason, detail):
    g = two_input_graph("cross", **knob)
    res = fuse(g)
    assert not blocks(res.graph)
    assert reason in reasons(res), res.misses
    assert any(detail in m.detail for m in res.misses if m.reason is reason)
    assert_equivalent(g, res.graph)


def test_causal_mask_over_keys_of_another_input_is_refused():
    g = two_input_graph("cross", kind="causal")
    res = fuse(g)
    assert not blocks(res.graph)
    (miss,) = [m for m in res.misses if m.pattern == "FuseAttentionBlock"]
    assert miss.reason is MissReason.PATTERN_MISMATCH and "causal" in miss.detail


# -- the fused block everywhere it runs ---------------------------------------------------------
@pytest.mark.parametrize("layout", ["cross", "separate_v"])
def test_fuse_unfuse_round_trip(layout):
    g = two_input_graph(layout, mask="padding")
    fused = fuse(g).graph
    plain = unfuse_fused_for_autodiff(fused)
    assert not blocks(plain) and plain.count("attention") == 1
    assert_same_outputs(g, plain, bz.init_params(g, seed=5))


@pytest.mark.parametrize("layout", ["cross", "separate_v"])
@pytest.mark.parametrize("mask", [None, "padding"])
def test_compiled_executor_matches_the_interpreter(layout, mask):
    """The C attention kernel reads the heads in place from the projections."""
    if attention_native.lib() is None:
        pytest.skip("no C compiler for the attention kernel")
    g = two_input_graph(layout, mask=mask)
    fused, report = bz.fuse(g, "cpu")
    assert fused.count("fused_attention_block") == 1, report
    params = bz.init_params(g, seed=7)
    exe = bz.compile(fused, target="cpu", params=params)
    assert_same_outputs(g, None, params, run_other=exe, tol=1e-4)
    (row,) = [r for r in exe.dispatch_report().rows if r[1] == "fused_attention_block"]
    assert row[2] == Dispatch.NATIVE and "C heads" in row[3]


@pytest.mark.parametrize("layout", ["cross", "separate_v"])
@pytest.mark.parametrize("target", ["onnxruntime", "standard"])
def test_onnx_export_runs_in_onnxruntime(layout, target, tmp_path):
    g = two_input_graph(layout, mask="padding")
    fused, _ = bz.fuse(g, "onnxruntime")
    assert fused.count("fused_attention_block") == 1
    params = bz.init_params(g, seed=9)
    path = bz.export_onnx(fused, tmp_path / "m.onnx", target=target, params=params)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert ("MultiHeadAttention" in ops) == (target == "onnxruntime")

    def run(feeds):
        return sess.run(None, feeds)

    assert_same_outputs(g, None, params, run_other=run, tol=1e-4)


@pytest.mark.parametrize("layout", ["cross", "separate_v"])
def test_gradients_through_the_fused_block_match_the_primitives(layout):
    g = two_input_graph(layout, mask="padding", loss=True)
    fused = fuse(g).graph
    assert len(blocks(fused)) == 1
    wrt = ["w_q", "w_k", "b_v", "x", "x_kv"]
    assert_same_outputs(bz.grad_with_loss(g, wrt), bz.grad_with_loss(fused, wrt),
                        bz.init_params(g, seed=11))


def test_bf16_precision_rounds_weights_and_inputs_not_biases():
    fused = fuse(two_input_graph("cross")).graph
    low, count = apply_precision(fused, "bf16")
    (node,) = blocks(low)
    rounded = {role for role, v in zip(node.op.input_roles(), node.inputs)
               if low.nodes[v.node].op.kind == "cast"}
    assert count == 1 and rounded == {"x", "x_kv", "w_q", "w_kv", "w_o"}


@pytest.mark.parametrize("layout", ["cross", "separate_v"])
def test_text_ir_and_json_keep_the_layout(layout, tmp_path):
    fused = fuse(two_input_graph(layout, mask="padding")).graph
    assert f"qkv_inputs={layout}" in str(fused)
    assert str(bz.Graph.parse(str(fused))) == str(fused)
    bz.save(fused, tmp_path / "m.json")
    assert str(bz.load(tmp_path / "m.json")) == str(fused)
    assert "qkv_inputs" not in str(fuse(two_input_graph(sources="xxx")).graph)  # self: default


def _block_graph(op: FusedAttentionBlock, s: int, s_kv: int) -> bz.Graph:
    """One `op` node on x [B, s, E] and x_kv [B, s_kv, E_KV], a param per other role."""
    g = bz.Graph("block")
    x = g.input("x", bz.Shape((B, s, E)))
    x_kv = g.input("x_kv", bz.Shape((B, s_kv, E_KV)))
    d, hq = op.head_dim, op.num_heads
    cos, sin = rope_tables(s, op.n_rot or d)
    dims = {"w_o": (hq * d, E), "b_o": (E,), "q_norm_gamma": (d,), "k_norm_gamma": (d,),
            "mask": (B, 1, 1, s_kv)}
    for src, joined in op.qkv_inputs.projections:
        e_in = E if src == "x" else E_KV
        dims.update({f"w_{joined}": (e_in, op.role_width(joined)),
                     f"b_{joined}": (op.role_width(joined),)})
    made = {"x": x, "x_kv": x_kv, "cos": g.constant(cos), "sin": g.constant(sin)}
    ins = [made[r] if r in made else g.param(r, bz.Shape(dims[r])) for r in op.input_roles()]
    g.set_outputs([g.add_node(op, ins)[0]])
    return g


@pytest.mark.parametrize("op, s_kv", [
    (FusedAttentionBlock(4, 2, 8, MaskKind.CUSTOM, qk_norm=RmsNorm(1e-6, -1, True),
                         qkv_inputs=QkvInputs.CROSS), S_KV),          # GQA, per-head q/k norm
    (FusedAttentionBlock(4, 4, 8, MaskKind.CAUSAL, rope=RopeMode.INTERLEAVED, n_rot=4,
                         has_qkv_bias=False, qkv_inputs=QkvInputs.SEPARATE_V), S),  # rope
], ids=["cross_gqa_qk_norm", "separate_v_causal_rope"])
def test_block_kernel_variants_match_the_interpreter(op, s_kv):
    if attention_native.lib() is None:
        pytest.skip("no C compiler for the attention kernel")
    g = _block_graph(op, S, s_kv)
    params = bz.init_params(g, seed=13)
    exe = bz.compile(g, target="cpu", params=params, fuse=False)
    assert_same_outputs(g, None, params, run_other=exe, tol=1e-4)
    (row,) = exe.dispatch_report().rows
    assert row[2] == Dispatch.NATIVE
