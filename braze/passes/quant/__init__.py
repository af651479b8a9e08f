"""Quantization passes: `quantize_dynamic` (dynamic int8 quantization of linear layers)."""
from .dynamic_matmul import QUANTIZE_DYNAMIC_MATMUL, quantize_dynamic
from .weights import quantize_weight

__all__ = ["quantize_dynamic", "quantize_weight", "QUANTIZE_DYNAMIC_MATMUL"]
