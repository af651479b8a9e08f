"""ElementwiseRegion kernels: C generated from the region's body (codegen/elementwise.py),
compiled once per machine and cached on disk; dispatch "generated"."""
from __future__ import annotations

import ctypes
import hashlib

import numpy as np

from ...ir.ops.region import ElementwiseRegion
from ..codegen import cc
from ..codegen.elementwise import Unsupported, region_source
from .registry import Dispatch, Kernel, nbytes, register_kernel


@register_kernel(ElementwiseRegion)
def region(node, ins, outs, ctx):
    if not cc.available() or any(o.dims != outs[0].dims for o in outs):
        return None
    try:
        src = region_source(node.op, ins, outs[0], "region")
    except Unsupported:
        return None
    name = "region_" + hashlib.sha256(src.encode()).hexdigest()[:12]
    src = src.replace("void region(", f"void {name}(")
    try:
        fn = getattr(cc.compile_c(src, name), name)
    except cc.CompileError:
        return None
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = None
    n = len(ins) + len(outs)
    arg_t = ctypes.c_void_p * n

    def run(*arrays):
        keep = [a if a.flags.c_contiguous else np.ascontiguousarray(a) for a in arrays]
        fn(arg_t(*(a.ctypes.data for a in keep)))

    steps = len(node.op.steps)
    return Kernel(run, Dispatch.GENERATED, f"generated C region ({steps} ops)",
                  inplace=tuple(i for i, s in enumerate(ins) if s.dims == outs[0].dims
                                and s.dtype == outs[0].dtype),
                  bytes=nbytes(ins) + nbytes(outs), flops=steps * (outs[0].numel() or 0))
