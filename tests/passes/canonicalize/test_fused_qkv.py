"""A per-head fused QKV projection (GPT-NeoX layout) splits into per-block projections so the
attention block fuses; numerics unchanged."""
import numpy as np
from helpers import check_same

import braze as bz

H, D, E = 2, 4, 8


def _neox_attention(g, x, stored: bool):
    rng = np.random.default_rng(0)
    w = g.param("w", bz.Shape((E, 3 * E)),
                value=rng.standard_normal((E, 3 * E)).astype("f4") if stored else None)
    b = g.param("b", bz.Shape((3 * E,)),
                value=rng.standard_normal(3 * E).astype("f4") if stored else None)
    qkv = g.add(g.matmul(x, w), b)
    heads = g.transpose(g.reshape(qkv, ("b", "s", H, 3 * D)), (0, 2, 1, 3))
    q, k, v = (g.narrow(heads, -1, j * D, D) for j in range(3))
    s = g.mul(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), 0.5)
    o = g.matmul(g.softmax(s, -1), v)
    merged = g.reshape(g.transpose(o, (0, 2, 1, 3)), ("b", "s", E))
    return g.matmul(merged, g.param("wo", bz.Shape((E, E))))


def test_per_head_fused_qkv_fuses_into_an_attention_block():
    for stored in (True, False):
        g = bz.Graph("neox")
        x = g.input("x", bz.Shape(("b", "s", E)))
        g.set_outputs([_neox_attention(g, x, stored)])
        fused, report = bz.fuse(g, "cpu")
        assert fused.count("fused_attention_block") == 1, report
        params = bz.init_params(g, 0)
        check_same(g, fused, params=params, symbols={"b": 2, "s": 3})


def _persimmon_attention(g, x, norm_axis: int):
    """[B, S, H, 3, D] fused QKV, q and k gathered and layer-normed (over D, or over [H, D]
    with norm_axis=-2) before the head transpose."""
    rng = np.random.default_rng(1)
    w = g.param("w", bz.Shape((E, 3 * E)), value=rng.standard_normal((E, 3 * E)).astype("f4"))
    qkv = g.reshape(g.matmul(x, w), ("b", "s", H, 3, D))
    dims = (D,) if norm_axis == -1 else (H, D)
    heads = {}
    for j, r in enumerate("qkv"):
        t = g.gather(qkv, g.constant(np.array(j)), 3)
        if r != "v":
            gamma, beta = (g.param(f"{r}_{p}", bz.Shape(dims)) for p in "gb")
            t = g.layer_norm(t, gamma, beta, axis=norm_axis)
        heads[r] = g.transpose(t, (0, 2, 1, 3))
    o = g.attention(heads["q"], heads["k"], heads["v"], kind="causal")
    merged = g.reshape(g.transpose(o, (0, 2, 1, 3)), ("b", "s", E))
    return g.matmul(merged, g.param("wo", bz.Shape((E, E))))


def test_gathered_qkv_with_per_head_norms_fuses_with_the_norm():
    g = bz.Graph("persimmon")
    x = g.input("x", bz.Shape(("b", "s", E)))
    g.set_outputs([_persimmon_attention(g, x, -1)])
    fused, report = bz.fuse(g, "cpu")
    (block,) = [n for n in fused.nodes if n.op.kind == "fused_attention_block"]
    assert block.op.qk_norm is not None and block.op.qk_norm.has_beta, report
    check_same(g, fused, params=bz.init_params(g, 0), symbols={"b": 2, "s": 3})


def test_a_norm_across_heads_keeps_the_gathered_layout():
    g = bz.Graph("across_heads")
    x = g.input("x", bz.Shape(("b", "s", E)))
    g.set_outputs([_persimmon_attention(g, x, -2)])
    fused, report = bz.fuse(g, "cpu")
    assert fused.count("fused_attention_block") == 0
    assert any(m.pattern == "FuseAttentionBlock" for m in report.misses)
    check_same(g, fused, params=bz.init_params(g, 0), symbols={"b": 2, "s": 3})
