"""Data-movement kernels that write into their planned buffers: strided slices (Swin's patch
merging `x[:, 0::2, 1::2]`, LeViT's query subsampling) copy a strided view of the input, and
constant padding (EfficientNet's asymmetric "same" padding before its convs) fills the border
and copies the input into the interior. Reflect / edge padding runs its reference."""
from __future__ import annotations

import numpy as np

from ...ir.ops.indexing import Slice
from ...ir.ops.shape import Pad, PadMode
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
