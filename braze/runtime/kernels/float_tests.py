"""isnan / isinf as NumPy ufuncs writing straight into their planned bool buffers (the
references' own functions, so bit-identical; every dtype, bfloat16 included). In a fused
graph these usually sit in a generated element-wise region; unfused, or where a region is not
formed, they ran their reference and copied its result."""
from __future__ import annotations

import numpy as np

from ...ir.ops.elementwise import IsInf, IsNan
from .registry import Dispatch, Kernel, nbytes, register_kernel


def _cost(ins, outs) -> dict:
    return dict(bytes=nbytes(ins) + nbytes(outs), flops=outs[0].numel() or 0)


@register_kernel(IsNan)
def isnan(node, ins, outs, ctx):
    return Kernel(lambda x, out: np.isnan(x, out=out), Dispatch.NATIVE, "isnan",
                  **_cost(ins, outs))


@register_kernel(IsInf)
def isinf(node, ins, outs, ctx):
    pos, neg = node.op.detect_positive, node.op.detect_negative
    if pos and neg:
        test = np.isinf
    elif pos:
        test = np.isposinf
    elif neg:
        test = np.isneginf
    else:
        return Kernel(lambda x, out: out.fill(False), Dispatch.NATIVE, "isinf (detects none)",
                      **_cost(ins, outs))
    return Kernel(lambda x, out: test(x, out=out), Dispatch.NATIVE, f"{test.__name__}",
                  **_cost(ins, outs))
