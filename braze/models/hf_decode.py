"""One KV-cache decode step of a Hugging Face decoder (GPT-2, LLaMA, ...) built from its config
with random weights, as a torch module over plain tensors, for tests and benchmarks of
decode-step fusion:

    m = hf_decode_module("llama")          # (input_ids, attention_mask, k0, v0, k1, v1, ...)
    feeds = decode_inputs(m, past=5, seq=1)  # -> (last_hidden_state, present k0, v0, ...)

The cache goes in as one [B, Hkv, P, D] key and value tensor per layer (a DynamicCache is
built from them inside), the present keys / values (cache + new tokens) come out after the
hidden state. `attention_mask` covers the P + S positions; `with_mask=False` leaves it out (the
model builds its causal mask from the cache length alone)."""
from __future__ import annotations

import inspect

import numpy as np

from .hf import _family, perturb_weights

__all__ = ["hf_decode_module", "decode_inputs", "decode_input_names"]


def _decode_class():
    import torch
    import transformers

    class DecodeStep(torch.nn.Module):
        """(input_ids, [attention_mask], k0, v0, k1, v1, ...) -> (hidden, k0', v0', ...)."""

        def __init__(self, model, layers: int, with_mask: bool):
            super().__init__()
            self.model, self.layers, self.with_mask = model, layers, with_mask
            params = inspect.signature(type(model).forward).parameters
            self.cache_arg = "cache" if "cache" in params else "past_key_values"  # older: past

        def forward(self, input_ids, *rest):
            mask, past = (rest[0], rest[1:]) if self.with_mask else (None, rest)
            cache = transformers.DynamicCache()
            for i in range(self.layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=input_ids, attention_mask=mask, use_cache=True,
                             **{self.cache_arg: cache})
            present = []
            for layer in cache.layers[:self.layers]:  # updated in place with the new tokens
                present += [layer.keys, layer.values]
            return (out.last_hidden_state, *present)

    return DecodeStep


def hf_decode_module(family: str, *, attn: str = "sdpa", with_mask: bool = True,
                     seed: int = 0):
    """An eval-mode decode-step module of `family` (tiny config, perturbed random weights);
    `kv_heads`, `head_dim`, `num_layers`, `vocab_size` and `with_mask` are set on it."""
    import torch
    import transformers

    fam = _family(family)
    torch.manual_seed(seed)
    cfg = fam.config("tiny")
    cfg._attn_implementation = attn if fam.sdpa else "eager"
    model = getattr(transformers, fam.model_class)(cfg).eval()
    perturb_weights(model, seed)
    layers = fam.layers("tiny")
    m = _decode_class()(model, layers, with_mask).eval()
    heads = cfg.num_attention_heads
    m.kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    m.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    m.num_layers, m.vocab_size, m.with_mask = layers, cfg.vocab_size, with_mask
    return m


def decode_input_names(m) -> list[str]:
    """The module's argument names, in order (as export input names)."""
    cache = [f"past_{kv}{i}" for i in range(m.num_layers) for kv in "kv"]
    return ["input_ids"] + ["attention_mask"] * m.with_mask + cache


def decode_inputs(m, *, batch: int = 2, past: int = 5, seq: int = 1, seed: int = 0
                  ) -> dict[str, np.ndarray]:
    """Random feeds by `decode_input_names`: ids of `seq` new tokens, a cache of `past`
    positions, and (with a mask) all-ones but for the second sequence's first two cached
    positions (left padding)."""
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(0, m.vocab_size, (batch, seq)).astype(np.int64)}
    if m.with_mask:
        mask = np.ones((batch, past + seq), np.int64)
        if batch > 1 and past > 2:
            mask[1, :2] = 0
        feeds["attention_mask"] = mask
    shape = (batch, m.kv_heads, past, m.head_dim)
    for name in decode_input_names(m)[1 + m.with_mask:]:
        feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return feeds
