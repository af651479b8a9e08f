"""ONNX op converters, one file per family; importing this package registers them all."""
from . import contrib, contrib_attention, elementwise, linalg, nn, norm, reduce, shape  # noqa: F401
