"""Built-in reference models by name (what the CLI and benchmarks build): `BUILTIN_MODELS` maps a
name to a zero-argument builder; `build_model(name)` builds one."""
from __future__ import annotations

from collections.abc import Callable

from ..errors import GraphError
from ..ir.graph import Graph
from .bert import bert_base, bert_tiny
from .gpt2 import gpt2_blocks
from .llama import llama_small, llama_tiny
from .resnet import resnet_basic_block

__all__ = ["BUILTIN_MODELS", "build_model"]

BUILTIN_MODELS: dict[str, Callable[[], Graph]] = {
    "bert-base": bert_base,
    "bert-tiny": bert_tiny,
    "gpt2": lambda: gpt2_blocks(name="gpt2"),
    "gpt2-small": lambda: gpt2_blocks(12, 768, 12, batch=1, seq=128, name="gpt2_small"),
    "llama-small": llama_small,
    "llama-tiny": llama_tiny,
    "resnet-block": resnet_basic_block,
}


def build_model(name: str) -> Graph:
    """The built-in model `name` (weights not stored). Raises GraphError listing known names."""
    try:
        builder = BUILTIN_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(BUILTIN_MODELS))
        raise GraphError(f"unknown model {name!r}; built-in models: {known}") from None
    return builder()
