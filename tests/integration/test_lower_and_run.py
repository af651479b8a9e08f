"""Held-out-style integration checks for lowering and legalization (issue 8): graphs that mix
control flow, dot_general, non-last-axis reductions, softmax cross-entropy, group / batch norm
and resize, lowered with `bz.rewrite_for_backend` for several restricted targets; the lowered
graph is legal (`bz.legalize` returns it), the interpreter gives the original's numbers on fresh
random inputs, `bz.dispatch_report` explains the original, and `bz.fuse` / `bz.compile` of the
lowered graph give the same numbers again. Also RLX-style code (the names of RLX's Graph docs)
for an MLP, a transformer block and a conv net: fused, compiled and differentiated."""
import numpy as np
import pytest

import braze as bz
from braze.op_examples import body_graph as body
from braze.passes.legalize import illegal_labels
from braze.testing import assert_equivalent


def S(*dims, dt=bz.f32):
    return bz.Shape(dims, dt)


PRIMITIVES = {"matmul", "binary", "unary", "compare", "reduce", "where", "cast", "reshape",
              "transpose", "narrow", "concat", "expand", "gather", "softmax", "constant"}
CONSTRAINED = bz.get_target("cpu").with_options(
    name="constrained", constraints=frozenset({"reduce_last_axis_only", "trailing_broadcast_only"}))
TARGETS = {
    "primitives": bz.get_target("cpu").restrict(PRIMITIVES, name="primitives"),
    "label_set": PRIMITIVES | {"log_softmax", "layer_norm"},
    "constrained": CONSTRAINED,
    "primitives_constrained": CONSTRAINED.restrict(PRIMITIVES, name="prim_constrained"),
}


def mixed_model(dt=bz.f32):
    """dot_general with a batch dim -> sum over a middle axis -> an `if` on the sign of the
    total -> softmax cross-entropy; a bounded while loop refines the logits; a conv-shaped
    branch runs group norm, 2x nearest resize, inference batch norm and a mean over (1, 2).
    Float tensors are `dt` (float64 for finite differences)."""
    def F(*dims):
        return S(*dims, dt=dt)

    g = bz.Graph("mixed")
    x = g.input("x", F(3, 4, 6))
    labels = g.input("labels", S(3, dt=bz.i32))
    img = g.input("img", F(2, 4, 3, 3))
    w = g.param("w", F(3, 6, 5))
    h = g.dot_general(x, w, (2,), (1,), (0,), (0,))                       # [3, 4, 5]
    r = g.sum(h, axes=(1,))                                                # [3, 5]
    then_g = body("then", [F(3, 5)], lambda b, v: b.tanh(v))
    else_g = body("else", [F(3, 5)], lambda b, v: b.mul(v, 0.5))
    logits = g.cond(g.gt(g.sum(r), 0.0), then_g, else_g, r)
    cond = body("more", [S(dt=bz.i32), F(3, 5)], lambda b, i, v: b.lt(i, 3))
    step = body("step", [S(dt=bz.i32), F(3, 5)],
                lambda b, i, v: (b.add(i, 1), b.add(b.mul(v, 0.9), b.mean(v, axes=(0,)))))
    _, logits = g.while_loop(cond, step, g.constant(np.array(0, np.int32)), logits,
                             max_iterations=4)
    loss = g.softmax_cross_entropy(logits, labels)
    gn = g.group_norm(img, 2, g.param("gn_gamma", F(4)), g.param("gn_beta", F(4)))
    up = g.resize_nearest_2x(gn)                                           # [2, 4, 6, 6]
    bn = g.batch_norm(up, g.param("bn_gamma", F(4)), g.param("bn_beta", F(4)),
                      g.param("bn_mean", F(4)), g.param("bn_var", F(4)))
    pooled = g.mean(bn, axes=(1, 2))                                       # [2, 6]
    g.set_outputs([loss, pooled, logits])
    return g


def _params(g, seed=0):
    ps = bz.init_params(g, seed)
    ps["bn_var"] = np.abs(ps["bn_var"]) + 0.5                              # a variance
    return ps


def _feeds(g, seed):
    feeds = bz.random_feeds(g, seed)
    feeds["labels"] = np.random.default_rng(seed).integers(0, 5, 3).astype(np.int32)
    return feeds


def _check_same(g, low, ps, seeds=(0, 1), rtol=1e-5, atol=1e-5):
    for seed in seeds:
        feeds = _feeds(g, seed)
        want = bz.interpret(g, feeds, ps)
        got = bz.interpret(low, feeds, ps)
        for w, a in zip(want, got, strict=True):
            np.testing.assert_allclose(a, w, rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_mixed_graph_lowers_legalizes_and_keeps_its_numbers(name):
    target = TARGETS[name]
    g = mixed_model()
    before = g.op_counts()
    low = bz.rewrite_for_backend(g, target)
    assert bz.legalize(low, target) is low
    assert illegal_labels(low, target) == []
    kinds = set(low.op_counts())
    composite = {"if", "while", "dot_general", "softmax_cross_entropy", "group_norm",
                 "batch_norm", "resize_nearest_2x"}
    if name == "constrained":                    # claims everything: only constraints bite
        assert composite <= kinds and low is not g
    else:
        assert not kinds & composite
    assert g.op_counts() == before                                       # input not mutated
    _check_same(g, low, _params(g))
    assert bz.rewrite_for_backend(low, target) is low                    # idempotent


@pytest.mark.parametrize("name", ["primitives", "constrained"])
def test_lowered_graph_fuses_and_compiles_to_the_same_numbers(name):
    target = TARGETS[name]
    g = mixed_model()
    ps = _params(g)
    low = bz.rewrite_for_backend(g, target)
    fused, report = bz.fuse(low, target)
    assert illegal_labels(fused, target) == []
    _check_same(g, fused, ps, rtol=1e-4, atol=1e-5)
    exe = bz.compile(low, "cpu", params=ps)
    for seed in (2, 3):
        feeds = _feeds(g, seed)
        want = bz.interpret(g, feeds, ps)
        for w, a in zip(want, exe(feeds), strict=True):
            np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-5)


def test_fusing_for_a_restricted_target_legalizes_the_original_graph():
    target = TARGETS["primitives_constrained"]
    g = mixed_model()
    fused, _ = bz.fuse(g, target)
    assert illegal_labels(fused, target) == []
    _check_same(g, fused, _params(g), rtol=1e-4, atol=1e-5)


def test_dispatch_report_of_the_mixed_graph_names_every_way_an_op_runs():
    g = mixed_model()
    target = TARGETS["primitives"]
    rep = bz.dispatch_report(g, target)
    assert rep.legal and not rep.missing
    per = {label: st for label, (st, _, _) in rep.per_label().items()}
    assert per["matmul" if "matmul" in per else "reduce_sum"] == "native"
    for label in ("dot_general", "group_norm", "batch_norm", "resize_nearest_2x",
                  "softmax_cross_entropy", "if", "while"):
        assert per[label] in ("decomposition", "rewrite"), (label, per[label])
    text = str(rep)
    assert "dispatch of 'mixed' for target 'primitives'" in text
    for label in ("dot_general", "group_norm", "while"):
        assert label in text
    cpu = bz.dispatch_report(g, "cpu")
    assert cpu.legal and cpu.counts()["native"] == len(cpu.nodes)


def test_dispatch_report_for_constraints_says_reductions_are_rewritten():
    g = mixed_model()
    rep = bz.dispatch_report(g, CONSTRAINED)
    assert rep.legal
    sums = [d for d in rep.nodes if d.label in ("reduce_sum", "reduce_mean")]
    assert any(d.status == "rewrite" for d in sums)


def test_a_target_without_where_cannot_lower_control_flow_and_says_which_node():
    g = mixed_model()
    with pytest.raises(bz.LegalizeError, match="where"):
        bz.rewrite_for_backend(g, PRIMITIVES - {"where"})


# -- gradient through control flow and through lowered graphs ---------------------------------
def _fd_grad(g, feeds, ps, name, eps=1e-6):
    """Central finite differences of output 0 (a scalar) in float64 for param `name`."""
    base = ps[name].astype(np.float64)
    out = np.zeros_like(base)
    for idx in np.ndindex(base.shape):
        vals = []
        for sgn in (1, -1):
            p = dict(ps)
            b = base.copy()
            b[idx] += sgn * eps
            p[name] = b
            vals.append(float(bz.interpret(g, feeds, p, float64=True)[0]))
        out[idx] = (vals[0] - vals[1]) / (2 * eps)
    return out


def _scalar_loss_model(dt=bz.f32):
    """The loss output of the mixed model alone (first output, a scalar)."""
    g = mixed_model(dt)
    g.set_outputs([g.outputs[0]])
    return g


def test_grad_through_cond_and_while_matches_finite_differences():
    g = _scalar_loss_model(bz.f64)
    ps = _params(g)
    feeds = _feeds(g, 4)
    gg = bz.grad_with_loss(g, ["w"])
    loss, dw = bz.interpret(gg, feeds, ps, float64=True)
    np.testing.assert_allclose(loss, bz.interpret(g, feeds, ps, float64=True)[0], rtol=1e-12)
    np.testing.assert_allclose(dw, _fd_grad(g, feeds, ps, "w"), rtol=1e-6, atol=1e-8)


def test_grad_of_a_lowered_graph_equals_grad_of_the_original():
    g = _scalar_loss_model()
    ps = _params(g)
    low = bz.rewrite_for_backend(g, TARGETS["primitives_constrained"])
    a = bz.grad_with_loss(g, ["w"])
    b = bz.grad_with_loss(low, ["w"])
    for seed in (5, 6):
        feeds = _feeds(g, seed)
        for x, y in zip(bz.interpret(a, feeds, ps), bz.interpret(b, feeds, ps), strict=True):
            np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-6)
    assert_equivalent(b, bz.rewrite_for_backend(b, TARGETS["primitives"]), rtol=1e-4,
                      atol=1e-5, params=ps, seeds=(0,))


# -- RLX-style code: what a user porting from RLX's Graph docs writes ---------------------------
def rlx_mlp():
    g = bz.Graph("rlx_mlp")
    x = g.input("x", S(6, 10))
    labels = g.input("labels", S(6))                           # RLX: f32-encoded class ids
    h = g.linear_bias_act(x, g.param("w1", S(10, 16)), g.param("b1", S(16)), "gelu")
    h = g.activation("relu", g.binary("add", h, g.param("b2", S(16)), S(6, 16)), S(6, 16))
    logits = g.matmul(h, g.param("w3", S(16, 4)), S(6, 4))
    per_row = g.softmax_cross_entropy_with_logits(logits, labels)
    g.set_outputs([g.reduce(per_row, "mean", [0], False, S()), logits])
    return g


def rlx_transformer_block():
    from braze.ir.ops.attention import MaskKind

    g = bz.Graph("rlx_block")
    x = g.input("x", S(2, 5, 16))
    qkv = g.mm(x, g.param("wqkv", S(16, 48)))
    q, k, v = (g.narrow_(qkv, 2, i * 16, 16) for i in range(3))
    ctx = g.attention_kind(q, k, v, 2, 8, MaskKind.CAUSAL, S(2, 5, 16))
    h = g.ln(g.add(x, g.mm(ctx, g.param("wo", S(16, 16)))), g.param("g1", S(16)),
             g.param("be1", S(16)), 1e-5)
    ffn = g.swiglu_ffn(h, g.param("wg", S(16, 24)), g.param("wu", S(16, 24)),
                       g.param("wd", S(24, 16)))
    y = g.rms_norm(g.add(h, ffn), g.param("g2", S(16)), None, 1e-6)
    g.set_outputs([g.sum(g.sm(y, -1, S(2, 5, 16)), axes=(1,))])
    return g


def rlx_conv_net():
    g = bz.Graph("rlx_conv")
    x = g.input("x", S(2, 3, 6, 6))
    h = g.conv2d(x, g.param("c1", S(8, 3, 3, 3)), (3, 3), (1, 1), (1, 1), (1, 1), 1)
    h = g.relu(g.group_norm(h, g.param("gn_g", S(8)), g.param("gn_b", S(8)), 4, 1e-5))
    h = g.layer_norm2d(g.conv2d(h, g.param("c2", S(8, 8, 1, 1)), (1, 1), (2, 2), (0, 0),
                                (1, 1), 1), g.param("ln_g", S(8)), g.param("ln_b", S(8)), 1e-5)
    up = g.resize_nearest_2x(h)                                            # [2, 8, 6, 6]
    g.set_outputs([g.reduce(up, "mean", [2, 3], False, S(2, 8))])
    return g


def _rlx_feeds(g, seed):
    feeds = bz.random_feeds(g, seed)
    if "labels" in feeds:
        feeds["labels"] = np.random.default_rng(seed).integers(0, 4, 6).astype(np.float32)
    return feeds


RLX_MODELS = {"mlp": rlx_mlp, "block": rlx_transformer_block, "conv": rlx_conv_net}


@pytest.mark.parametrize("name", sorted(RLX_MODELS))
def test_rlx_style_models_fuse_compile_and_lower(name):
    g = RLX_MODELS[name]()
    ps = bz.init_params(g, 0)
    fused, report = bz.fuse(g, "cpu")
    assert report.nodes_after <= report.nodes_before
    exe = bz.compile(g, "cpu", params=ps)
    target = CONSTRAINED.restrict(PRIMITIVES | {"conv2d"}, name="prims_and_conv")
    low = bz.rewrite_for_backend(fused, target)
    assert illegal_labels(low, target) == []
    for seed in (0, 1):
        feeds = _rlx_feeds(g, seed)
        want = bz.interpret(g, feeds, ps)
        for other in (bz.interpret(fused, feeds, ps), exe(feeds), bz.interpret(low, feeds, ps)):
            for w, a in zip(want, other, strict=True):
                np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(RLX_MODELS))
def test_rlx_style_models_differentiate_and_the_gradient_compiles(name):
    g = RLX_MODELS[name]()
    if name != "mlp":                                  # a scalar loss first
        out = g.outputs[0]
        g.set_outputs([g.sum(g.mul(out, out))])
    fused, _ = bz.fuse(g, "cpu")
    wrt = sorted(n.op.name for n in g.params)
    gg = bz.grad_with_loss(fused, wrt)
    ps = bz.init_params(g, 1)
    feeds = _rlx_feeds(g, 2)
    want = bz.interpret(gg, feeds, ps, float64=True)
    rng = np.random.default_rng(3)
    dirs = {n: rng.standard_normal(ps[n].shape).astype(np.float32) for n in wrt}
    outs = bz.interpret(bz.jvp(fused, wrt),
                        {**feeds, **{f"tangent_{n}": d for n, d in dirs.items()}}, ps,
                        float64=True)
    tangent = outs[len(fused.outputs)]                 # [primals..., tangents...]
    np.testing.assert_allclose(tangent, sum(float(np.sum(want[i + 1] * dirs[n]))
                                            for i, n in enumerate(wrt)), rtol=1e-7)
    exe = bz.compile(gg, "cpu", params=ps)
    for w, a in zip(want, exe(feeds), strict=True):
        np.testing.assert_allclose(a, w, rtol=1e-3, atol=1e-4)


def test_rlx_cross_entropy_with_float_labels_is_the_per_row_loss():
    g = bz.Graph("ce")
    logits, labels = g.input("logits", S(3, 4)), g.input("labels", S(3))
    g.set_outputs([g.softmax_cross_entropy_with_logits(logits, labels)])
    a = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    lab = np.array([3.0, 0.0, 2.0], np.float32)
    (out,) = bz.interpret(g, {"logits": a, "labels": lab})
    a64 = a.astype(np.float64)
    logp = a64 - np.log(np.exp(a64).sum(-1, keepdims=True))
    np.testing.assert_allclose(out, -logp[np.arange(3), lab.astype(int)], rtol=1e-5)


def test_rlx_cross_entropy_backward_takes_a_per_row_d_loss():
    g = bz.Graph("ce_bwd")
    logits, labels = g.input("logits", S(3, 4)), g.input("labels", S(3))
    d_loss = g.input("d_loss", S(3))
    g.set_outputs([g.softmax_cross_entropy_backward(logits, labels, d_loss)])
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    lab, d = np.array([1.0, 3.0, 0.0], np.float32), rng.standard_normal(3).astype(np.float32)
    (out,) = bz.interpret(g, {"logits": a, "labels": lab, "d_loss": d})
    soft = np.exp(a.astype(np.float64))
    soft /= soft.sum(-1, keepdims=True)
    np.testing.assert_allclose(out, (soft - np.eye(4)[lab.astype(int)]) * d[:, None], rtol=1e-5,
                               atol=1e-7)


def test_forward_mode_hvp_and_vmap_through_control_flow():
    g = _scalar_loss_model(bz.f64)
    ps = _params(g)
    feeds = _feeds(g, 4)
    d = np.random.default_rng(0).standard_normal(ps["w"].shape)
    gg = bz.grad_with_loss(g, ["w"])
    gw = bz.interpret(gg, feeds, ps)[1]
    loss_t = bz.interpret(bz.jvp(g, ["w"]), {**feeds, "tangent_w": d}, ps)
    np.testing.assert_allclose(loss_t[1], np.sum(gw * d), rtol=1e-9)
    (hv,) = bz.interpret(bz.hvp(g, ["w"]), {**feeds, "tangent_w": d}, ps)
    ends = [bz.interpret(gg, feeds, {**ps, "w": ps["w"] + s * 1e-5 * d})[1] for s in (1, -1)]
    np.testing.assert_allclose(hv, (ends[0] - ends[1]) / 2e-5, rtol=1e-5, atol=1e-8)
    m = mixed_model()                        # vmap: each example takes its own branch
    pm = _params(m)
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((3, 3, 4, 6)).astype(np.float32)
    imgs = rng.standard_normal((3, 2, 4, 3, 3)).astype(np.float32)
    base = _feeds(m, 0)
    batched = bz.interpret(bz.vmap(m, ["x", "img"]), {**base, "x": xs, "img": imgs}, pm)
    for i in range(3):
        one = bz.interpret(m, {**base, "x": xs[i], "img": imgs[i]}, pm)
        for a, b in zip(batched, one, strict=True):
            np.testing.assert_allclose(a[i], b, rtol=1e-5, atol=1e-5)


def test_a_training_run_on_a_lowered_rlx_mlp_lowers_the_loss():
    g = rlx_mlp()
    g.set_outputs([g.outputs[0]])
    low = bz.rewrite_for_backend(g, TARGETS["primitives"])
    wrt = ["w1", "b1", "b2", "w3"]
    step = bz.compile_training(low, wrt, bz.Adam(lr=0.05), params=bz.init_params(g, 0))
    feeds = _rlx_feeds(g, 7)
    losses = [step.step(feeds) for _ in range(15)]
    assert losses[-1] < 0.5 * losses[0]
