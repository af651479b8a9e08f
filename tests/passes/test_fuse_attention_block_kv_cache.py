"""FuseAttentionBlock on a KV-cache decode step (k, v = concat(past, new) on the sequence
axis): it fires with `kv_cache` (GPT-2's packed QKV, LLaMA's separate projections with GQA and
rope, causal or additive masks, symbolic past / seq), the present keys / values come out of the
block where the graph returns them, a cache it cannot express is a reported miss, and the
numbers hold through fuse -> unfuse and in the compiled executor (f32 and bf16)."""
import numpy as np
import pytest

import braze as bz
from braze.ir.ops.attention import MaskKind
from braze.passes.precision import apply_precision
from braze.rewrite import MissReason
from braze.runtime.kernels import Dispatch
from braze.testing import assert_equivalent

E, D = 32, 8
SYMS = ({"b": 2, "past": 5, "seq": 1}, {"b": 1, "past": 7, "seq": 3})


def decode_block(*, heads=4, kv_heads=4, packed=False, rope=False, mask="causal",
                 returns_present=True, cache_axis=2, cache_of="x"):
    """One attention block of a decode step on x [b, seq, E] with a [b, Hkv, past, D] cache;
    returns (y, present_k, present_v) like an exported decoder (y alone unless
    `returns_present`). `cache_of="x_kv"` projects k, v from a second input."""
    g = bz.Graph("decode_block")
    x = g.input("x", bz.Shape(("b", "seq", E)))
    src = {"q": x, "k": x, "v": x}
    if cache_of == "x_kv":
        src["k"] = src["v"] = g.input("x_kv", bz.Shape(("b", "seq", E)))
    past_heads = kv_heads if cache_axis == 2 else heads - kv_heads
    past_len = "past" if cache_axis == 2 else "seq"
    past = {r: g.input(f"past_{r}", bz.Shape(("b", past_heads, past_len, D))) for r in "kv"}
    widths = {"q": heads * D, "k": kv_heads * D, "v": kv_heads * D}
    if packed:
        qkv = g.add(g.mm(x, g.param("w_qkv", bz.Shape((E, sum(widths.values()))))),
                    g.param("b_qkv", bz.Shape((sum(widths.values()),))))
        starts = {"q": 0, "k": widths["q"], "v": widths["q"] + widths["k"]}
        proj = {r: g.narrow(qkv, -1, starts[r], widths[r]) for r in "qkv"}
    else:
        proj = {r: g.mm(src[r], g.param(f"w_{r}", bz.Shape((E, widths[r])))) for r in "qkv"}
    hs = {"q": heads, "k": kv_heads, "v": kv_heads}
    t = {r: g.transpose(g.reshape(proj[r], ("b", "seq", hs[r], D)), (0, 2, 1, 3)) for r in "qkv"}
    if rope:
        cos, sin = (g.input(n, bz.Shape(("seq", D // 2))) for n in ("cos", "sin"))
        t["q"], t["k"] = (g.rope(t[r], cos, sin) for r in "qk")
    present = {r: g.concat([past[r], t[r]], cache_axis) for r in "kv"}
    m = None
    if mask == "custom":
        m = g.input("mask", bz.Shape(("b", 1, 1, "past+seq")))
    o = g.attention(t["q"], present["k"], present["v"], m, kind=mask)
    y = g.mm(g.reshape(g.transpose(o, (0, 2, 1, 3)), ("b", "seq", heads * D)),
             g.param("w_o", bz.Shape((heads * D, E))))
    g.set_outputs([y, present["k"], present["v"]] if returns_present else [y])
    return g


def _blocks(g):
    return [n for n in g.nodes if n.op.kind == "fused_attention_block"]


def _check(g, fused):
    for syms in SYMS:
        assert_equivalent(g, fused, symbols=syms)
        assert_equivalent(g, bz.unfuse_fused_for_autodiff(fused), symbols=syms)


CASES = {
    "gpt2_packed_causal": dict(packed=True),
    "llama_gqa_rope": dict(kv_heads=2, rope=True),
    "padding_mask": dict(mask="custom"),
    "no_mask": dict(mask=None),
}


@pytest.mark.parametrize("case", CASES)
def test_a_decode_step_fuses_with_its_cache(case):
    g = decode_block(**CASES[case])
    fused, report = bz.fuse(g, "cpu")
    (block,) = _blocks(fused)
    assert block.op.kv_cache and fused.count("attention") == 0
    past = [n.values[0] for n in fused.inputs if n.op.name.startswith("past_")]
    assert list(block.inputs[-2:]) == past and not fused.users(past[0])[1:]
    assert block.op.mask is (MaskKind.NONE if CASES[case].get("mask", "causal") is None
                             else MaskKind(CASES[case].get("mask", "causal")))
    assert [v.node for v in fused.outputs] == [block.id] * 3
    assert [v.index for v in fused.outputs] == [0, 1, 2]
    assert not [m for m in report.missed if m.pattern == "FuseAttentionBlock"]
    _check(g, fused)


def test_present_keys_nobody_reads_still_fuse():
    g = decode_block(returns_present=False)
    fused, _ = bz.fuse(g, "cpu")
    (block,) = _blocks(fused)
    assert block.op.kv_cache and len(fused.outputs) == 1
    _check(g, fused)


@pytest.mark.parametrize("variant, reason, words", [
    (dict(cache_of="x_kv", mask=None), MissReason.PATTERN_MISMATCH, "second input"),
    (dict(cache_axis=1, kv_heads=2), MissReason.AXIS_MISMATCH, "axis 1"),
])
def test_a_cache_the_block_cannot_express_is_a_reported_miss(variant, reason, words):
    g = decode_block(**variant)
    fused, report = bz.fuse(g, "cpu")
    assert not _blocks(fused) and fused.count("attention") == 1
    (miss,) = [m for m in report.missed if m.pattern == "FuseAttentionBlock"]
    assert miss.reason is reason and words in miss.detail and "cache" in miss.hint
    syms = {"b": 2, "past": 5, "seq": 3}
    assert_equivalent(g, fused, symbols=syms)


@pytest.mark.parametrize("precision", [None, "bf16"])
@pytest.mark.parametrize("case", ["gpt2_packed_causal", "llama_gqa_rope"])
def test_the_compiled_block_appends_to_the_cache_natively(case, precision):
    g = decode_block(**CASES[case])
    params = bz.init_params(g, 0)
    exe = bz.compile(g, "cpu", params=params, precision=precision)
    want_graph = exe.graph if precision is None else apply_precision(bz.fuse(g)[0], "bf16")[0]
    for syms in SYMS:
        feeds = bz.random_feeds(g, 0, syms)
        rows = [r for r in exe.dispatch_report(feeds).rows if r[1] == "fused_attention_block"]
        assert rows and all(r[2] == Dispatch.NATIVE and "appended to the cache" in r[3]
                            for r in rows), rows
        got = exe(feeds)
        want = bz.interpret(want_graph, feeds, params)
        tol = 1e-5 if precision is None else 4e-3
        for a, w in zip(got, want):
            assert np.abs(a - w).max() <= tol * (1 + np.abs(w).max())
        # the cache comes back as it went in, whatever the precision
        p = syms["past"]
        np.testing.assert_array_equal(got[1][:, :, :p], feeds["past_k"])
        np.testing.assert_array_equal(got[2][:, :, :p], feeds["past_v"])


def _pre_norm_layer(returns_present: bool):
    """GPT-2's pre-norm layer around a decode step's attention: h = x + attn(ln1(x)),
    out = h + mlp(ln2(h))."""
    g = bz.Graph("decode_layer")
    x = g.input("x", bz.Shape((2, 1, E)))
    cache = {r: g.input(f"past_{r}", bz.Shape((2, 4, 5, D))) for r in "kv"}

    def ln(t, i):
        return g.layer_norm(t, g.param(f"ln{i}_g", bz.Shape((E,))),
                            g.param(f"ln{i}_b", bz.Shape((E,))))

    a = ln(x, 1)
    t = {r: g.transpose(g.reshape(g.add(g.mm(a, g.param(f"w_{r}", bz.Shape((E, E)))),
                                        g.param(f"b_{r}", bz.Shape((E,)))), (2, 1, 4, D)),
                        (0, 2, 1, 3)) for r in "qkv"}
    k, v = (g.concat([cache[r], t[r]], 2) for r in "kv")
    o = g.attention(t["q"], k, v, kind="causal")
    h = g.add(x, g.add(g.mm(g.reshape(g.transpose(o, (0, 2, 1, 3)), (2, 1, E)),
                            g.param("w_o", bz.Shape((E, E)))), g.param("b_o", bz.Shape((E,)))))
    up = g.gelu(g.add(g.mm(ln(h, 2), g.param("w1", bz.Shape((E, 2 * E)))),
                      g.param("b1", bz.Shape((2 * E,)))))
    y = g.add(h, g.add(g.mm(up, g.param("w2", bz.Shape((2 * E, E)))),
                       g.param("b2", bz.Shape((E,)))))
    g.set_outputs([y, k, v] if returns_present else [y])
    return g


@pytest.mark.parametrize("returns_present", [True, False])
def test_a_whole_layer_keeps_the_block_with_its_cache_and_says_why(returns_present):
    """FusedTransformerLayer has one output: the block with a cache stays, its MLP and norms
    fuse on their own, and the report names the cache (or the present keys returned)."""
    g = _pre_norm_layer(returns_present)
    fused, report = bz.fuse(g, "cpu", transformer_layer=True)
    (block,) = _blocks(fused)
    assert block.op.kv_cache and fused.count("fused_transformer_layer") == 0
    (miss,) = [m for m in report.missed if m.pattern == "FuseTransformerLayer"]
    if returns_present:
        assert miss.reason is MissReason.GRAPH_OUTPUT
    else:
        assert miss.reason is MissReason.PATTERN_MISMATCH and "KV cache" in miss.detail
    assert_equivalent(g, fused)


def test_the_builder_makes_the_block_the_fusion_makes():
    g = decode_block(packed=True)
    fused, _ = bz.fuse(g, "cpu")
    (block,) = _blocks(fused)
    b = bz.Graph("built")
    x = b.input("x", bz.Shape(("b", "seq", E)))
    pk, pv = (b.input(n, bz.Shape(("b", 4, "past", D))) for n in ("past_k", "past_v"))
    w_qkv, b_qkv = b.param("w_qkv", bz.Shape((E, 96))), b.param("b_qkv", bz.Shape((96,)))
    w_o = b.param("w_o", bz.Shape((32, E)))
    outs = b.fused_attention_block(x, w_qkv, w_o, b_qkv, num_heads=4, mask_kind="causal",
                                   past_k=pk, past_v=pv)
    b.set_outputs(list(outs))
    (built,) = _blocks(b)
    assert built.op == block.op and len(outs) == 3
    for syms in SYMS:
        assert_equivalent(b, bz.unfuse_fused_for_autodiff(b), symbols=syms)
