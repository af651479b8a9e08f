"""fused_matmul_bias_act of bfloat16 operands: its reference returned float32 (NumPy's matmul
promotes bfloat16), while the IR declares bf16 and the compiled executor returns bf16; it now
accumulates in float32 and rounds to the input dtype, as MatMul's reference does."""
import numpy as np
import pytest

import braze as bz


@pytest.mark.parametrize("act", [None, "relu", "gelu"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [bz.bf16, bz.f16])
def test_fused_matmul_keeps_its_declared_half_dtype(dtype, bias, act):
    g = bz.Graph("half")
    x = g.input("x", bz.Shape((3, 8), dtype))
    w = g.param("w", bz.Shape((8, 4), dtype))
    b = g.param("b", bz.Shape((4,), dtype)) if bias else None
    y = g.linear_fused(x, w, b, act)
    g.set_outputs([y])
    params = bz.init_params(g, 0)
    feeds = bz.random_feeds(g, 1)
    (want,) = bz.interpret(g, feeds, params)
    assert want.dtype == dtype.np == g.shape_of(y).dtype.np
    # the same numbers as the decomposition matmul (+ add) (+ act)
    d = bz.Graph("dec")
    dx = d.input("x", bz.Shape((3, 8), dtype))
    dy = d.matmul(dx, d.param("w", bz.Shape((8, 4), dtype)))
    if bias:
        dy = d.add(dy, d.param("b", bz.Shape((4,), dtype)))
    d.set_outputs([dy if act is None else d.activation(dy, act)])
    (dec,) = bz.interpret(d, feeds, params)
    np.testing.assert_array_equal(want.astype(np.float32), dec.astype(np.float32))
    for fuse in (True, False):
        (got,) = bz.compile(g, "cpu", params=params, fuse=fuse)(feeds)
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                                   rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [bz.bf16, bz.f16])
def test_bf16_policy_takes_effect_on_a_half_model(dtype):
    """precision="bf16" on an f16 / bf16 model had no effect: the policy ran before the
    half-precision matmuls moved to float32, and it only lowers float32 ones, so the model ran
    the f32 GEMM. It now runs after, so the policy rounds those operands (the bf16 GEMM runs
    them where the CPU has one) and the numbers are the policy's."""
    from braze.passes.half_compute import compute_half_in_f32
    from braze.passes.precision import apply_precision
    from braze.runtime.kernels import bf16_gemm

    g = bz.Graph("half_policy")
    x = g.input("x", bz.Shape((5, 48), dtype))
    w = g.param("w", bz.Shape((48, 24), dtype))
    g.set_outputs([g.linear_fused(x, w, None, "relu")])
    params = bz.init_params(g, 2)
    feeds = bz.random_feeds(g, 3)
    fused, _ = bz.fuse(g, "cpu")
    policy_graph, lowered = apply_precision(compute_half_in_f32(fused)[0], "bf16")
    assert lowered == 1
    (want,) = bz.interpret(policy_graph, feeds, params)
    exe = bz.compile(g, "cpu", params=params, precision="bf16")
    (got,) = exe(feeds)
    assert got.dtype == dtype.np
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                               rtol=1e-2, atol=1e-2)
    if bf16_gemm.available():
        assert "bf16 GEMM" in str(exe.dispatch_report())
    if dtype == bz.f16:  # f16 operands lose mantissa bits to bf16: the policy's numbers differ
        (plain,) = bz.compile(g, "cpu", params=params)(feeds)
        assert not np.array_equal(plain, got)
