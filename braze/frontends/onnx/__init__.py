"""The ONNX frontend: `import_onnx(path | bytes | ModelProto)` -> braze Graph."""
from .importer import MAX_OPSET, MIN_OPSET, SUPPORTED_OPS, import_onnx  # noqa: F401
