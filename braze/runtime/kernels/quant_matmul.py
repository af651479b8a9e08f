"""DynamicQuantMatMul's kernel: braze's int8 VNNI GEMM (int8_gemm.py) on the node's static int8
weight, packed once per executable (with its column sums), the operand quantized per row in
the call, bias + activation in the GEMM's epilogue (an activation the C epilogue lacks runs
NumPy's after it). It declines (the node then runs its decomposition's reference) without
AVX512-VNNI, or for a weight or scale fed at run time."""
from __future__ import annotations

import numpy as np

from ...errors import InterpretError
from ...ir.ops.fused_quant import DynamicQuantMatMul
from . import c_snippets, int8_gemm
from .fused import then_activation
from .packed_gemm import bias_fits, gemm_bias
from .registry import Dispatch, Kernel, nbytes, register_kernel

__all__ = ["dynamic_quant_matmul"]


def int8_weight(node, ctx) -> int8_gemm.Int8Weight | None:
    """The node's static int8 weight and scales packed for the int8 GEMM (cached in
    ctx.prepared), or None when either is fed at run time."""
    wq, ws = (ctx.static.get(node.inputs[i]) for i in (1, 2))
    if wq is None or ws is None or wq.ndim != 2:
        return None
    key = ("int8_gemm", node.inputs[1], node.inputs[2])
    if key not in ctx.prepared:
        ctx.prepared[key] = int8_gemm.Int8Weight(wq, ws)
    return ctx.prepared[key]


@register_kernel(DynamicQuantMatMul)
def dynamic_quant_matmul(node, ins, outs, ctx):
    op = node.op
    if not int8_gemm.available() or outs[0].dtype.name != "f32":
        return None
    k, n = (int(d) for d in ins[1].dims)
    if k > int8_gemm.MAX_K or (op.has_bias and not bias_fits(ins[3], n)):
        return None
    weight = int8_weight(node, ctx)
    if weight is None:
        return None
    code = c_snippets.ACT_CODES.get(None if op.act is None else op.act.value)
    numpy_act = op.act if code is None else None  # one the C epilogue lacks: NumPy's after
    rows = int(np.prod(outs[0].dims[:-1], dtype=np.int64)) if outs[0].rank > 1 else 1
    static_bias = ctx.static.get(node.inputs[3]) if op.has_bias else None
    ready = None if static_bias is None else gemm_bias(static_bias, n)

    def run(x, wq, ws, *rest):
        out, scratch = rest[-2], rest[-1]
        b = ready if ready is not None or not op.has_bias else gemm_bias(rest[0], n)
        x = np.ascontiguousarray(x)  # held in a name: a temporary copy must outlive the call
        if not int8_gemm.gemm(x, weight, out, b, code or 0, scratch):
            raise InterpretError(f"int8 GEMM at node {node.label}: x {x.shape} / out "
                                 f"{out.shape} do not fit the weight [{k}, {n}]")

    what = op.act.value if op.act is not None else "bias" if op.has_bias else "plain"
    kernel = Kernel(run, Dispatch.NATIVE,
                    f"braze int8 GEMM (AVX512-VNNI), operand quantized per row ({what})",
                    flops=2 * rows * n * k, bytes=nbytes(ins) + nbytes(outs),
                    scratch=(((int8_gemm.scratch_bytes(rows, k),), np.uint8),))
    return then_activation(kernel, numpy_act, len(node.inputs))
