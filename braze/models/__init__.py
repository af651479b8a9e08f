"""Reference model builders: BERT, GPT-2, LLaMA and ResNet blocks written in primitives, the way
frameworks export them, so fusion passes have real work; plus the name registry."""
from .bert import bert_base, bert_encoder, bert_tiny  # noqa: F401
from .gpt2 import gpt2_blocks  # noqa: F401
from .llama import llama_decoder, llama_small, llama_tiny  # noqa: F401
from .registry import BUILTIN_MODELS, build_model  # noqa: F401
from .resnet import resnet_basic_block  # noqa: F401
