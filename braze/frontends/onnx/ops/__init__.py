"""ONNX op converters, one file per family; importing this package registers them all."""
from . import elementwise, linalg, nn, reduce, shape  # noqa: F401
