"""The transformations end to end: grad_with_loss on a 2-layer MLP (vs torch.autograd) and on
fused tiny BERT / GPT-2 layers (vs the unfused graph's gradient and finite differences), the
unused / unknown-name errors, jvp vs reverse mode on random graphs (<v, J^T u> == <J v, u>),
hvp vs finite differences of gradients, nth_order_grad of sin / exp / x^3 to order 4, and the
results being ordinary graphs (verify, fuse, compile)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import braze as bz
from braze.autodiff.reverse import clone_into
from braze.errors import AutodiffError
from braze.testing import random_graphs


def _mlp() -> bz.Graph:
    g = bz.Graph("mlp")
    x = g.input("x", bz.Shape((4, 3), bz.f64))
    w1 = g.param("w1", bz.Shape((3, 5), bz.f64))
    b1 = g.param("b1", bz.Shape((5,), bz.f64))
    w2 = g.param("w2", bz.Shape((5, 2), bz.f64))
    y = g.mm(g.gelu(g.add(g.mm(x, w1), b1)), w2)
    g.set_outputs([g.mean(g.square(g.log_softmax(y, 1)))])
    return g


def test_mlp_gradients_match_torch():
    torch = pytest.importorskip("torch")
    g = _mlp()
    params = bz.init_params(g, seed=0)
    xv = np.random.default_rng(0).normal(size=(4, 3))
    gg = bz.grad_with_loss(g, ["w1", "b1", "w2", "x"])
    bz.verify(gg)
    loss, *grads = bz.interpret(gg, {"x": xv}, params)
    t = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    tx = torch.tensor(xv, requires_grad=True)
    y = torch.nn.functional.gelu(tx @ t["w1"] + t["b1"]) @ t["w2"]
    ref = torch.log_softmax(y, 1).square().mean()
    ref.backward()
    np.testing.assert_allclose(loss, ref.item(), rtol=1e-12)
    for got, want in zip(grads, [t["w1"].grad, t["b1"].grad, t["w2"].grad, tx.grad]):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-9, atol=1e-12)


def test_unused_and_unknown_names():
    g = _mlp()
    g.param("lonely", bz.Shape((3,), bz.f64))
    with pytest.raises(AutodiffError, match="does not depend on 'lonely'"):
        bz.grad_with_loss(g, ["w1", "lonely"], unused="error")
    gg = bz.grad_with_loss(g, ["lonely"])
    params = bz.init_params(g, seed=0)
    out = bz.interpret(gg, {"x": np.ones((4, 3))}, params)
    np.testing.assert_array_equal(out[1], np.zeros(3))
    with pytest.raises(AutodiffError, match="no input or param named 'w9'.*'w1'"):
        bz.grad_with_loss(g, ["w9"])
    bad = bz.Graph("vector_loss")
    bad.set_outputs([bad.tanh(bad.input("x", bz.Shape((3,), bz.f64)))])
    with pytest.raises(AutodiffError, match="must be a float scalar"):
        bz.grad_with_loss(bad, ["x"])


def test_hvp_gives_zeros_for_an_entry_the_loss_ignores():
    """As grad_with_loss does (torch.autograd.functional.hvp too): H v is 0 for 'lonely'."""
    g = _mlp()
    g.param("lonely", bz.Shape((3,), bz.f64))
    params = bz.init_params(g, seed=0)
    feeds = {"x": np.ones((4, 3)), "tangent_w1": np.ones((3, 5)), "tangent_lonely": np.ones(3)}
    hv_w1, hv_lonely = bz.interpret(bz.hvp(g, ["w1", "lonely"]), feeds, params)
    (want_w1,) = bz.interpret(bz.hvp(g, ["w1"]), feeds, params)
    np.testing.assert_array_equal(hv_lonely, np.zeros(3))
    np.testing.assert_allclose(hv_w1, want_w1)
    with pytest.raises(AutodiffError, match="does not depend on 'lonely'"):
        bz.hvp(g, ["w1", "lonely"], unused="error")


def _with_loss(g: bz.Graph) -> bz.Graph:
    b = bz.Graph(g.name + "_loss")
    vmap = clone_into(b, g)
    out = vmap[g.outputs[0]]
    b.set_outputs([b.mean(b.mul(b.tanh(out), out))])
    return b


@pytest.mark.parametrize("model", ["bert", "gpt2"])
def test_fused_transformer_layer_gradients(model):
    from braze.models.bert import bert_encoder
    from braze.models.gpt2 import gpt2_blocks

    plain = (bert_encoder(1, 16, 2, batch=1, seq=4, seed=0) if model == "bert"
             else gpt2_blocks(1, 16, 2, batch=1, seq=4, seed=0))
    fused, report = bz.fuse(plain, target="cpu")
    assert any(n.op.fused for n in fused.nodes), report.summary_line()
    names = [p.op.name for p in fused.params]  # fusion may concatenate QKV weights
    plain_names = [p.op.name for p in plain.params]
    g_fused = bz.grad_with_loss(_with_loss(fused), names)
    g_plain = bz.grad_with_loss(_with_loss(plain), plain_names)
    assert not any(n.op.fused for n in g_fused.nodes)
    x = np.random.default_rng(1).normal(size=(1, 4, 16)).astype(np.float32)
    got = bz.interpret(g_fused, {"hidden": x}, float64=True)
    want = dict(zip(plain_names, bz.interpret(g_plain, {"hidden": x}, float64=True)[1:]))
    common = [(gr, want[n]) for n, gr in zip(names, got[1:]) if n in want]
    assert len(common) >= 6
    for a, b in common:
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)
    # directional finite difference over every param of the fused graph at once
    loss = _with_loss(fused)
    rng = np.random.default_rng(2)
    weights = {k: v.astype(np.float64) for k, v in fused.weights.items()}
    direction = {k: rng.normal(size=v.shape) for k, v in weights.items()}
    eps = 4e-3

    def f(t):
        shifted = {k: (weights[k] + t * direction[k]).astype(np.float32) for k in names}
        return float(bz.interpret(loss, {"hidden": x}, shifted, float64=True)[0])

    central = lambda h: (f(h) - f(-h)) / (2 * h)  # noqa: E731
    fd = (4 * central(eps / 2) - central(eps)) / 3  # Richardson: O(eps^4)
    analytic = sum(float((gr * direction[k]).sum()) for k, gr in zip(names, got[1:]))
    assert analytic == pytest.approx(fd, rel=2e-3, abs=1e-6)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(random_graphs(max_nodes=10, symbolic=False))
def test_forward_and_reverse_mode_agree_on_random_graphs(g):
    floats = [n.op.name for n in g.inputs if n.outputs[0].dtype.is_float]
    outs = [v for v in g.outputs if g.shape_of(v).dtype.is_float]
    if not floats or not outs:
        return
    rng = np.random.default_rng(0)
    feeds = bz.random_feeds(g, seed=0)
    params = bz.init_params(g, seed=0)
    us = [rng.normal(size=tuple(g.shape_of(v).dims)) for v in outs]
    loss = bz.Graph("loss")
    vmap = clone_into(loss, g)
    terms = [loss.sum(loss.mul(loss.cast(vmap[v], bz.f64), loss.constant(u, bz.f64)))
             for v, u in zip(outs, us)]
    total = terms[0]
    for t in terms[1:]:
        total = loss.add(total, t)
    loss.set_outputs([total])
    grads = bz.interpret(bz.grad_with_loss(loss, floats), feeds, params, float64=True)[1:]
    tangents = {f"tangent_{n}": rng.normal(size=feeds[n].shape).astype(feeds[n].dtype)
                for n in floats}
    jv = bz.interpret(bz.jvp(g, floats), {**feeds, **tangents}, params, float64=True)
    n_out = len(g.outputs)
    jv_by_value = dict(zip(g.outputs, jv[n_out:]))
    lhs = sum(float((gr * tangents[f"tangent_{n}"]).sum()) for n, gr in zip(floats, grads))
    rhs = sum(float((jv_by_value[v] * u).sum()) for v, u in zip(outs, us))
    assert lhs == pytest.approx(rhs, rel=1e-6, abs=1e-6)


def test_hvp_matches_finite_differences_of_gradients():
    g = _mlp()
    params = bz.init_params(g, seed=0)
    xv = np.random.default_rng(0).normal(size=(4, 3))
    hg = bz.hvp(g, ["w1", "x"])
    rng = np.random.default_rng(3)
    v = {"tangent_w1": rng.normal(size=(3, 5)), "tangent_x": rng.normal(size=(4, 3))}
    got = bz.interpret(hg, {"x": xv, **v}, params)
    gg = bz.grad_with_loss(g, ["w1", "x"])
    eps = 1e-6

    def grads(t):
        p = {**params, "w1": params["w1"] + t * v["tangent_w1"]}
        return bz.interpret(gg, {"x": xv + t * v["tangent_x"]}, p)[1:]

    plus, minus = grads(eps), grads(-eps)
    for h, a, b in zip(got, plus, minus):
        np.testing.assert_allclose(h, (a - b) / (2 * eps), rtol=1e-5, atol=1e-8)


NTH = [
    ("sin", lambda g, x: g.sin(x), lambda n, x: math.sin(x + n * math.pi / 2)),
    ("exp", lambda g, x: g.exp(x), lambda n, x: math.exp(x)),
    ("cube", lambda g, x: g.mul(x, g.square(x)),
     lambda n, x: [x**3, 3 * x**2, 6 * x, 6.0, 0.0][n]),
]


@pytest.mark.parametrize("name,fn,exact", NTH, ids=[r[0] for r in NTH])
@pytest.mark.parametrize("order", [0, 1, 2, 3, 4])
def test_nth_order_grad(name, fn, exact, order):
    g = bz.Graph(name)
    x = g.input("x", bz.Shape((), bz.f64))
    g.set_outputs([fn(g, x)])
    dg = bz.nth_order_grad(g, "x", order)
    for xv in (-0.7, 0.4, 1.3):
        got = bz.interpret(dg, {"x": np.array(xv)})[0]
        assert float(got) == pytest.approx(exact(order, xv), rel=1e-10, abs=1e-10)


def test_directional_nth_grad_matches_hvp():
    g = _mlp()
    params = bz.init_params(g, seed=0)
    xv = np.random.default_rng(0).normal(size=(4, 3))
    v = np.random.default_rng(4).normal(size=(4, 3))
    second = bz.interpret(bz.directional_nth_grad(g, "x", 2), {"x": xv, "tangent_x": v},
                          params)[0]
    hv = bz.interpret(bz.hvp(g, ["x"]), {"x": xv, "tangent_x": v}, params)[0]
    assert float(second) == pytest.approx(float((hv * v).sum()), rel=1e-10)


def test_gradient_graphs_fuse_and_compile():
    g = bz.Graph("mlp32")
    x = g.input("x", bz.Shape((4, 8)))
    w = g.param("w", bz.Shape((8, 8)))
    b = g.param("b", bz.Shape((8,)))
    g.set_outputs([g.mean(g.gelu(g.add(g.mm(x, w), b)))])
    gg = bz.grad_with_loss(g, ["w", "b"])
    print(gg)
    bz.verify(gg)
    assert bz.Graph.parse(str(gg)) == gg
    fused, _ = bz.fuse(gg, target="cpu")
    params = bz.init_params(g, seed=0)
    feeds = {"x": np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)}
    want = bz.interpret(gg, feeds, params)
    got = bz.compile(fused, target="cpu", params=params)(feeds)
    for a, c in zip(want, got):
        np.testing.assert_allclose(np.asarray(c), a, rtol=1e-4, atol=1e-6)
