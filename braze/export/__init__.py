"""Exporters: braze graphs to other formats (ONNX, for ONNX Runtime or standard ONNX)."""
