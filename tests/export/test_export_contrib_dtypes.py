"""target="onnxruntime" writes ORT contrib ops only for the element types they take (float,
float16): an f64 graph's fused residual norms, attention, rope and matmul epilogues are written
as standard ops, and the model loads and runs in ONNX Runtime to braze's numbers."""
import numpy as np
import onnxruntime as ort
import pytest

import braze as bz
from braze.export.onnx import to_onnx_model

S = bz.Shape


def _graph(kind, dt):
    g = bz.Graph(kind)
    if kind in ("residual_ln", "residual_rms"):
        x, r = g.input("x", S((2, 5, 16), dt)), g.input("r", S((2, 5, 16), dt))
        fn = g.fused_residual_ln if kind == "residual_ln" else g.fused_residual_rms_norm
        y = fn(x, r, g.param("g", S((16,), dt)), expose_sum=True)
        g.set_outputs(list(y))
        return g
    if kind == "attention":
        q = g.input("q", S((2, 2, 5, 8), dt))
        y = g.attention(q, q, q, kind="causal")
    elif kind == "attention_block":
        x = g.input("x", S((2, 5, 16), dt))
        y = g.fused_attention_block(x, g.param("w", S((16, 48), dt)),
                                    g.param("wo", S((16, 16), dt)), num_heads=2)
    elif kind == "rope":
        x = g.input("x", S((2, 2, 5, 8), dt))
        y = g.rope(x, g.input("cos", S((5, 4), dt)), g.input("sin", S((5, 4), dt)))
    else:  # matmul + bias + tanh-form gelu
        x = g.input("x", S((2, 5, 16), dt))
        y = g.linear_fused(x, g.param("w", S((16, 8), dt)), g.param("b", S((8,), dt)),
                           "gelu_approx")
    g.set_outputs([y])
    return g


KINDS = ["residual_ln", "residual_rms", "attention", "attention_block", "rope", "matmul_gelu"]


@pytest.mark.parametrize("kind", KINDS)
def test_f64_graphs_use_standard_ops_and_run(kind):
    g = _graph(kind, bz.f64)
    params = {k: np.asarray(v, np.float64) for k, v in bz.init_params(g, 0).items()}
    model = to_onnx_model(g, "onnxruntime", params=params)
    assert not [n.op_type for n in model.graph.node if n.domain == "com.microsoft"]
    feeds = bz.random_feeds(g, 1)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, want in zip(sess.run(None, feeds), bz.interpret(g, feeds, params), strict=True):
        assert got.dtype == want.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_f32_graphs_keep_their_contrib_op(kind):
    g = _graph(kind, bz.f32)
    model = to_onnx_model(g, "onnxruntime", params=bz.init_params(g, 0))
    assert [n.op_type for n in model.graph.node if n.domain == "com.microsoft"]
