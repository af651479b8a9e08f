"""dot_general as one batched matmul into the output buffer: lhs laid out [batch, M, K] and
rhs [batch, K, N] (a transposed copy only where an operand is not already in that order), then
np.matmul (BLAS for floats) writes the output viewed as [batch, M, N]. The reference is
np.einsum: float results agree within the summation order's rounding (tested at rtol 1e-5 for
float32); integer results are identical. float16 / bfloat16 (accumulated in float32 by the
reference) run the reference."""
from __future__ import annotations

import numpy as np

from ...ir.ops.linalg import DotGeneral
from .registry import Dispatch, Kernel, nbytes, register_kernel

_DTYPES = ("f32", "f64", "i32", "i64")


def _prod(dims) -> int:
    return int(np.prod([int(d) for d in dims], dtype=np.int64))


@register_kernel(DotGeneral)
def dot_general(node, ins, outs, ctx):
    a, b = ins
    if a.dtype.name not in _DTYPES:
        return None
    op = node.op
    free_a, free_b = op.free_dims(a.rank, "lhs"), op.free_dims(b.rank, "rhs")
    perm_a = tuple(op.lhs_batch) + tuple(free_a) + tuple(op.lhs_contract)
    perm_b = tuple(op.rhs_batch) + tuple(op.rhs_contract) + tuple(free_b)
    batch = _prod(a.dims[i] for i in op.lhs_batch)
    m = _prod(a.dims[i] for i in free_a)
    k = _prod(a.dims[i] for i in op.lhs_contract)
    n = _prod(b.dims[i] for i in free_b)
    ident_a, ident_b = perm_a == tuple(range(a.rank)), perm_b == tuple(range(b.rank))

    def run(x, w, out):
        xl = (x if ident_a else x.transpose(perm_a)).reshape(batch, m, k)
        wl = (w if ident_b else w.transpose(perm_b)).reshape(batch, k, n)
        np.matmul(xl, wl, out=out.reshape(batch, m, n))

    flops = 2 * batch * m * n * k
    return Kernel(run, Dispatch.NATIVE, "dot_general (batched matmul)", flops=flops,
                  bytes=nbytes(ins) + nbytes(outs))
