"""FoldMatMulScale near a product of two activations (attention scores q @ k^T * scale, left
unfused because the scores are returned): the miss names the real reason (no weight: the right
operand is computed from the inputs), not a SHAPE_MISMATCH about a 4-D "weight"."""
import numpy as np

import braze as bz
from braze.rewrite import MissReason


def test_scaled_activation_product_miss_is_weight_not_constant():
    g = bz.Graph("scores")
    q = g.input("q", bz.Shape((2, 4, 8, 8)))
    k = g.input("k", bz.Shape((2, 4, 8, 8)))
    s = g.mul(g.matmul(q, g.transpose(k, (0, 1, 3, 2))), g.constant(np.float32(0.35)))
    g.set_outputs([g.softmax(s, -1), s])
    fused, report = bz.fuse(g, "cpu")
    misses = [m for m in report.misses if m.pattern == "FoldMatMulScale"]
    assert misses and all(m.reason is MissReason.WEIGHT_NOT_CONSTANT for m in misses), \
        [str(m) for m in misses]
    feeds = bz.random_feeds(g)
    for a, b in zip(bz.interpret(g, feeds), bz.interpret(fused, feeds)):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
