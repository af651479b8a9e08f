"""Kernels for the compiled CPU executor, one file per family; importing this package
registers them all (see registry.py for the contract)."""
from . import (  # noqa: E402,F401
    attention,
    basic,
    control,
    conv,
    data_movement,
    dot_general,
    elementwise_c,
    float_tests,
    fused,
    indexing,
    loss,
    nhwc_ops,
    pool_resize,
    quant,
    quant_matmul,
    region,
    rope_layouts,
    selection,
    transpose,
)
from .reference import reference_kernel  # noqa: F401
from .registry import (  # noqa: F401
    KERNELS,
    Dispatch,
    Kernel,
    KernelContext,
    has_empty,
    kernel_for,
    register_kernel,
)
