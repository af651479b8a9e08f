"""A masked fill whose value is a stored scalar param (torch.export lifts GPT-Neo's
`torch.tensor(finfo.min)`) is read like a constant fill: the attention canonicalizes and the
block fuses, with the same numbers."""
import numpy as np

import braze as bz


def test_masked_fill_by_stored_scalar_param_fuses():
    B, S, D, H = 2, 8, 32, 4
    rng = np.random.default_rng(0)
    g = bz.Graph("param_fill")
    x = g.input("x", bz.Shape((B, S, D)))
    keep = g.input("keep", bz.Shape((1, 1, S, S), bz.bool_))

    def proj(n):
        w = g.param("w" + n, bz.Shape((D, D)), value=(rng.standard_normal((D, D)) * .2)
                    .astype(np.float32))
        return g.transpose(g.reshape(g.matmul(x, w), (B, S, H, D // H)), (0, 2, 1, 3))

    q, k, v = proj("q"), proj("k"), proj("v")
    fill = g.param("lifted_tensor_0", bz.Shape(()),
                   value=np.array(np.finfo(np.float32).min, np.float32))
    s = g.where(keep, g.matmul(q, g.transpose(k, (0, 1, 3, 2))), fill)
    o = g.matmul(g.softmax(s, -1), v)
    wo = g.param("wo", bz.Shape((D, D)), value=(rng.standard_normal((D, D)) * .2)
                 .astype(np.float32))
    g.set_outputs([g.matmul(g.reshape(g.transpose(o, (0, 2, 1, 3)), (B, S, D)), wo)])
    fused, report = bz.fuse(g, "cpu")
    bz.verify(fused)
    assert fused.count("fused_attention_block") == 1, [str(m) for m in report.misses]
    feeds = {"x": rng.standard_normal((B, S, D)).astype(np.float32),
             "keep": np.tril(np.ones((S, S), bool))[None, None]}
    np.testing.assert_allclose(bz.interpret(fused, feeds)[0], bz.interpret(g, feeds)[0],
                               rtol=1e-5, atol=1e-6)
