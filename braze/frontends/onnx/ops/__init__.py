"""ONNX op converters, one file per family; importing this package registers them all."""
from . import (  # noqa: F401
    contrib,
    contrib_attention,
    contrib_quant,
    control,
    elementwise,
    linalg,
    loss,
    nn,
    norm,
    quant,
    recurrent,
    reduce,
    resize,
    scatter,
    shape,
)
