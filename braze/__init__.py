"""braze: an ML graph compiler built around operator fusion.

    import braze as bz
    g = bz.Graph("m"); x = g.input("x", bz.Shape((2, 8))); ...
"""
from .errors import (  # noqa: F401
    BrazeError, GraphError, InterpretError, ParseError, PassError, ShapeError, VerifyError,
)
from .interpret import init_params, interpret, random_feeds  # noqa: F401
from .ir import (  # noqa: F401
    ALL_DTYPES, DType, Graph, Node, Op, Shape, Value, bf16, bool_, c64, f16, f32, f64, i8, i16,
    i32, i64, u8, u32,
)
from .ir.ops import UnaryFn, BinaryFn, CompareFn  # noqa: F401

__version__ = "0.1.0"
