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
