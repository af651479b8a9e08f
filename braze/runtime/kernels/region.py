"""ElementwiseRegion kernels: C generated from the region's body (codegen/elementwise.py),
compiled once per machine with IEEE-preserving flags and cached on disk; dispatch "generated".
A region of static shape bakes its lengths and strides into the source; one whose shape is
symbolic reads them from an array (region_geometry), so each new binding of a dynamic-size
model reuses the compiled kernel instead of compiling another. Scalar constants are arguments
(codegen.scalars), so regions that differ only by them share one kernel as well.

Outputs of at least $BRAZE_STREAM_MIN_MB MiB each are written with non-temporal stores (the
generator's `stream`), which skip the line reads a cached store makes first. Off by default:
on the 2-core Zen3 dev VM, interleaved against plain stores on 64 MiB float32 outputs, they were
no faster in wall time and cost 5-10% more CPU (bench/elementwise_regions.py's write-up)."""
from __future__ import annotations

import ctypes
import hashlib
import math
import os

import numpy as np

from ...ir.ops.region import ElementwiseRegion
from ..address import address
from ..codegen import cc
from ..codegen.builds import Library
from ..codegen.elementwise import (
    Unsupported,
    region_constants,
    region_flags,
    region_geometry,
    region_scalars,
    region_source,
)
from .reference import reference_kernel
from .registry import Dispatch, Kernel, nbytes, register_kernel, register_library

__all__ = ["region", "region_library", "stream_min_bytes"]


def stream_min_bytes() -> int | None:
    """Output size (bytes, each) from which regions stream their stores; None: never (unset,
    not a number, or inf), 0: always (0 or less)."""
    try:
        mb = float(os.environ.get("BRAZE_STREAM_MIN_MB") or "nan")
    except ValueError:
        return None
    if math.isnan(mb) or mb == math.inf:
        return None
    return max(0, int(max(mb, 0.0) * (1 << 20)))


def _streams(outs) -> bool:
    limit = stream_min_bytes()
    return limit is not None and min(o.numel() * o.dtype.itemsize for o in outs) >= limit


@register_library(ElementwiseRegion)
def region_library(node, ins, outs, ctx=None) -> Library | None:
    """The C library of the region's kernel (function `library.name`), or None where the
    generator declines the region."""
    if not cc.available() or any(o.dims != outs[0].dims for o in outs):
        return None
    sizes = not all(o.is_static for o in node.outputs)  # re-planned per binding
    try:
        src = region_source(node.op, ins, outs[0], "region", stream=_streams(outs),
                            sizes=sizes)
    except Unsupported:
        return None
    name = "region_" + hashlib.sha256(src.encode()).hexdigest()[:12]
    return Library(src.replace("void region(", f"void {name}("), name, region_flags(node.op))


@register_kernel(ElementwiseRegion)
def region(node, ins, outs, ctx):
    lib = region_library(node, ins, outs)
    if lib is None:
        return None
    if lib.key in ctx.unbuilt:  # a build limit was reached (None: the build failed, in cc)
        why = ctx.unbuilt[lib.key]
        return None if why is None else reference_kernel(node, ctx.symbols, why)
    try:
        fn = getattr(cc.compile_c(lib.source, lib.name, lib.flags), lib.name)
    except cc.CompileError as e:
        cc.note_failure(e)
        return None
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = None
    tables = region_constants(node.op)  # alive as long as the kernel
    scalars = region_scalars(node.op)
    if scalars is not None:
        tables.append(scalars)
    if not all(o.is_static for o in node.outputs):  # lengths and strides read at run time
        tables.append(region_geometry(node.op, ins, outs[0]))
    n = len(ins) + len(outs) + len(tables)
    arg_t = ctypes.c_void_p * n

    def run(*arrays):
        keep = [a if a.flags.c_contiguous else np.ascontiguousarray(a) for a in arrays]
        fn(arg_t(*(address(a) for a in keep + tables)))

    steps = len(node.op.steps)
    how = ", streaming stores" if _streams(outs) else ""
    return Kernel(run, Dispatch.GENERATED, f"generated C region ({steps} ops{how})",
                  inplace=tuple(i for i, s in enumerate(ins) if s.dims == outs[0].dims
                                and s.dtype == outs[0].dtype),
                  bytes=nbytes(ins) + nbytes(outs), flops=steps * (outs[0].numel() or 0))
