"""Backward ops: each reference is the cotangent of its forward op's reference (central finite
differences in float64, odd sizes), matches torch.autograd where torch has the op, and its
decomposition / `LowerBackwardOps` lowering computes the same numbers with primitives only."""
import numpy as np
import pytest

import braze as bz
import braze.testing
from braze.interpret import decomposition_graph
from braze.ir.dtypes import f64
from braze.ir.ops import (
    Attention,
    Conv2d,
    Cumsum,
    Gather,
    GroupNorm,
    LayerNorm,
    MaskKind,
    Pool2d,
    PoolKind,
    RmsNorm,
    Rope,
    Unary,
    UnaryFn,
)
from braze.ir.ops.backward import (
    ActivationBackward,
    CumsumBackward,
    GatherBackward,
    GroupNormBackwardBeta,
    GroupNormBackwardGamma,
    GroupNormBackwardInput,
    LayerNormBackwardGamma,
    LayerNormBackwardInput,
    ReluBackward,
    RmsNormBackwardBeta,
    RmsNormBackwardGamma,
    RmsNormBackwardInput,
    RopeBackward,
)
from braze.ir.ops.backward_attention import AttentionBackward, AttentionBackwardAll, AttentionGrad
from braze.ir.ops.backward_conv import Conv2dBackwardInput, Conv2dBackwardWeight, MaxPool2dBackward
from braze.op_examples import example_graph
from braze.op_examples_backward import BACKWARD_EXAMPLES
from braze.passes.lower.backward import BACKWARD_KINDS, LowerBackwardOps

RNG = np.random.default_rng(11)


def rand(*shape):
    return RNG.standard_normal(shape)


def fd_cotangent(fwd, primals, i, dy, eps=1e-6):
    """d/d primals[i] of sum(dy * fwd(*primals)) by central differences."""
    x = primals[i].copy()
    grad = np.zeros_like(x)
    for j in np.ndindex(x.shape):
        vals = []
        for step in (eps, -eps):
            xs = list(primals)
            xp = x.copy()
            xp[j] += step
            xs[i] = xp
            vals.append(float((dy * fwd(*xs)).sum()))
        grad[j] = (vals[0] - vals[1]) / (2 * eps)
    return grad


def check_against_fd(fwd_op, primals, i, bwd_op, bwd_inputs, tol=1e-6):
    out = fwd_op.reference(*primals)
    dy = rand(*out.shape)
    got = bwd_op.reference(dy, *bwd_inputs)
    if isinstance(got, tuple):
        got = got[i]
    want = fd_cotangent(fwd_op.reference, primals, i, dy)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    return dy, got


def check_decomposition(bwd_op, arrays):
    """The op's decomposition (primitives only) matches its reference in float64."""
    shapes = [bz.Shape(a.shape, f64 if a.dtype.kind == "f" else bz.i64) for a in arrays]
    dec = decomposition_graph(bwd_op, shapes)
    assert not any(n.op.kind in BACKWARD_KINDS for n in dec.nodes)
    got = bz.interpret(dec, {f"x{i}": a for i, a in enumerate(arrays)})
    want = bwd_op.reference(*arrays)
    for a, w in zip(got, want if isinstance(want, tuple) else (want,), strict=True):
        np.testing.assert_allclose(a, w, rtol=1e-9, atol=1e-10)


# -- activations ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", ["gelu", "gelu_approx", "silu", "sigmoid", "tanh", "quick_gelu"])
def test_activation_backward_is_the_derivative(fn):
    x = rand(3, 5) * 2
    op = ActivationBackward(UnaryFn(fn))
    dy, _ = check_against_fd(Unary(UnaryFn(fn)), [x], 0, op, [x])
    check_decomposition(op, [dy, x])


def test_relu_backward_masks_by_the_sign_of_x():
    x = rand(4, 7)
    dy, got = check_against_fd(Unary(UnaryFn.RELU), [x], 0, ReluBackward(), [x])
    np.testing.assert_array_equal(got, np.where(x > 0, dy, 0.0))
    check_decomposition(ReluBackward(), [dy, x])


def test_activation_backward_refuses_a_function_without_a_closed_form():
    g = bz.Graph("t")
    x = g.input("x", bz.Shape((3,)))
    with pytest.raises(bz.ShapeError, match="activation_backward supports"):
        g.activation_backward(x, x, "exp")


# -- norms ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [2, 1])
@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm_backward_input_gamma_beta(axis, affine):
    x = rand(2, 3, 5) * 2 + 0.5
    trailing = x.shape[axis:]
    gamma, beta = rand(*trailing), rand(*trailing)
    fwd = LayerNorm(1e-3, axis, affine, affine)
    prim = [x, gamma, beta] if affine else [x]
    dx_op = LayerNormBackwardInput(1e-3, axis, affine)
    dy, _ = check_against_fd(fwd, prim, 0, dx_op, [x, gamma] if affine else [x])
    check_decomposition(dx_op, [dy, x, gamma] if affine else [dy, x])
    if affine:
        check_against_fd(fwd, prim, 1, LayerNormBackwardGamma(1e-3, axis), [x])
        check_against_fd(fwd, prim, 2, RmsNormBackwardBeta(axis), [])
        check_decomposition(LayerNormBackwardGamma(1e-3, axis), [dy, x])


@pytest.mark.parametrize("axis", [2, 1])
def test_rms_norm_backward_input_gamma_beta(axis):
    x = rand(3, 3, 5)
    trailing = x.shape[axis:]
    fwd = RmsNorm(1e-4, axis, True, True)
    prim = [x, rand(*trailing), rand(*trailing)]
    dy, _ = check_against_fd(fwd, prim, 0, RmsNormBackwardInput(1e-4, axis, True), prim[:2])
    check_against_fd(fwd, prim, 1, RmsNormBackwardGamma(1e-4, axis), [x])
    check_against_fd(fwd, prim, 2, RmsNormBackwardBeta(axis), [])
    check_decomposition(RmsNormBackwardInput(1e-4, axis, True), [dy, *prim[:2]])
    check_decomposition(RmsNormBackwardGamma(1e-4, axis), [dy, x])
    check_decomposition(RmsNormBackwardBeta(axis), [dy])
    check_against_fd(RmsNorm(1e-4, axis), [x], 0, RmsNormBackwardInput(1e-4, axis), [x])


@pytest.mark.parametrize("shape, groups", [((2, 6, 3, 5), 3), ((3, 4), 2), ((2, 3, 5), 1)])
def test_group_norm_backward_input_gamma_beta(shape, groups):
    x = rand(*shape)
    c = shape[1]
    fwd = GroupNorm(groups, 1e-3, True, True)
    prim = [x, rand(c), rand(c)]
    dy, _ = check_against_fd(fwd, prim, 0, GroupNormBackwardInput(groups, 1e-3, True), prim[:2])
    check_against_fd(fwd, prim, 1, GroupNormBackwardGamma(groups, 1e-3), [x])
    check_against_fd(fwd, prim, 2, GroupNormBackwardBeta(groups), [])
    check_decomposition(GroupNormBackwardInput(groups, 1e-3, True), [dy, *prim[:2]])
    check_decomposition(GroupNormBackwardGamma(groups, 1e-3), [dy, x])
    check_decomposition(GroupNormBackwardBeta(groups), [dy])


def test_norm_backward_matches_torch():
    torch = pytest.importorskip("torch")
    x, g, b = rand(3, 4, 6), rand(6), rand(6)
    dy = rand(3, 4, 6)
    tx, tg, tb = (torch.tensor(a, requires_grad=True) for a in (x, g, b))
    torch.nn.functional.layer_norm(tx, (6,), tg, tb, 1e-5).backward(torch.tensor(dy))
    np.testing.assert_allclose(LayerNormBackwardInput(1e-5, 2, True).reference(dy, x, g),
                               tx.grad.numpy(), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(LayerNormBackwardGamma(1e-5, 2).reference(dy, x),
                               tg.grad.numpy(), rtol=1e-9, atol=1e-10)
    xi, gi, dyi = rand(2, 6, 5), rand(6), rand(2, 6, 5)
    tx, tg = (torch.tensor(a, requires_grad=True) for a in (xi, gi))
    torch.nn.functional.group_norm(tx, 3, tg, None, 1e-5).backward(torch.tensor(dyi))
    np.testing.assert_allclose(GroupNormBackwardInput(3, 1e-5, True).reference(dyi, xi, gi),
                               tx.grad.numpy(), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(GroupNormBackwardGamma(3, 1e-5).reference(dyi, xi),
                               tg.grad.numpy(), rtol=1e-9, atol=1e-10)


# -- rope, cumsum, gather ------------------------------------------------------------------------
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("n_rot", [None, 4])
def test_rope_backward_is_the_inverse_rotation(interleaved, n_rot):
    x = rand(2, 3, 5, 6)
    h = (n_rot or 6) // 2
    ang = rand(5, h)
    cos, sin = np.cos(ang), np.sin(ang)
    op = RopeBackward(interleaved, n_rot)
    dy, _ = check_against_fd(Rope(interleaved, n_rot), [x, cos, sin], 0, op, [cos, sin])
    check_decomposition(op, [dy, cos, sin])


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum_backward(exclusive, reverse):
    x = rand(3, 7)
    op = CumsumBackward(1, exclusive, reverse)
    dy, _ = check_against_fd(Cumsum(1, exclusive, reverse), [x], 0, op, [])
    check_decomposition(op, [dy])


@pytest.mark.parametrize("axis, idx", [(0, np.array([4, 0, 4, -1, 2])),
                                       (1, np.array([[1, 1], [0, -3]]))])
def test_gather_backward_scatter_adds_repeated_indices(axis, idx):
    x = rand(5, 3, 2)
    op = GatherBackward(axis, x.shape[axis])
    dy, _ = check_against_fd(Gather(axis), [x, idx], 0, op, [idx])
    check_decomposition(op, [dy, idx])
    torch = pytest.importorskip("torch")
    tx = torch.tensor(x, requires_grad=True)
    ti = torch.tensor(np.where(idx < 0, idx + x.shape[axis], idx))
    out = torch.index_select(tx, axis, ti.reshape(-1)).reshape(dy.shape)
    out.backward(torch.tensor(dy))
    np.testing.assert_allclose(op.reference(dy, idx), tx.grad.numpy(), rtol=1e-12)


# -- conv and pool -------------------------------------------------------------------------------
CONV_CASES = [
    dict(x=(2, 3, 7, 6), w=(4, 3, 3, 2), stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
         groups=1),
    dict(x=(1, 4, 7, 9), w=(6, 2, 3, 3), stride=(2, 3), padding=(1, 2, 0, 1), dilation=(1, 1),
         groups=2),
    dict(x=(2, 3, 9, 8), w=(3, 1, 2, 3), stride=(2, 1), padding=(1, 1, 1, 1), dilation=(2, 2),
         groups=3),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=["plain", "groups_stride_pad", "depthwise_dil"])
def test_conv2d_backward_input_and_weight(case):
    x, w = rand(*case["x"]), rand(*case["w"])
    attrs = dict(stride=case["stride"], padding=case["padding"], dilation=case["dilation"],
                 groups=case["groups"])
    fwd = Conv2d(**attrs)
    dx_op = Conv2dBackwardInput(**attrs, input_hw=case["x"][2:])
    dw_op = Conv2dBackwardWeight(**attrs, kernel=case["w"][2:])
    check_against_fd(fwd, [x, w], 1, dw_op, [x])
    dy, dx = check_against_fd(fwd, [x, w], 0, dx_op, [w])
    dw = dw_op.reference(dy, x)
    check_decomposition(dx_op, [dy, w])
    check_decomposition(dw_op, [dy, x])
    torch = pytest.importorskip("torch")
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    t, left, b, r = case["padding"]
    out = torch.nn.functional.conv2d(torch.nn.functional.pad(tx, (left, r, t, b)), tw,
                                     stride=case["stride"], dilation=case["dilation"],
                                     groups=case["groups"])
    out.backward(torch.tensor(dy))
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("kernel, stride, padding", [((2, 2), (2, 2), (0, 0, 0, 0)),
                                                      ((3, 2), (1, 2), (1, 0, 1, 1)),
                                                      ((3, 3), (2, 2), (1, 1, 1, 1))])
def test_maxpool2d_backward_routes_to_the_first_maximum(kernel, stride, padding):
    x = rand(2, 3, 7, 6)
    op = MaxPool2dBackward(kernel, stride, padding)
    dy, got = check_against_fd(Pool2d(PoolKind.MAX, kernel, stride, padding), [x], 0, op, [x])
    check_decomposition(op, [dy, x])
    tied = np.round(x)  # many ties: the first maximum in window order wins
    check_decomposition(op, [dy, tied])
    torch = pytest.importorskip("torch")
    for a in (x, tied):
        tx = torch.tensor(a, requires_grad=True)
        t, left, b, r = padding
        padded = torch.nn.functional.pad(tx, (left, r, t, b), value=-np.inf)
        torch.nn.functional.max_pool2d(padded, kernel, stride).backward(torch.tensor(dy))
        np.testing.assert_allclose(op.reference(dy, a), tx.grad.numpy(), rtol=1e-12)


# -- attention -----------------------------------------------------------------------------------
ATTN_CASES = [
    dict(mask=MaskKind.NONE),
    dict(mask=MaskKind.CAUSAL, sq=3, sk=5),
    dict(mask=MaskKind.SLIDING_WINDOW, window=2),
    dict(mask=MaskKind.CUSTOM, sq=3, m=(1, 1, 3, 5)),
    dict(mask=MaskKind.BIAS, sq=3, m=(4, 3, 5), softcap=2.0),
    dict(mask=MaskKind.CAUSAL, softcap=1.5, scale=0.7, hq=4, hkv=1),
    dict(mask=MaskKind.NONE, hq=4, hkv=2, dv=3),
]


def _attn_inputs(case):
    hq, hkv = case.get("hq", 4), case.get("hkv", 2)
    sq, sk, d, dv = case.get("sq", 5), case.get("sk", 5), 3, case.get("dv", 3)
    arrays = [rand(2, hq, sq, d), rand(2, hkv, sk, d), rand(2, hkv, sk, dv)]
    if "m" in case:
        arrays.append(rand(*case["m"]))
    op = Attention(case["mask"], case.get("window", 0), case.get("scale"), case.get("softcap"))
    return op, arrays


@pytest.mark.parametrize("case", ATTN_CASES,
                         ids=["none", "causal", "window", "custom", "bias_softcap",
                              "mqa_causal_softcap_scale", "gqa_dv"])
def test_attention_backward_every_input(case):
    fwd, arrays = _attn_inputs(case)
    attrs = dict(mask=fwd.mask, window=fwd.window, scale=fwd.scale, softcap=fwd.softcap)
    all_op = AttentionBackwardAll(**attrs)
    wrts = [AttentionGrad.Q, AttentionGrad.K, AttentionGrad.V] + (
        [AttentionGrad.MASK] if len(arrays) == 4 else [])
    for i, wrt in enumerate(wrts):
        one = AttentionBackward(**attrs, wrt=wrt)
        dy, got = check_against_fd(fwd, arrays, i, one, arrays, tol=1e-5)
        check_decomposition(one, [dy, *arrays])
        if i < 3:
            np.testing.assert_allclose(all_op.reference(dy, *arrays)[i], got, rtol=1e-12)
    check_decomposition(all_op, [dy, *arrays])


@pytest.mark.parametrize("case", ATTN_CASES[:4] + ATTN_CASES[5:],
                         ids=["none", "causal", "window", "custom", "mqa", "gqa_dv"])
def test_attention_backward_matches_torch_sdpa(case):
    torch = pytest.importorskip("torch")
    fwd, arrays = _attn_inputs(case)
    if fwd.softcap is not None:
        pytest.skip("torch sdpa has no softcap")
    q, k, v = (torch.tensor(a, requires_grad=True) for a in arrays[:3])
    sq, sk = q.shape[2], k.shape[2]
    mask = None
    if fwd.mask.is_causal:
        from braze.ir.ops.attention import visible_keys

        mask = torch.tensor(visible_keys(fwd.mask, sq, sk, fwd.window))
    elif len(arrays) == 4:
        mask = torch.tensor(arrays[3])
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                           scale=fwd.scale, enable_gqa=True)
    dy = rand(*out.shape)
    out.backward(torch.tensor(dy))
    op = AttentionBackwardAll(fwd.mask, fwd.window, fwd.scale, fwd.softcap)
    for got, t in zip(op.reference(dy, *arrays), (q, k, v), strict=True):
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-9, atol=1e-10)


def test_attention_backward_of_a_fully_masked_query_is_zero():
    q, k, v = rand(1, 1, 2, 3), rand(1, 1, 3, 3), rand(1, 1, 3, 3)
    m = np.zeros((1, 1, 2, 3))
    m[0, 0, 1] = -np.inf
    op = AttentionBackwardAll(MaskKind.CUSTOM)
    dq, dk, dv = op.reference(rand(1, 1, 2, 3), q, k, v, m)
    assert np.all(dq[0, 0, 1] == 0) and np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))


def test_attention_backward_errors_name_the_op():
    g = bz.Graph("t")
    q = g.input("q", bz.Shape((1, 2, 3, 4)))
    with pytest.raises(bz.ShapeError, match="attention_backward.*dy"):
        g.attention_backward(g.input("dy", bz.Shape((1, 2, 3, 5))), q, q, q)
    with pytest.raises(bz.ShapeError, match="wrt=mask needs"):
        g.attention_backward(q, q, q, q, wrt="mask")


# -- every backward kind: example, lowering, text IR ---------------------------------------------
def test_every_backward_kind_has_an_example_and_the_lowering_covers_it():
    assert set(BACKWARD_EXAMPLES) == set(BACKWARD_KINDS)


@pytest.mark.parametrize("kind", sorted(BACKWARD_KINDS))
def test_lower_backward_ops_matches_the_reference(kind):
    g = example_graph(kind)
    low = LowerBackwardOps(g)
    assert low is not g and not any(n.op.kind in BACKWARD_KINDS for n in low.nodes)
    assert any(n.op.kind == kind for n in g.nodes)  # the input graph is unchanged
    params = bz.init_params(g, 0)
    braze.testing.assert_equivalent(g, low, params=params, rtol=1e-5, atol=1e-6)
    assert bz.Graph.parse(str(g)) == g


def test_lowering_does_not_fire_without_backward_ops():
    g = example_graph("layer_norm")
    result = LowerBackwardOps.run(g)
    assert not result.changed and result.graph is g
