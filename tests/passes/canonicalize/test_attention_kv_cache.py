"""A KV-cache decode step's attention (k and v concatenated with a cache, the causal mask built
from past_len + seq the way Hugging Face builds it) canonicalizes to one attention op with the
causal kind (query i sees keys <= past_len + i), the present k / v stay graph outputs, and a
mask with another alignment stays an additive CUSTOM mask."""
import numpy as np
import pytest
from helpers import canonicalize, check_same

import braze as bz
from braze.ir.ops.attention import MaskKind

B, HQ, HKV, D = 2, 4, 2, 8
NEG = float(np.finfo(np.float32).min)
SYMS = [{"b": 2, "past": 5, "seq": 3}, {"b": 1, "past": 4, "seq": 1}]


def _repeat_kv(g, x):
    b, h, s, d = g.shape_of(x).dims
    x5 = g.reshape(x, (b, h, 1, s, d))
    return g.reshape(g.expand(x5, (b, h, HQ // HKV, s, d)), (b, HQ, s, d))


def _decode_mask(g, past, seq, offset=True):
    """HF's decode mask: query positions arange(seq) + past_len against keys arange(past+seq)
    (`offset=False` aligns the first query with the first key instead)."""
    total = f"{past}+{seq}" if isinstance(past, str) else past + seq
    pos = g.arange(seq)
    if offset:
        pos = g.add(pos, g.sym_const((past,), ()))
    ok = g.le(g.reshape(g.arange(total), (1, total)), g.reshape(pos, (seq, 1)))
    return g.reshape(g.where(ok, 0.0, NEG), (1, 1, seq, total))


def decode_step(past="past", seq="seq", *, offset=True, gqa=True):
    """q of the new tokens over concat(cache, new) keys / values; returns the attention output
    and the present k / v (graph outputs, as an exported decode step returns them)."""
    g = bz.Graph("decode")
    hkv = HKV if gqa else HQ
    q = g.input("q", bz.Shape(("b", HQ, seq, D)))
    k_new, v_new = (g.input(n, bz.Shape(("b", hkv, seq, D))) for n in ("k", "v"))
    past_k, past_v = (g.input(n, bz.Shape(("b", hkv, past, D))) for n in ("past_k", "past_v"))
    k, v = g.concat([past_k, k_new], 2), g.concat([past_v, v_new], 2)
    kr, vr = (_repeat_kv(g, t) for t in (k, v)) if gqa else (k, v)
    s = g.mul(g.matmul(q, g.transpose(kr, (0, 1, 3, 2))), D ** -0.5)
    s = g.add(s, _decode_mask(g, past, seq, offset))
    g.set_outputs([g.matmul(g.softmax(s, -1), vr), k, v])
    return g


def _attention(out):
    (node,) = [n for n in out.nodes if n.op.kind == "attention"]
    return node


@pytest.mark.parametrize("gqa", [True, False])
def test_a_decode_mask_from_past_len_becomes_causal_over_the_cache(gqa):
    g = decode_step(gqa=gqa)
    out, _ = canonicalize(g)
    node = _attention(out)
    assert node.op.mask is MaskKind.CAUSAL and len(node.inputs) == 3
    assert out.shape_of(node.inputs[1]).dims == ("b", HKV if gqa else HQ, "past+seq", D)
    assert out.count("where") == 0 and out.count("range") == 0 and out.count("expand") == 0
    # the present k / v are the concats the attention reads, still returned
    assert [out.nodes[v.node].op.kind for v in out.outputs[1:]] == ["concat", "concat"]
    assert list(node.inputs[1:3]) == list(out.outputs[1:])
    for syms in SYMS:
        check_same(g, out, symbols=syms)


@pytest.mark.parametrize("seq, kind", [(3, MaskKind.CAUSAL), (1, MaskKind.NONE)])
def test_static_decode_shapes_become_causal(seq, kind):
    """One new token sees every key: its all-visible mask folds away."""
    g = decode_step(past=5, seq=seq)
    out, _ = canonicalize(g)
    assert _attention(out).op.mask is kind
    check_same(g, out, symbols={"b": 2})


def test_a_mask_aligned_to_the_first_key_stays_custom():
    """Query i seeing keys <= i (no past offset) is not braze's causal pattern over a cache."""
    g = decode_step(offset=False)
    out, _ = canonicalize(g)
    assert _attention(out).op.mask is MaskKind.CUSTOM
    for syms in SYMS:
        check_same(g, out, symbols=syms)


def test_fuse_keeps_the_present_outputs_and_unfuses_back():
    g = decode_step()
    fused, report = bz.fuse(g, "cpu")
    assert fused.count("attention") == 1 and fused.count("concat") == 2
    assert fused.count("softmax") == 0
    for syms in SYMS:
        check_same(g, fused, symbols=syms)
