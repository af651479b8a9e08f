"""ATen op converters by family; importing this package registers them all."""
from . import (  # noqa: F401
    attention,
    conv,
    creation,
    elementwise,
    indexing,
    linalg,
    norm,
    quant,
    reduce,
    scatter,
    shape,
    symint,
)
