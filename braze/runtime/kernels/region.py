"""ElementwiseRegion kernels: C generated from the region's body (codegen/elementwise.py),
compiled once per machine with IEEE-preserving flags and cached on disk; dispatch "generated".
Outputs of at least `STREAM_MIN_BYTES` are written with non-temporal stores (they would not
stay in cache for the next kernel anyway, and streaming skips the line reads a cached store
makes first)."""
from __future__ import annotations

import ctypes
import hashlib
from functools import cache

import numpy as np

from ...ir.ops.region import ElementwiseRegion
from ..codegen import cc
from ..codegen.elementwise import Unsupported, region_source
from .registry import Dispatch, Kernel, nbytes, register_kernel

__all__ = ["region", "stream_min_bytes"]


@cache
def stream_min_bytes() -> int:
    """Outputs this large (bytes, each) stream past the cache: the last-level cache's size
    (sysfs), else 32 MiB."""
    for index in (3, 2):
        try:
            with open(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size") as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            return int(text.rstrip("KMG")) * scale
        except ValueError:
            continue
    return 32 << 20


@register_kernel(ElementwiseRegion)
def region(node, ins, outs, ctx):
    if not cc.available() or any(o.dims != outs[0].dims for o in outs):
        return None
    stream = min(o.numel() * o.dtype.itemsize for o in outs) >= stream_min_bytes()
    try:
        src = region_source(node.op, ins, outs[0], "region", stream=stream)
    except Unsupported:
        return None
    name = "region_" + hashlib.sha256(src.encode()).hexdigest()[:12]
    src = src.replace("void region(", f"void {name}(")
    try:
        fn = getattr(cc.compile_c(src, name, cc.PRECISE_FLAGS), name)
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
    how = ", streaming stores" if stream else ""
    return Kernel(run, Dispatch.GENERATED, f"generated C region ({steps} ops{how})",
                  inplace=tuple(i for i, s in enumerate(ins) if s.dims == outs[0].dims
                                and s.dtype == outs[0].dtype),
                  bytes=nbytes(ins) + nbytes(outs), flops=steps * (outs[0].numel() or 0))
