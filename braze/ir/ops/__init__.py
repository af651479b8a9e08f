"""Every op kind, by family. Importing this package registers all kinds."""
from .attention import *  # noqa: F401,F403
from .backward import *  # noqa: F401,F403
from .backward_attention import *  # noqa: F401,F403
from .backward_conv import *  # noqa: F401,F403
from .control import *  # noqa: F401,F403
from .conv import *  # noqa: F401,F403
from .custom import *  # noqa: F401,F403
from .elementwise import (  # noqa: F401
    ACTIVATIONS,
    Binary,
    BinaryFn,
    Cast,
    Clamp,
    Compare,
    CompareFn,
    IsInf,
    IsNan,
    LeakyRelu,
    StopGradient,
    Unary,
    UnaryFn,
    Where,
)
from .fused import *  # noqa: F401,F403
from .generate import *  # noqa: F401,F403
from .indexing import *  # noqa: F401,F403
from .io import Constant, Input, Param  # noqa: F401
from .linalg import DotGeneral, MatMul  # noqa: F401
from .loss import *  # noqa: F401,F403
from .norm import *  # noqa: F401,F403
from .quant import *  # noqa: F401,F403
from .reduce import *  # noqa: F401,F403
from .region import *  # noqa: F401,F403
from .resize import *  # noqa: F401,F403
from .scan import *  # noqa: F401,F403
from .shape import *  # noqa: F401,F403
