"""Hugging Face transformer models built from their config classes with random weights (nothing
is downloaded), and their ONNX exports in the variants users produce: the TorchScript exporter
with sdpa attention ("sdpa") or eager attention ("eager"), and the dynamo exporter ("dynamo").
Tests and benchmarks use these to check braze against real exports. Needs torch and
transformers (the `torch` extra).

    m = hf_module("llama")                        # eval-mode torch module: (ids, mask) -> hidden
    export_onnx_variant(m, "llama.onnx", "dynamo")
    feeds = hf_inputs(batch=2, seq=8, vocab=m.vocab_size)

Norm weights and biases, and every zero-initialized bias, are perturbed away from 1 / 0, so a
dropped gamma, beta or bias cannot go unnoticed in a numeric check."""
from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["HF_FAMILIES", "HFFamily", "hf_module", "hf_inputs", "export_onnx_variant",
           "EXPORT_VARIANTS", "family_variants", "variant_attn", "perturb_weights"]

EXPORT_VARIANTS = ("sdpa", "eager", "dynamo")
VOCAB = 128


@dataclass(frozen=True)
class HFFamily:
    """One architecture: its model class, a config builder for a size, the number of layers of
    that config, and how its layers are built (what fusion must find per layer)."""

    name: str
    model_class: str
    config: Callable[[str], object]
    layers: Callable[[str], int]
    causal: bool
    gated_mlp: bool = False
    sdpa: bool = True          # whether the model has an sdpa attention implementation
    dynamo_attn: str = "sdpa"  # the attention the dynamo export traces


def _tiny_or_base(tiny: dict, base: dict):
    def build(size: str) -> dict:
        if size == "tiny":
            return dict(tiny)
        if size == "base":
            return dict(base)
        raise ValueError(f"unknown model size {size!r} (tiny or base)")

    return build


def _config(cls_name: str, tiny: dict, base: dict | None = None):
    sizes = _tiny_or_base(tiny, base or tiny)

    def make(size: str):
        import transformers

        return getattr(transformers, cls_name)(**sizes(size))

    return make


def _layers(key: str, tiny: dict, base: dict | None = None):
    return lambda size: (tiny if size == "tiny" else (base or tiny))[key]


_BERT_T = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
               vocab_size=VOCAB, max_position_embeddings=64)
_BERT_B = dict(vocab_size=30522)
_GPT2_T = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64,
               bos_token_id=0, eos_token_id=0)
_GPT2_B = dict(n_layer=12, bos_token_id=0, eos_token_id=0)
_LLAMA_T = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64)
_LLAMA_B = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                num_key_value_heads=4, intermediate_size=2048, vocab_size=32000,
                max_position_embeddings=512)
_GEMMA_T = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                head_dim=16, intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64,
                hidden_activation="gelu_pytorch_tanh")
_NEOX_T = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
               vocab_size=VOCAB, max_position_embeddings=64, rotary_pct=0.25,
               use_parallel_residual=True)
_PHI_T = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
              vocab_size=VOCAB, max_position_embeddings=64, partial_rotary_factor=0.5)
_QWEN2_T = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64)
# held-out architectures: relative position bias, ALiBi, multi-query, sliding window,
# interleaved rope, post-norm encoders, quick_gelu, learned positions with an offset
_T5_T = dict(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
             relative_attention_num_buckets=8, relative_attention_max_distance=16)
_BLOOM_T = dict(vocab_size=VOCAB, hidden_size=64, n_layer=2, n_head=4)
_FALCON_T = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=64)
_MISTRAL_T = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, intermediate_size=128, vocab_size=VOCAB,
                  max_position_embeddings=64, sliding_window=4)
_GPTJ_T = dict(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4, rotary_dim=8)
_DISTILBERT_T = dict(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                     max_position_embeddings=64)
_ROBERTA_T = dict(_BERT_T, max_position_embeddings=72)
_CLIP_T = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=64, eos_token_id=2)
_STABLELM_T = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                   partial_rotary_factor=0.25, use_qkv_bias=True)
_OPT_T = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, ffn_dim=128,
              num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=64)
# held-out decoders: per-head q/k RMSNorm (Qwen3; after the head transpose in Gemma 3), a q/k
# norm over the whole projection with post-sublayer norms (OLMo 2), a [B, S, H, 3, D] QKV with
# q/k LayerNorms and relu^2 (Persimmon), a whole-head rope with an empty pass-through part
# (Phi-3), attention / residual / embedding multipliers (Granite)
_QWEN3_T = dict(_LLAMA_T, head_dim=16)
_GEMMA3_T = dict(_LLAMA_T, head_dim=16, sliding_window=4)
_OLMO2_T = dict(_LLAMA_T)
_PERSIMMON_T = dict(_LLAMA_T, num_key_value_heads=4, partial_rotary_factor=0.5,
                    qk_layernorm=True)
_PHI3_T = dict(_LLAMA_T, pad_token_id=0)
_GRANITE_T = dict(_LLAMA_T, embedding_multiplier=2.0, residual_multiplier=0.5,
                  attention_multiplier=0.3)
# a mixture of experts (top-2 of 4) with the dense batched experts: transformers 5's default
# grouped_mm experts do not export (aten::histc), its eager loop is data-dependent
_MIXTRAL_T = dict(_LLAMA_T, num_local_experts=4, num_experts_per_tok=2,
                  experts_implementation="batched_mm")
# held-out encoders: rotary encoder scaling q before the rotation (ESM), GeGLU with alternating
# local / global attention (ModernBERT), disentangled relative attention (DeBERTa-v2),
# an own attention module with data-dependent checks (XLM)
_ESM_T = dict(_BERT_T, position_embedding_type="rotary", pad_token_id=1, mask_token_id=3,
              token_dropout=False)
_MODERNBERT_T = dict(_BERT_T, global_attn_every_n_layers=2, local_attention=4, pad_token_id=0,
                     bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
_DEBERTA_V2_T = dict(_BERT_T, relative_attention=True, position_buckets=16,
                     max_relative_positions=32, pos_att_type=["p2c", "c2p"],
                     norm_rel_ebd="layer_norm", share_att_key=True, position_biased_input=False)
_XLM_T = dict(vocab_size=VOCAB, emb_dim=64, n_layers=2, n_heads=4, max_position_embeddings=64)

HF_FAMILIES: dict[str, HFFamily] = {
    "bert": HFFamily("bert", "BertModel", _config("BertConfig", _BERT_T, _BERT_B),
                     _layers("num_hidden_layers", _BERT_T, {"num_hidden_layers": 12}), False),
    "gpt2": HFFamily("gpt2", "GPT2Model", _config("GPT2Config", _GPT2_T, _GPT2_B),
                     _layers("n_layer", _GPT2_T, _GPT2_B), True),
    "llama": HFFamily("llama", "LlamaModel", _config("LlamaConfig", _LLAMA_T, _LLAMA_B),
                      _layers("num_hidden_layers", _LLAMA_T, _LLAMA_B), True, gated_mlp=True),
    "gemma": HFFamily("gemma", "GemmaModel", _config("GemmaConfig", _GEMMA_T),
                      _layers("num_hidden_layers", _GEMMA_T), True, gated_mlp=True),
    "gpt_neox": HFFamily("gpt_neox", "GPTNeoXModel", _config("GPTNeoXConfig", _NEOX_T),
                         _layers("num_hidden_layers", _NEOX_T), True),
    "phi": HFFamily("phi", "PhiModel", _config("PhiConfig", _PHI_T),
                    _layers("num_hidden_layers", _PHI_T), True),
    "qwen2": HFFamily("qwen2", "Qwen2Model", _config("Qwen2Config", _QWEN2_T),
                      _layers("num_hidden_layers", _QWEN2_T), True, gated_mlp=True),
    "t5": HFFamily("t5", "T5EncoderModel", _config("T5Config", _T5_T),
                   _layers("num_layers", _T5_T), False, dynamo_attn="eager"),
    "bloom": HFFamily("bloom", "BloomModel", _config("BloomConfig", _BLOOM_T),
                      _layers("n_layer", _BLOOM_T), True, sdpa=False),
    "falcon": HFFamily("falcon", "FalconModel", _config("FalconConfig", _FALCON_T),
                       _layers("num_hidden_layers", _FALCON_T), True),
    "mistral": HFFamily("mistral", "MistralModel", _config("MistralConfig", _MISTRAL_T),
                        _layers("num_hidden_layers", _MISTRAL_T), True, gated_mlp=True),
    "gptj": HFFamily("gptj", "GPTJModel", _config("GPTJConfig", _GPTJ_T),
                     _layers("n_layer", _GPTJ_T), True, sdpa=False),
    "distilbert": HFFamily("distilbert", "DistilBertModel",
                           _config("DistilBertConfig", _DISTILBERT_T),
                           _layers("n_layers", _DISTILBERT_T), False),
    "roberta": HFFamily("roberta", "RobertaModel", _config("RobertaConfig", _ROBERTA_T),
                        _layers("num_hidden_layers", _ROBERTA_T), False),
    "clip_text": HFFamily("clip_text", "CLIPTextModel", _config("CLIPTextConfig", _CLIP_T),
                          _layers("num_hidden_layers", _CLIP_T), True),
    "stablelm": HFFamily("stablelm", "StableLmModel", _config("StableLmConfig", _STABLELM_T),
                         _layers("num_hidden_layers", _STABLELM_T), True, gated_mlp=True),
    "opt": HFFamily("opt", "OPTModel", _config("OPTConfig", _OPT_T),
                    _layers("num_hidden_layers", _OPT_T), True),
    "qwen3": HFFamily("qwen3", "Qwen3Model", _config("Qwen3Config", _QWEN3_T),
                      _layers("num_hidden_layers", _QWEN3_T), True, gated_mlp=True),
    "gemma3_text": HFFamily("gemma3_text", "Gemma3TextModel",
                            _config("Gemma3TextConfig", _GEMMA3_T),
                            _layers("num_hidden_layers", _GEMMA3_T), True, gated_mlp=True),
    "olmo2": HFFamily("olmo2", "Olmo2Model", _config("Olmo2Config", _OLMO2_T),
                      _layers("num_hidden_layers", _OLMO2_T), True, gated_mlp=True),
    "persimmon": HFFamily("persimmon", "PersimmonModel", _config("PersimmonConfig", _PERSIMMON_T),
                          _layers("num_hidden_layers", _PERSIMMON_T), True),
    "phi3": HFFamily("phi3", "Phi3Model", _config("Phi3Config", _PHI3_T),
                     _layers("num_hidden_layers", _PHI3_T), True, gated_mlp=True),
    "granite": HFFamily("granite", "GraniteModel", _config("GraniteConfig", _GRANITE_T),
                        _layers("num_hidden_layers", _GRANITE_T), True, gated_mlp=True),
    "mixtral": HFFamily("mixtral", "MixtralModel", _config("MixtralConfig", _MIXTRAL_T),
                        _layers("num_hidden_layers", _MIXTRAL_T), True, gated_mlp=True),
    "esm": HFFamily("esm", "EsmModel", _config("EsmConfig", _ESM_T),
                    _layers("num_hidden_layers", _ESM_T), False),
    "modernbert": HFFamily("modernbert", "ModernBertModel",
                           _config("ModernBertConfig", _MODERNBERT_T),
                           _layers("num_hidden_layers", _MODERNBERT_T), False, gated_mlp=True),
    "deberta_v2": HFFamily("deberta_v2", "DebertaV2Model",
                           _config("DebertaV2Config", _DEBERTA_V2_T),
                           _layers("num_hidden_layers", _DEBERTA_V2_T), False, sdpa=False),
    "xlm": HFFamily("xlm", "XLMModel", _config("XLMConfig", _XLM_T), _layers("n_layers", _XLM_T),
                    False, sdpa=False),
}


def variant_attn(family: str, variant: str) -> str:
    """The attention implementation exported for `variant` of `family`: "eager" for the eager
    variant and where the model has no sdpa path; the dynamo variant traces `dynamo_attn`
    (T5's sdpa path does not get through torch.export's decompositions: a view of its
    transposed attention output)."""
    fam = _family(family)
    if variant == "eager" or not fam.sdpa:
        return "eager"
    return fam.dynamo_attn if variant == "dynamo" else "sdpa"


def family_variants(family: str) -> tuple[str, ...]:
    """The export variants that differ for `family`: "sdpa" only where the model has an sdpa
    attention implementation (without one, it would export the eager graph again)."""
    fam = _family(family)
    return EXPORT_VARIANTS if fam.sdpa else tuple(v for v in EXPORT_VARIANTS if v != "sdpa")


def hf_module(family: str, *, size: str = "tiny", attn: str = "sdpa", seed: int = 0):
    """An eval-mode torch module `(input_ids, attention_mask) -> last_hidden_state` of
    `family` with random, perturbed weights (deterministic for a seed)."""
    import torch
    import transformers

    fam = _family(family)
    torch.manual_seed(seed)
    cfg = fam.config(size)
    cfg._attn_implementation = attn if fam.sdpa else "eager"
    cls = getattr(transformers, fam.model_class)
    model = cls(cfg).eval()
    perturb_weights(model, seed)
    no_cache = "use_cache" in inspect.signature(cls.forward).parameters
    wrapped = _LastHidden(model, no_cache).eval()
    wrapped.vocab_size = cfg.vocab_size
    wrapped.num_layers = fam.layers(size)
    return wrapped


def _family(name: str) -> HFFamily:
    try:
        return HF_FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(HF_FAMILIES)}") \
            from None


def perturb_weights(model, seed: int) -> None:
    """Move every 1-D parameter (norm weights off 1, biases off 0) by N(0, 0.1) noise."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                noise = torch.randn(p.shape, generator=gen) * 0.1
                p.add_(noise.to(p.dtype))


def _last_hidden_class():
    import torch

    class LastHidden(torch.nn.Module):
        """(input_ids, attention_mask) -> last_hidden_state, without a KV cache."""

        def __init__(self, model, no_cache: bool):
            super().__init__()
            self.model = model
            self.no_cache = no_cache

        def forward(self, input_ids, attention_mask):
            kw = {"use_cache": False} if self.no_cache else {}
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              **kw).last_hidden_state

    return LastHidden


def _LastHidden(model, no_cache):  # noqa: N802 - a class made on first use (torch is optional)
    return _last_hidden_class()(model, no_cache)


def hf_inputs(batch: int = 2, seq: int = 8, *, vocab: int = VOCAB, seed: int = 0,
              padding: str = "right") -> dict[str, np.ndarray]:
    """input_ids and an attention_mask whose second sequence is padded by two positions
    (`padding="right"` or "left"; "none" for all ones)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    if padding != "none" and batch > 1 and seq > 2:
        if padding == "right":
            mask[1, seq - 2:] = 0
        elif padding == "left":
            mask[1, :2] = 0
        else:
            raise ValueError(f"padding must be right, left or none, got {padding!r}")
    return {"input_ids": ids, "attention_mask": mask}


def export_onnx_variant(module, path: str | os.PathLike, variant: str, *, opset: int = 17
                        ) -> str:
    """Export `module` (from hf_module) to `path` as `variant`: "sdpa"/"eager" (TorchScript
    exporter; the module's attention implementation decides which) or "dynamo" (the dynamo
    exporter at its default opset). Batch and sequence are dynamic ("batch", "seq")."""
    import warnings

    import torch

    feeds = hf_inputs(2, 8, vocab=module.vocab_size)
    args = tuple(torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask"))
    names = ["input_ids", "attention_mask"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if variant in ("sdpa", "eager"):
            axes = {n: {0: "batch", 1: "seq"} for n in names}
            torch.onnx.export(module, args, str(path), input_names=names,
                              output_names=["last_hidden_state"], dynamic_axes=axes,
                              opset_version=opset, dynamo=False)
        elif variant == "dynamo":
            b, s = torch.export.Dim("batch"), torch.export.Dim("seq")
            shapes = {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}}
            torch.onnx.export(module, args, str(path), input_names=names,
                              output_names=["last_hidden_state"], dynamic_shapes=shapes,
                              dynamo=True, external_data=False, verbose=False)
        else:
            raise ValueError(f"unknown export variant {variant!r}; known: {EXPORT_VARIANTS}")
    return str(path)
