"""BERT encoder as a framework would export it: primitives only (matmul, add, reshape, transpose,
attention, layer_norm, gelu), so fusion passes have real work to do. Also holds the small layer
helpers the other transformer builders share (`dense`, `split_heads`, `merge_heads`, ...).

Param names: `layer{i}.attn.{q,k,v,out}.{weight,bias}` (or `layer{i}.attn.qkv.*` when
qkv="fused"), `layer{i}.ln1.{gamma,beta}` (after attention), `layer{i}.ffn.{up,down}.{weight,
bias}`, `layer{i}.ln2.{gamma,beta}` (after the FFN). Linear weights are [in, out] (`x @ w`)."""
from __future__ import annotations

from ..errors import GraphError
from ..interpret import init_params
from ..ir.graph import Graph
from ..ir.op import Value
from ..ir.shapes import Dim, Shape

__all__ = ["bert_encoder", "bert_base", "bert_tiny", "dense", "split_heads", "merge_heads",
           "store_seed_weights", "head_dim", "norm_params"]


def head_dim(hidden: int, heads: int) -> int:
    """`hidden // heads`, or a GraphError when heads does not divide hidden."""
    if heads <= 0 or hidden % heads:
        raise GraphError(f"heads={heads} must divide hidden={hidden}")
    return hidden // heads


def dense(g: Graph, x: Value, prefix: str, d_in: int, d_out: int, *, bias: bool = True
          ) -> Value:
    """`x @ {prefix}.weight [+ {prefix}.bias]` with new params [d_in, d_out] and [d_out]."""
    y = g.matmul(x, g.param(f"{prefix}.weight", Shape((d_in, d_out))))
    if bias:
        y = g.add(y, g.param(f"{prefix}.bias", Shape((d_out,))))
    return y


def split_heads(g: Graph, x: Value, batch: Dim, seq: Dim, heads: int, dim: int) -> Value:
    """[B, S, H*D] -> [B, H, S, D] (reshape, then transpose)."""
    return g.transpose(g.reshape(x, (batch, seq, heads, dim)), (0, 2, 1, 3))


def merge_heads(g: Graph, x: Value, batch: Dim, seq: Dim, hidden: int) -> Value:
    """[B, H, S, D] -> [B, S, H*D] (transpose, then reshape)."""
    return g.reshape(g.transpose(x, (0, 2, 1, 3)), (batch, seq, hidden))


def norm_params(g: Graph, prefix: str, hidden: int, *, beta: bool = True
                ) -> tuple[Value, Value | None]:
    """New `{prefix}.gamma` (and `{prefix}.beta`) params of shape [hidden]."""
    gamma = g.param(f"{prefix}.gamma", Shape((hidden,)))
    return gamma, (g.param(f"{prefix}.beta", Shape((hidden,))) if beta else None)


def store_seed_weights(g: Graph, seed: int | None) -> Graph:
    """When `seed` is given, store `init_params(g, seed)` as the graph's weights. Returns g."""
    if seed is not None:
        for name, arr in init_params(g, seed).items():
            g.set_weight(name, arr)
    return g


def bert_encoder(
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    intermediate: int | None = None,
    batch: Dim = 1,
    seq: Dim = 128,
    eps: float = 1e-12,
    with_mask: bool = False,
    qkv: str = "separate",
    seed: int | None = None,
    name: str = "bert",
) -> Graph:
    """A post-norm BERT encoder stack: input "hidden" [batch, seq, hidden] (token, position and
    segment embeddings already summed), output the last layer's hidden states.

    `batch` / `seq` may be symbol names ("batch", "seq"). `intermediate` defaults to 4 * hidden.
    qkv="separate" gives three matmul+bias projections of one input (fusion must find the shared
    input); qkv="fused" one [hidden, 3*hidden] projection narrowed into q, k, v. `with_mask` adds
    an input "mask" [batch, 1, 1, seq] of additive scores (0 keep, large negative drop) passed
    to attention as its custom mask. Params carry no weights unless `seed` is given; then
    `bz.init_params(g, seed)` values are stored."""
    if qkv not in ("separate", "fused"):
        raise GraphError(f"bert_encoder qkv must be 'separate' or 'fused', got {qkv!r}")
    d = head_dim(hidden, heads)
    inter = 4 * hidden if intermediate is None else intermediate
    g = Graph(name)
    x = g.input("hidden", Shape((batch, seq, hidden)))
    mask = g.input("mask", Shape((batch, 1, 1, seq))) if with_mask else None
    for i in range(layers):
        p = f"layer{i}"
        if qkv == "fused":
            both = dense(g, x, f"{p}.attn.qkv", hidden, 3 * hidden)
            q, k, v = (g.narrow(both, -1, j * hidden, hidden) for j in range(3))
        else:
            q, k, v = (dense(g, x, f"{p}.attn.{t}", hidden, hidden) for t in "qkv")
        q, k, v = (split_heads(g, t, batch, seq, heads, d) for t in (q, k, v))
        if mask is None:
            ctx = g.attention(q, k, v)
        else:
            ctx = g.attention(q, k, v, mask, kind="custom")
        attn = dense(g, merge_heads(g, ctx, batch, seq, hidden), f"{p}.attn.out", hidden, hidden)
        gamma, beta = norm_params(g, f"{p}.ln1", hidden)
        x = g.layer_norm(g.add(x, attn), gamma, beta, eps=eps)
        up = g.gelu(dense(g, x, f"{p}.ffn.up", hidden, inter))
        ffn = dense(g, up, f"{p}.ffn.down", inter, hidden)
        gamma, beta = norm_params(g, f"{p}.ln2", hidden)
        x = g.layer_norm(g.add(x, ffn), gamma, beta, eps=eps)
    g.set_outputs([x])
    return store_seed_weights(g, seed)


def bert_base(seed: int | None = None) -> Graph:
    """BERT-base: 12 layers, hidden 768, 12 heads, batch 1, seq 128 (what `braze demo` runs)."""
    return bert_encoder(12, 768, 12, batch=1, seq=128, seed=seed, name="bert_base")


def bert_tiny(seed: int | None = None) -> Graph:
    """A tiny BERT for tests: 2 layers, hidden 64, 4 heads, batch 2, seq 8."""
    return bert_encoder(2, 64, 4, batch=2, seq=8, seed=seed, name="bert_tiny")
