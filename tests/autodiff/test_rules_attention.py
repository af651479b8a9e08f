"""Gradient checks of the attention and rope rules: every mask kind (none, causal, sliding
window, custom, bias), grouped-query heads, explicit scale and softcap; rope rotate-half and
interleaved, partial n_rot, with gradients to the cos / sin tables too. Finite differences at
order 1 (reverse and forward) and 2 (hvp), and torch.autograd for sdpa."""
from __future__ import annotations

import numpy as np
import pytest
from check_grads import build, check_grads, random_feeds, weighted_loss

import braze as bz
from braze.autodiff import grad_with_loss

Q, KV = (1, 4, 3, 4), (1, 2, 5, 4)
ROWS = [
    ("none", lambda g, q, k, v: g.attention(q, k, v), [Q, KV, KV]),
    ("causal", lambda g, q, k, v: g.attention(q, k, v, kind="causal"), [Q, KV, KV]),
    ("window", lambda g, q, k, v: g.attention(q, k, v, kind="sliding_window", window=2),
     [Q, KV, KV]),
    ("custom", lambda g, q, k, v, m: g.attention(q, k, v, m), [Q, KV, KV, (1, 1, 3, 5)]),
    ("bias_softcap_scale", lambda g, q, k, v, m: g.attention(q, k, v, m, kind="bias",
                                                             softcap=1.5, scale=0.6),
     [Q, KV, KV, (4, 3, 5)]),
    ("mqa_causal_softcap", lambda g, q, k, v: g.attention(q, k, v, kind="causal", softcap=2.0),
     [Q, (1, 1, 5, 4), (1, 1, 5, 3)]),
]


@pytest.mark.parametrize("name, fn, shapes", ROWS, ids=[r[0] for r in ROWS])
def test_attention_gradients_match_finite_differences(name, fn, shapes):
    check_grads(fn, shapes, order=1, rtol=1e-5, atol=1e-6, name=name)


@pytest.mark.parametrize("name, fn, shapes", [ROWS[1], ROWS[4]], ids=["causal", "bias"])
def test_attention_second_order(name, fn, shapes):
    check_grads(fn, shapes, order=2, rtol=1e-4, atol=1e-5, name=name)


def test_attention_reverse_mode_uses_one_backward_all():
    g = build(ROWS[3][1], ROWS[3][2])
    loss, _ = weighted_loss(g, 0)
    kinds = [n.op.kind for n in grad_with_loss(loss, ["x0", "x1", "x2", "x3"]).nodes]
    assert kinds.count("attention_backward_all") == 1
    assert kinds.count("attention_backward") == 1  # the mask's cotangent


def test_attention_gradients_match_torch_sdpa_with_gqa():
    torch = pytest.importorskip("torch")
    shapes = [Q, KV, KV, (1, 1, 3, 5)]
    g = build(ROWS[3][1], shapes)
    loss, (r,) = weighted_loss(g, 0)
    feeds = random_feeds(shapes, 0)
    got = bz.interpret(grad_with_loss(loss, ["x0", "x1", "x2", "x3"]), feeds, float64=True)[1:]
    ts = [torch.tensor(feeds[f"x{i}"], requires_grad=True) for i in range(4)]
    out = torch.nn.functional.scaled_dot_product_attention(*ts[:3], attn_mask=ts[3],
                                                           enable_gqa=True)
    (out * torch.tensor(r)).sum().backward()
    for a, t in zip(got, ts):
        np.testing.assert_allclose(a, t.grad.numpy(), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("n_rot", [None, 4])
def test_rope_gradients_including_the_tables(interleaved, n_rot):
    h = (n_rot or 6) // 2
    check_grads(lambda g, x, c, s: g.rope(x, c, s, interleaved, n_rot),
                [(2, 3, 5, 6), (5, h), (5, h)], order=2, rtol=1e-5, atol=1e-6, name="rope")
