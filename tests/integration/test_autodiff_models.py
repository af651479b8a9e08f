"""Held-out-style integration checks for autodiff (issue 9) on whole models: the builtin models
(BERT, LLaMA, GPT-2 blocks, a ResNet block) fused first, then differentiated with
`bz.grad_with_loss` on a scalar loss; gradients agree with the unfused graph, with forward mode
(`bz.jvp` along a random direction), with finite differences and, for imported Hugging Face
models, with torch.autograd on the same weights; the gradient graph fuses and compiles to the
same numbers; `bz.vmap` matches a loop; `bz.hvp` matches differences of gradients."""
import numpy as np
import pytest

import braze as bz
from braze.autodiff.reverse import clone_into
from braze.models.bert import bert_encoder
from braze.models.gpt2 import gpt2_blocks
from braze.models.llama import llama_decoder
from braze.models.resnet import resnet_basic_block


def with_loss(g: bz.Graph, seed: int = 0) -> bz.Graph:
    """A copy of `g` whose only output is sum(out^2) / 2 + sum(out * r) for out = g's first
    output and a fixed random row r (broadcast along the leading axes)."""
    b = bz.Graph(f"{g.name}_loss")
    vmap = clone_into(b, g)
    out = vmap[g.outputs[0]]
    shape = g.shape_of(g.outputs[0])
    r = np.random.default_rng(seed + 100).standard_normal(shape.dims[-1])
    r = b.constant(r.astype(shape.dtype.np))
    loss = b.add(b.mul(b.sum(b.square(out)), 0.5), b.sum(b.mul(out, r)))
    b.set_outputs([loss])
    return b


def small_models():
    return {
        "bert": bert_encoder(1, 16, 2, batch=2, seq=4, name="bert_small"),
        "llama": llama_decoder(1, 16, 2, 1, batch=2, seq=4, name="llama_small"),
        "gpt2": gpt2_blocks(1, 16, 2, batch=2, seq=4, name="gpt2_small"),
        "resnet": resnet_basic_block(4, 5, batch=2, name="resnet_small"),
    }


def _params(g, seed=0):
    ps = bz.init_params(g, seed)
    for name, v in ps.items():
        if name.endswith(("var", "running_var")) or ".var" in name:
            ps[name] = np.abs(v) + 0.5                                   # batch-norm variances
    return ps


def _wrt(g):
    """Every float param of g and its first float input."""
    names = [n.op.name for n in g.params if n.op.shape.dtype.is_float]
    first = next(n.op.name for n in g.inputs if n.op.shape.dtype.is_float)
    return [first, *[n for n in names if "var" not in n and "mean" not in n]]


MODELS = small_models()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_grad_of_the_fused_model_matches_unfused_forward_mode_and_differences(name):
    g = MODELS[name]
    fused, report = bz.fuse(g, "cpu")
    assert report.nodes_after < report.nodes_before
    wrt = _wrt(g)
    ps = _params(g)
    feeds = bz.random_feeds(g, 1)
    gg = bz.grad_with_loss(with_loss(fused), wrt)
    plain = bz.grad_with_loss(with_loss(g), wrt)
    got = bz.interpret(gg, feeds, ps, float64=True)
    want = bz.interpret(plain, feeds, ps, float64=True)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)
    # forward mode along a random direction in every wrt = <grad, direction>
    rng = np.random.default_rng(2)
    dirs = {n: rng.standard_normal(got[i + 1].shape).astype(np.float32)
            for i, n in enumerate(wrt)}
    jg = bz.jvp(with_loss(fused), wrt)
    tfeeds = {**feeds, **{f"tangent_{n}": d for n, d in dirs.items()}}
    loss, tangent = bz.interpret(jg, tfeeds, ps, float64=True)
    directional = sum(float(np.sum(got[i + 1] * dirs[n])) for i, n in enumerate(wrt))
    np.testing.assert_allclose(loss, got[0], rtol=1e-10)
    np.testing.assert_allclose(tangent, directional, rtol=1e-7)
    # central differences along the same direction
    lg, eps = with_loss(g), 3e-4
    ends = []
    for sgn in (1, -1):
        f = {**feeds, wrt[0]: (feeds[wrt[0]] + sgn * eps * dirs[wrt[0]]).astype(np.float32)}
        p = {**ps, **{n: ps[n] + sgn * eps * dirs[n] for n in wrt[1:]}}
        p = {k: v.astype(np.float32) for k, v in p.items()}
        ends.append(float(bz.interpret(lg, f, p, float64=True)[0]))
    np.testing.assert_allclose((ends[0] - ends[1]) / (2 * eps), directional, rtol=1e-4)


@pytest.mark.parametrize("name", ["gpt2", "resnet"])
def test_the_gradient_graph_fuses_and_compiles_to_the_same_numbers(name):
    g = MODELS[name]
    fused, _ = bz.fuse(g, "cpu")
    wrt = _wrt(g)
    gg = bz.grad_with_loss(with_loss(fused), wrt)
    ps = _params(g)
    feeds = bz.random_feeds(g, 3)
    want = bz.interpret(gg, feeds, ps)
    gfused, report = bz.fuse(gg, "cpu")
    assert report.nodes_after < report.nodes_before                       # backward fuses too
    for a, b in zip(bz.interpret(gfused, feeds, ps), want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    exe = bz.compile(gg, "cpu", params=ps)
    for a, b in zip(exe(feeds), want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)


def test_vmap_of_a_fused_block_matches_a_loop():
    g = MODELS["llama"]
    fused, _ = bz.fuse(g, "cpu")
    vg = bz.vmap(fused)
    ps = _params(g)
    xs = np.random.default_rng(4).standard_normal((3, 2, 4, 16)).astype(np.float32)
    (batched,) = bz.interpret(vg, {"hidden": xs}, ps)
    assert batched.shape == (3, 2, 4, 16)
    for i in range(3):
        (one,) = bz.interpret(fused, {"hidden": xs[i]}, ps)
        np.testing.assert_allclose(batched[i], one, rtol=1e-5, atol=1e-5)


def test_per_example_gradients_by_vmap_of_grad_match_a_loop():
    g = MODELS["gpt2"]
    fused, _ = bz.fuse(g, "cpu")
    gg = bz.grad_with_loss(with_loss(fused), ["layer0.ln1.gamma"])
    vg = bz.vmap(gg, ["hidden"])
    ps = _params(g)
    xs = np.random.default_rng(5).standard_normal((3, 2, 4, 16)).astype(np.float32)
    losses, grads = bz.interpret(vg, {"hidden": xs}, ps)
    for i in range(3):
        loss, grad = bz.interpret(gg, {"hidden": xs[i]}, ps)
        np.testing.assert_allclose(losses[i], loss, rtol=1e-5)
        np.testing.assert_allclose(grads[i], grad, rtol=1e-4, atol=1e-5)


def test_hvp_of_a_fused_block_matches_differences_of_gradients():
    g = MODELS["bert"]
    fused, _ = bz.fuse(g, "cpu")
    lg = with_loss(fused)
    name = "layer0.ffn.up.bias"
    hg = bz.hvp(lg, [name])
    gg = bz.grad_with_loss(lg, [name])
    ps = _params(g)
    feeds = bz.random_feeds(g, 6)
    v = np.random.default_rng(7).standard_normal(ps[name].shape).astype(np.float32)
    (hv,) = bz.interpret(hg, {**feeds, f"tangent_{name}": v}, ps, float64=True)
    eps = 1e-2
    ends = [bz.interpret(gg, feeds, {**ps, name: (ps[name] + s * eps * v).astype(np.float32)},
                         float64=True)[1] for s in (1, -1)]
    np.testing.assert_allclose(hv, (ends[0] - ends[1]) / (2 * eps), rtol=5e-3, atol=1e-4)


# -- imported Hugging Face models vs torch.autograd ------------------------------------------
@pytest.mark.parametrize("family", ["bert", "llama"])
def test_grads_of_an_imported_fused_hf_model_match_torch_autograd(hf_zoo, family):
    torch = pytest.importorskip("torch")
    from braze.models.hf import hf_inputs

    module = hf_zoo.module(family, "sdpa")
    g = hf_zoo.graph(family, "sdpa")
    fused, _ = bz.fuse(g, "cpu")
    lg = with_loss(fused)
    tparams = dict(module.named_parameters())
    wrt = sorted(n for n in lg.weights if n in tparams and ("norm" in n.lower() or "bias" in n
                                                           or "embed_tokens" in n
                                                           or "word_embeddings" in n))
    assert len(wrt) >= 4
    gg = bz.grad_with_loss(lg, wrt)
    feeds = hf_inputs(batch=2, seq=6, vocab=module.vocab_size)
    got = bz.interpret(gg, feeds)
    # torch: the same loss on the same weights
    shape = g.shape_of(g.outputs[0])
    r = np.random.default_rng(100).standard_normal(shape.dims[-1]).astype(np.float32)
    module.zero_grad()
    out = module(*(torch.from_numpy(feeds[n.op.name]) for n in g.inputs))
    out = out[0] if isinstance(out, tuple) else out
    loss = 0.5 * (out ** 2).sum() + (out * torch.from_numpy(r)).sum()
    loss.backward()
    np.testing.assert_allclose(got[0], loss.item(), rtol=1e-4)
    for name, grad in zip(wrt, got[1:], strict=True):
        want = tparams[name].grad.detach().numpy()
        scale = np.abs(want).max() + 1e-6
        np.testing.assert_allclose(grad / scale, want / scale, atol=1e-3, err_msg=name)
