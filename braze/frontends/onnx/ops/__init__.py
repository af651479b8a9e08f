"""ONNX op converters, one file per family; importing this package registers them all."""
from . import elementwise, linalg, reduce, shape  # noqa: F401
