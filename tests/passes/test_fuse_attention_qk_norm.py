"""FuseAttentionBlock with a q/k norm (Qwen3, Gemma 3, OLMo 2, Persimmon): an RMSNorm or
LayerNorm of q and k, per head ([B, S, H, D] over D) or over the whole projection ([B, S, H*D]),
fuses into the block's `qk_norm`; the block keeps the numbers in the interpreter, the compiled
kernel and the ONNX Runtime export; a norm of only q, unlike norms, or a norm over more than the
last axis stay unfused with the reason."""
import numpy as np
import onnxruntime as ort
import pytest

import braze as bz
from braze.ir.ops.norm import LayerNorm, RmsNorm
from braze.passes.base import RulePass
from braze.passes.fusion.attention_block import RULES
from braze.passes.targets import TARGETS
from braze.rewrite import MissReason, RewriteContext
from braze.testing import assert_equivalent

CPU = RewriteContext(target=TARGETS["cpu"])
E, HQ, HKV, D, S = 32, 4, 2, 8, 6


def qk_norm_graph(*, kind="rms", per_head=True, roles="qk", eps=None, axis=-1, beta=False,
                  after_transpose=False):
    """x [2, S, E] -> q/k/v projections -> heads (q and k in `roles` normalized, per head
    before or `after_transpose`, or over the whole projection) -> rope on q and k -> causal
    GQA attention -> merge -> output projection."""
    g = bz.Graph("qk_norm")
    x = g.input("x", bz.Shape((2, S, E)))
    cos, sin = (g.input(n, bz.Shape((S, D // 2))) for n in ("cos", "sin"))
    heads = {"q": HQ, "k": HKV, "v": HKV}
    t = {}
    for r, h in heads.items():
        p = g.mm(x, g.param(f"w_{r}", bz.Shape((E, h * D))))
        norm_dims = ((h, D) if axis == -2 else (D,)) if per_head else (h * D,)
        normed = r in roles
        kw = dict(eps=(eps or {}).get(r, 1e-6), axis=axis)
        build = g.rms_norm if kind == "rms" else g.layer_norm
        gamma = g.param(f"{r}_gamma", bz.Shape(norm_dims)) if normed else None
        bias = g.param(f"{r}_beta", bz.Shape(norm_dims)) if normed and beta else None
        if normed and not per_head:
            p = build(p, gamma, bias, **kw)
        p = g.reshape(p, (2, S, h, D))
        if normed and per_head and not after_transpose:
            p = build(p, gamma, bias, **kw)
        t[r] = g.transpose(p, (0, 2, 1, 3))
        if normed and per_head and after_transpose:
            t[r] = build(t[r], gamma, bias, **kw)
        if r != "v":
            t[r] = g.rope(t[r], cos, sin)
    o = g.attention(t["q"], t["k"], t["v"], kind="causal")
    y = g.mm(g.reshape(g.transpose(o, (0, 2, 1, 3)), (2, S, HQ * D)),
             g.param("w_o", bz.Shape((HQ * D, E))))
    g.set_outputs([y])
    return g


def fuse(g):
    return RulePass("FuseAttentionBlock", RULES).run(g, CPU)


def _feeds(g, seed):
    feeds = bz.random_feeds(g, seed)
    pos = np.arange(S)[:, None] / 10.0 ** (np.arange(D // 2)[None] / (D // 2))
    feeds.update(cos=np.cos(pos).astype(np.float32), sin=np.sin(pos).astype(np.float32))
    return feeds


@pytest.mark.parametrize("kind,per_head,beta,after_transpose", [
    ("rms", True, False, False),     # Qwen3
    ("rms", True, False, True),      # Gemma 3: after the head transpose
    ("rms", False, False, False),    # OLMo 2: over the whole projection
    ("layer", True, True, False),    # Persimmon: LayerNorm with bias, per head
])
def test_fires_and_keeps_the_numbers(kind, per_head, beta, after_transpose):
    g = qk_norm_graph(kind=kind, per_head=per_head, beta=beta, after_transpose=after_transpose)
    res = fuse(g)
    (node,) = [n for n in res.graph.nodes if n.op.kind == "fused_attention_block"]
    op = node.op
    assert isinstance(op.qk_norm, RmsNorm if kind == "rms" else LayerNorm)
    assert op.qk_norm_per_head is per_head and op.qk_norm.has_beta is beta
    assert not res.misses and res.graph.count("rms_norm") + res.graph.count("layer_norm") == 0
    norm_roles = tuple(f"{t}_norm_{p}" for t in "qk" for p in ("gamma", "beta")[:1 + beta])
    assert op.input_roles() == ("x", "w_qkv", "w_o") + norm_roles + ("cos", "sin")
    params = bz.init_params(g, 1)
    for seed in (2, 3):
        feeds = _feeds(g, seed)
        (a,) = bz.interpret(g, feeds, params)
        (b,) = bz.interpret(res.graph, feeds, params)
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    assert_equivalent(g, res.graph)


@pytest.mark.parametrize("per_head", [True, False])
def test_compiled_kernel_and_onnxruntime_export_match(per_head, tmp_path):
    g = qk_norm_graph(per_head=per_head, kind="layer", beta=True)
    params = bz.init_params(g, 4)
    fused = fuse(g).graph
    feeds = _feeds(g, 5)
    (want,) = bz.interpret(g, feeds, params)
    exe = bz.compile(fused, "cpu", params=params, fuse=False)
    np.testing.assert_allclose(exe(feeds)[0], want, rtol=1e-4, atol=1e-5)
    rows = {(label, how) for _, label, how, _ in exe.dispatch_report().rows}
    assert ("fused_attention_block", "native") in rows, rows
    path = bz.export_onnx(fused, tmp_path / "qk.onnx", params=params)
    (got,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_input_graph_is_not_mutated():
    g = qk_norm_graph()
    before = str(g)
    fuse(g)
    assert str(g) == before


# -- must not fire ------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,reason,detail", [
    (dict(roles="q"), MissReason.PATTERN_MISMATCH, "only q"),
    (dict(eps={"q": 1e-6, "k": 1e-5}), MissReason.PATTERN_MISMATCH, "differs"),
    (dict(axis=-2), MissReason.AXIS_MISMATCH, "not the last axis"),
])
def test_unlike_or_partial_qk_norms_stay_with_the_reason(kw, reason, detail):
    g = qk_norm_graph(**kw)
    res = fuse(g)
    assert res.graph.count("fused_attention_block") == 0
    misses = [m for m in res.misses if m.pattern == "FuseAttentionBlock"]
    assert {m.reason for m in misses} == {reason}
    assert any(detail in (m.detail or "") for m in misses), misses
    assert_equivalent(g, res.graph)
