"""braze's IR: dtypes, shapes, op classes, nodes and graphs."""
from .dtypes import ALL_DTYPES, DType, bf16, bool_, c64, f16, f32, f64, i8, i16, i32, i64, u8, u32  # noqa: F401
from .graph import Graph  # noqa: F401
from .node import Node  # noqa: F401
from .op import OP_REGISTRY, Op, Value  # noqa: F401
from .shapes import Shape  # noqa: F401
