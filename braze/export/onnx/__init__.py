"""ONNX export: `export_onnx(graph, path, target="onnxruntime" | "standard")`."""
from . import ops_contrib, ops_control, ops_quant, ops_standard  # noqa: F401  (register the mappings)
from .builder import ExportError  # noqa: F401
from .exporter import export_onnx, to_onnx_model  # noqa: F401
