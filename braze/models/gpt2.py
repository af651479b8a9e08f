"""GPT-2 transformer blocks as exported from a framework: pre-norm LayerNorm, one fused QKV
projection (GPT-2's c_attn) narrowed into q/k/v, causal attention, tanh-GELU MLP, final LayerNorm.

Param names: `layer{i}.ln1.{gamma,beta}`, `layer{i}.attn.qkv.{weight,bias}` ([E, 3E], q then k
then v), `layer{i}.attn.out.{weight,bias}`, `layer{i}.ln2.{gamma,beta}`,
`layer{i}.ffn.{up,down}.{weight,bias}` (up is [E, 4E]), `final_norm.{gamma,beta}`."""
from __future__ import annotations

from ..ir.graph import Graph
from ..ir.shapes import Dim, Shape
from .bert import dense, head_dim, merge_heads, norm_params, split_heads, store_seed_weights

__all__ = ["gpt2_blocks"]


def gpt2_blocks(
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    batch: Dim = 2,
    seq: Dim = 8,
    eps: float = 1e-5,
    seed: int | None = None,
    name: str = "gpt2",
) -> Graph:
    """GPT-2 decoder blocks: input "hidden" [batch, seq, hidden] (token + position embeddings
    already summed), output the final-LayerNorm hidden states (no LM head).

    `batch` / `seq` may be symbol names. Params carry no weights unless `seed` is given; then
    `bz.init_params(g, seed)` values are stored."""
    d = head_dim(hidden, heads)
    g = Graph(name)
    x = g.input("hidden", Shape((batch, seq, hidden)))
    for i in range(layers):
        p = f"layer{i}"
        gamma, beta = norm_params(g, f"{p}.ln1", hidden)
        h = g.layer_norm(x, gamma, beta, eps=eps)
        c_attn = dense(g, h, f"{p}.attn.qkv", hidden, 3 * hidden)
        q, k, v = (split_heads(g, g.narrow(c_attn, -1, j * hidden, hidden), batch, seq, heads, d)
                   for j in range(3))
        ctx = g.attention(q, k, v, kind="causal")
        x = g.add(x, dense(g, merge_heads(g, ctx, batch, seq, hidden), f"{p}.attn.out",
                           hidden, hidden))
        gamma, beta = norm_params(g, f"{p}.ln2", hidden)
        h = g.layer_norm(x, gamma, beta, eps=eps)
        up = g.gelu_approx(dense(g, h, f"{p}.ffn.up", hidden, 4 * hidden))
        x = g.add(x, dense(g, up, f"{p}.ffn.down", 4 * hidden, hidden))
    gamma, beta = norm_params(g, "final_norm", hidden)
    g.set_outputs([g.layer_norm(x, gamma, beta, eps=eps)])
    return store_seed_weights(g, seed)
