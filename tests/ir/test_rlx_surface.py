"""RLX's `Graph` names on braze, written as a user porting RLX code would write them: `ln` is
LayerNorm (the logarithm is `log`), layer_norm2d, group_norm in RLX's argument order, the
attention variants (attention / attention_opts / attention_kind / attention_kind_opts /
attention_bias / attention_ with num_heads, head_dim and an optional checked output shape),
and the graph queries (use_count, topo_order, reverse_topo, has_dynamic_dims,
dynamic_symbols, bind, inspect). Whole blocks built with RLX names are compared with the same
blocks built with braze's names, through the interpreter and through `bz.fuse`."""
import numpy as np
import pytest

import braze as bz
from braze.ir.ops.norm import LayerNorm

RNG = np.random.default_rng(8)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def np_layer_norm(a, gamma, beta, eps, axes=(-1,)):
    a = a.astype(np.float64)
    mu = a.mean(axis=axes, keepdims=True)
    var = ((a - mu) ** 2).mean(axis=axes, keepdims=True)
    return (a - mu) / np.sqrt(var + eps) * gamma + beta


# -- ln is LayerNorm, log is the logarithm -------------------------------------------------------
def test_ln_is_layer_norm_over_the_last_axis_with_rlx_argument_order():
    g = bz.Graph("ln")
    x = g.input("x", bz.Shape((3, 5, 8)))
    gamma, beta = g.param("gamma", bz.Shape((8,))), g.param("beta", bz.Shape((8,)))
    y = g.ln(x, gamma, beta, 1e-3)
    assert g.node(y).op == LayerNorm(1e-3, 2, True, True)
    g.set_outputs([y])
    a, ga, be = rand(3, 5, 8) * 4 + 2, rand(8), rand(8)
    (out,) = bz.interpret(g, {"x": a}, {"gamma": ga, "beta": be})
    np.testing.assert_allclose(out, np_layer_norm(a, ga, be, 1e-3), rtol=1e-4, atol=1e-5)


def test_ln_eps_defaults_to_1e_5_and_none_leaves_out_gamma_or_beta():
    g = bz.Graph("ln")
    x = g.input("x", bz.Shape((4, 6)))
    y = g.ln(x, None, None)
    assert g.node(y).op == LayerNorm(1e-5, 1, False, False)
    g.set_outputs([y])
    a = rand(4, 6)
    (out,) = bz.interpret(g, {"x": a})
    np.testing.assert_allclose(out, np_layer_norm(a, 1.0, 0.0, 1e-5), rtol=1e-4, atol=1e-5)


def test_ln_with_one_argument_says_it_is_layer_norm_and_points_to_log():
    g = bz.Graph("ln")
    x = g.input("x", bz.Shape((4,)))
    with pytest.raises(bz.GraphError, match=r"LayerNorm.*g\.log"):
        g.ln(x)


def test_log_is_the_natural_logarithm():
    g = bz.Graph("log")
    x = g.input("x", bz.Shape((7,)))
    g.set_outputs([g.log(x)])
    a = np.abs(rand(7)) + 0.1
    (out,) = bz.interpret(g, {"x": a})
    np.testing.assert_allclose(out, np.log(a), rtol=1e-6)
    assert g.op_counts() == {"log": 1}


# -- layer_norm2d, group_norm in RLX order -------------------------------------------------------
def test_layer_norm2d_normalizes_channels_at_each_position():
    g = bz.Graph("ln2d")
    x = g.input("x", bz.Shape((2, 6, 3, 4)))
    gamma, beta = g.param("gamma", bz.Shape((6,))), g.param("beta", bz.Shape((6,)))
    g.set_outputs([g.layer_norm2d(x, gamma, beta, 1e-6)])
    assert g.count("layer_norm") == 1
    a, ga, be = rand(2, 6, 3, 4) * 3, rand(6), rand(6)
    (out,) = bz.interpret(g, {"x": a}, {"gamma": ga, "beta": be})
    want = np_layer_norm(a, ga[:, None, None], be[:, None, None], 1e-6, axes=(1,))
    assert out.shape == (2, 6, 3, 4)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_layer_norm2d_refuses_a_tensor_without_spatial_dims():
    g = bz.Graph("ln2d")
    x = g.input("x", bz.Shape((2, 6)))
    with pytest.raises(bz.ShapeError, match="layer_norm2d.*rank >= 3"):
        g.layer_norm2d(x)


def test_group_norm_takes_rlx_argument_order_and_braze_order_alike():
    g = bz.Graph("gn")
    x = g.input("x", bz.Shape((2, 6, 3, 3)))
    gamma, beta = g.param("gamma", bz.Shape((6,))), g.param("beta", bz.Shape((6,)))
    rlx = g.group_norm(x, gamma, beta, 3, 1e-4)
    ours = g.group_norm(x, 3, gamma, beta, eps=1e-4)
    assert g.node(rlx).op == g.node(ours).op and g.node(rlx).inputs == g.node(ours).inputs
    with pytest.raises(bz.GraphError, match="int num_groups"):
        g.group_norm(x, gamma, beta, 2.5)
