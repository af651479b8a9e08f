"""Data-movement kernels that write into their planned buffers: strided slices (Swin's patch
merging `x[:, 0::2, 1::2]`, LeViT's query subsampling) copy a strided view of the input,
constant padding (EfficientNet's asymmetric "same" padding before its convs) fills the border
and copies the input into the interior, and gather_elements (DeBERTa's disentangled attention
gathers its position scores with it: 29% of a call on the NumPy reference) is one C loop.
Reflect / edge padding runs its reference."""
from __future__ import annotations

import numpy as np

from ...errors import InterpretError
from ...ir.ops.indexing import GatherElements, Slice
from ...ir.ops.shape import Pad, PadMode
from ..address import address
from . import native
from .registry import Dispatch, Kernel, nbytes, register_kernel


@register_kernel(Slice)
def strided_slice(node, ins, outs, ctx):
    op = node.op
    axis = op.axis % ins[0].rank
    index = (slice(None),) * axis + (slice(op.start, op.stop, op.step),)

    def run(x, out):
        np.copyto(out, x[index])

    return Kernel(run, Dispatch.NATIVE, "strided slice copy", bytes=2 * nbytes(outs))


@register_kernel(Pad)
def constant_pad(node, ins, outs, ctx):
    op = node.op
    if op.mode is not PadMode.CONSTANT:
        return None
    value = ins[0].dtype.np.type(op.value)

    def run(x, out):
        interior = tuple(slice(before, before + n) for (before, _), n in zip(op.pads, x.shape))
        if any(before or after for before, after in op.pads):
            out.fill(value)  # the border (the interior is overwritten next)
        np.copyto(out[interior], x)

    return Kernel(run, Dispatch.NATIVE, "constant pad", bytes=nbytes(ins) + nbytes(outs))


@register_kernel(GatherElements)
def gather_elements(node, ins, outs, ctx):
    """Data of 4- or 8-byte elements, int32 / int64 indices whose dims off the axis equal the
    data's (the collapsed [outer, n, inner] form); other cases run the reference."""
    x, idx = ins
    lib = native.lib()
    ax = node.op.axis % x.rank
    if lib is None or x.dtype.np.itemsize not in (4, 8) or idx.dtype.np.itemsize not in (4, 8):
        return None
    if any(a != b for i, (a, b) in enumerate(zip(idx.dims, x.dims)) if i != ax):
        return None
    outer = int(np.prod(x.dims[:ax], dtype=np.int64))
    inner = int(np.prod(x.dims[ax + 1:], dtype=np.int64))
    n, m = int(x.dims[ax]), int(idx.dims[ax])
    elem, idx64 = x.dtype.np.itemsize, int(idx.dtype.np.itemsize == 8)

    def run(data, indices, out):
        data = np.ascontiguousarray(data)
        indices = np.ascontiguousarray(indices)
        if lib.gather_elements(address(data), address(indices), address(out), outer, n, m,
                               inner, elem, idx64):
            raise InterpretError(f"gather_elements at node {node.label}: an index is outside "
                                 f"[-{n}, {n}) along axis {ax}")

    return Kernel(run, Dispatch.NATIVE, "C gather_elements",
                  bytes=2 * nbytes(outs) + nbytes(ins[1:]))
