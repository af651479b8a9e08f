"""LLaMA decoder layers as exported from a framework: pre-norm RMSNorm, separate bias-free q/k/v
projections with grouped-query heads, rotate-half RoPE on q and k, causal attention, o_proj,
and a SwiGLU MLP written as separate gate/up/down matmuls; a final RMSNorm.

Param names: `layer{i}.ln1.gamma`, `layer{i}.attn.{q,k,v,out}.weight` (k/v are [E, Hkv*D]),
`layer{i}.ln2.gamma`, `layer{i}.ffn.{gate,up,down}.weight`, `final_norm.gamma`."""
from __future__ import annotations

from ..errors import GraphError
from ..ir.graph import Graph
from ..ir.ops.attention import rope_tables
from ..ir.shapes import Dim, Shape
from .bert import dense, head_dim, merge_heads, norm_params, split_heads, store_seed_weights

__all__ = ["llama_decoder", "llama_small", "llama_tiny", "default_intermediate"]


def default_intermediate(hidden: int) -> int:
    """LLaMA's MLP width rule: 8/3 * hidden rounded up to a multiple of 32."""
    return -(-(8 * hidden // 3) // 32) * 32


def llama_decoder(
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    batch: Dim = 2,
    seq: Dim = 8,
    rope_base: float = 10000.0,
    eps: float = 1e-6,
    seed: int | None = None,
    name: str = "llama",
) -> Graph:
    """LLaMA decoder layers: input "hidden" [batch, seq, hidden] (token embeddings), output the
    final-RMSNorm hidden states (no LM head).

    `kv_heads` must divide `heads` (GQA; equal is plain multi-head, 1 is multi-query).
    `intermediate` defaults to `default_intermediate(hidden)`. RoPE tables (positions 0..seq-1,
    `rope_base`) are float32 constants when `seq` is static; when `seq` is a symbol they are the
    graph inputs "rope_cos" / "rope_sin" [seq, head_dim / 2] (see `bz.ir.ops.attention.
    rope_tables`). Params carry no weights unless `seed` is given; then `bz.init_params(g, seed)`
    values are stored."""
    d = head_dim(hidden, heads)
    if kv_heads <= 0 or heads % kv_heads:
        raise GraphError(f"kv_heads={kv_heads} must divide heads={heads}")
    inter = default_intermediate(hidden) if intermediate is None else intermediate
    g = Graph(name)
    x = g.input("hidden", Shape((batch, seq, hidden)))
    if isinstance(seq, int):
        cos_t, sin_t = rope_tables(seq, d, rope_base)
        cos, sin = g.constant(cos_t), g.constant(sin_t)
    else:
        cos = g.input("rope_cos", Shape((seq, d // 2)))
        sin = g.input("rope_sin", Shape((seq, d // 2)))
    kv_width = kv_heads * d
    for i in range(layers):
        p = f"layer{i}"
        gamma, _ = norm_params(g, f"{p}.ln1", hidden, beta=False)
        h = g.rms_norm(x, gamma, eps=eps)
        q = split_heads(g, dense(g, h, f"{p}.attn.q", hidden, hidden, bias=False),
                        batch, seq, heads, d)
        k = split_heads(g, dense(g, h, f"{p}.attn.k", hidden, kv_width, bias=False),
                        batch, seq, kv_heads, d)
        v = split_heads(g, dense(g, h, f"{p}.attn.v", hidden, kv_width, bias=False),
                        batch, seq, kv_heads, d)
        q, k = g.rope(q, cos, sin), g.rope(k, cos, sin)
        ctx = g.attention(q, k, v, kind="causal")
        x = g.add(x, dense(g, merge_heads(g, ctx, batch, seq, hidden), f"{p}.attn.out",
                           hidden, hidden, bias=False))
        gamma, _ = norm_params(g, f"{p}.ln2", hidden, beta=False)
        h = g.rms_norm(x, gamma, eps=eps)
        gate = g.silu(dense(g, h, f"{p}.ffn.gate", hidden, inter, bias=False))
        up = dense(g, h, f"{p}.ffn.up", hidden, inter, bias=False)
        x = g.add(x, dense(g, g.mul(gate, up), f"{p}.ffn.down", inter, hidden, bias=False))
    gamma, _ = norm_params(g, "final_norm", hidden, beta=False)
    g.set_outputs([g.rms_norm(x, gamma, eps=eps)])
    return store_seed_weights(g, seed)


def llama_small(seed: int | None = None) -> Graph:
    """4 layers, hidden 256, 8 heads, 2 kv heads, batch 1, seq 32."""
    return llama_decoder(4, 256, 8, 2, batch=1, seq=32, seed=seed, name="llama_small")


def llama_tiny(seed: int | None = None) -> Graph:
    """2 layers, hidden 64, 4 heads, 2 kv heads, batch 2, seq 8."""
    return llama_decoder(2, 64, 4, 2, batch=2, seq=8, seed=seed, name="llama_tiny")
