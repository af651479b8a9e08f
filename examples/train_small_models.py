"""Compiled training, worked example: a small MLP and a tiny transformer (one BERT encoder layer,
mean-pooled, with a linear head) trained on synthetic regression data with bz.compile_training.

For each model it checks the step-0 gradients against torch.autograd on the same weights (when
torch is installed), trains for a few hundred steps, and prints the loss falling, what fused in
the backward graph and the memory the step holds.

    .venv/bin/python examples/train_small_models.py
"""
from __future__ import annotations

import numpy as np

import braze as bz
from braze.autodiff.reverse import clone_into
from braze.models.bert import bert_encoder


def mlp_regression(batch: int = 32, features: int = 8, hidden: int = 32) -> bz.Graph:
    """Loss graph: mean((gelu(x w1 + b1) w2 + b2 - y)^2), inputs x [batch, features], y."""
    g = bz.Graph("mlp_regression")
    x = g.input("x", bz.Shape((batch, features)))
    y = g.input("y", bz.Shape((batch, 1)))
    h = g.gelu(g.add(g.mm(x, g.param("w1", bz.Shape((features, hidden)))),
                     g.param("b1", bz.Shape((hidden,)))))
    out = g.add(g.mm(h, g.param("w2", bz.Shape((hidden, 1)))), g.param("b2", bz.Shape((1,))))
    g.set_outputs([g.mean(g.square(g.sub(out, y)))])
    return g


def encoder_regression(batch: int = 4, seq: int = 8, hidden: int = 16, heads: int = 2
                       ) -> bz.Graph:
    """Loss graph: one BERT encoder layer on "hidden" [batch, seq, hidden], mean over the
    sequence, a linear head to one number, MSE against "y" [batch, 1]."""
    layer = bert_encoder(1, hidden, heads, batch=batch, seq=seq, eps=1e-5)
    g = bz.Graph("encoder_regression")
    vmap = clone_into(g, layer)
    pooled = g.mean(vmap[layer.outputs[0]], axes=1)
    out = g.add(g.mm(pooled, g.param("head.weight", bz.Shape((hidden, 1)))),
                g.param("head.bias", bz.Shape((1,))))
    g.set_outputs([g.mean(g.square(g.sub(out, g.input("y", bz.Shape((batch, 1))))))])
    return g


def trained_params(g: bz.Graph) -> list[str]:
    return [n.op.name for n in g.params]


def synthetic_data(g: bz.Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs and a smooth target of them (a fixed random projection through sin)."""
    rng = np.random.default_rng(seed)
    x_name = "x" if any(n.op.name == "x" for n in g.inputs) else "hidden"
    x_shape = next(n.op.shape for n in g.inputs if n.op.name == x_name)
    x = rng.normal(size=tuple(int(d) for d in x_shape.dims)).astype(np.float32)
    flat = x.reshape(x.shape[0], -1)
    proj = rng.normal(size=(flat.shape[1], 1)) / np.sqrt(flat.shape[1])
    return {x_name: x, "y": np.sin(2.0 * flat @ proj).astype(np.float32)}


# -- the same models in PyTorch, for the gradient check ---------------------------------------
def torch_loss(g: bz.Graph, params: dict, feeds: dict):
    """The loss of `g` (one of the two models above) computed by PyTorch; returns
    (loss, {name: leaf tensor with requires_grad}). Tensors in `params` are used as they are."""
    import torch
    import torch.nn.functional as F

    t = {k: v if isinstance(v, torch.Tensor) else torch.tensor(np.asarray(v), requires_grad=True)
         for k, v in params.items()}
    y = torch.tensor(feeds["y"])
    if g.name == "mlp_regression":
        x = torch.tensor(feeds["x"])
        out = F.gelu(x @ t["w1"] + t["b1"]) @ t["w2"] + t["b2"]
        return ((out - y) ** 2).mean(), t
    x = torch.tensor(feeds["hidden"])
    b, s, h = x.shape
    heads = 2

    def dense(z, name):
        return z @ t[f"{name}.weight"] + t[f"{name}.bias"]

    def split(z):
        return z.reshape(b, s, heads, h // heads).transpose(1, 2)

    q, k, v = (split(dense(x, f"layer0.attn.{n}")) for n in "qkv")
    ctx = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, h)
    x = F.layer_norm(x + dense(ctx, "layer0.attn.out"), (h,), t["layer0.ln1.gamma"],
                     t["layer0.ln1.beta"], eps=1e-5)
    ffn = dense(F.gelu(dense(x, "layer0.ffn.up")), "layer0.ffn.down")
    x = F.layer_norm(x + ffn, (h,), t["layer0.ln2.gamma"], t["layer0.ln2.beta"], eps=1e-5)
    out = dense(x.mean(1), "head")
    return ((out - y) ** 2).mean(), t


def max_grad_error(g: bz.Graph, params: dict, feeds: dict) -> float:
    """Largest |braze grad - torch grad| over all params, relative to the largest torch grad
    entry, at the given weights (one backward run, no update). Relative to all grads, not per
    param: some are zero in exact arithmetic (attention's key bias) and only rounding remains."""
    step = bz.compile_training(g, trained_params(g), bz.SGD(lr=0.0), params=params)
    step.gradients(feeds)
    loss, t = torch_loss(g, params, feeds)
    loss.backward()
    scale = max(float(np.abs(leaf.grad.numpy()).max()) for leaf in t.values())
    return max(float(np.abs(step.grads[name] - leaf.grad.numpy()).max())
               for name, leaf in t.items()) / scale


def train(g: bz.Graph, optimizer, steps: int, seed: int = 0) -> tuple[list[float], object]:
    """Train `g` on one synthetic batch; returns the loss per step and the TrainingStep."""
    params = bz.init_params(g, seed=seed)
    step = bz.compile_training(g, trained_params(g), optimizer, params=params)
    feeds = synthetic_data(g, seed)
    return [step.step(feeds) for _ in range(steps)], step


def main() -> None:
    for g, opt, steps in ((mlp_regression(), bz.Adam(lr=1e-2), 300),
                          (encoder_regression(), bz.Adam(lr=3e-3), 300)):
        params = bz.init_params(g, seed=0)
        try:
            err = max_grad_error(g, params, synthetic_data(g))
            print(f"{g.name}: step-0 gradients vs torch.autograd, max relative error {err:.1e}")
        except ImportError:
            print(f"{g.name}: torch not installed, gradient check skipped")
        losses, step = train(g, opt, steps)
        print(f"{g.name}: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {steps} steps")
        print(f"  backward graph: {step.report.summary_line()}")
        print(f"  memory: {step.memory()}")


if __name__ == "__main__":
    main()
