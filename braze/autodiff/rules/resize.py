"""Rules of the general resize op. Every mode (nearest, linear, cubic) resamples H and W
separably with fixed [out, in] matrices, y = M_h @ x @ M_w^T, so the op is linear in x: the
cotangent is M_h^T @ dy @ M_w and the tangent is the resize of the tangent. The matrices need
static H and W."""
from __future__ import annotations

import numpy as np

from ...errors import AutodiffError
from ...ir.ops.resize import Resize, ResizeMode
from ..registry import jvp_rule, vjp_rule


def _matrix(op: Resize, axis: int, n_in: int, n_out: int) -> np.ndarray:
    """The [out, in] resampling matrix of `op` along spatial `axis` (0: H, 1: W)."""
    if op.mode is ResizeMode.NEAREST:
        m = np.zeros((n_out, n_in))
        m[np.arange(n_out), op.indices(axis, n_in, n_out)] = 1.0
        return m
    return op.weights(axis, n_in, n_out)


@vjp_rule(Resize)
def resize_vjp(b, node, ins, outs, cts):
    if cts[0] is None:
        return [None]
    xs = b.shape_of(ins[0])
    h, w = xs.dims[2:]
    if not (isinstance(h, int) and isinstance(w, int)):
        raise AutodiffError(f"gradient of {node.label} ({node.provenance}) needs static H and "
                            f"W, got {xs}; bind the spatial dims first (g.bind)")
    dt = xs.dtype
    oh, ow = b.shape_of(outs[0]).dims[2:]
    # the matrices take x's dtype (b.constant alone would store float64 arrays as f32)
    mh_t = b.constant(np.ascontiguousarray(_matrix(node.op, 0, h, oh).T), dt)  # [H, oh]
    mw = b.constant(_matrix(node.op, 1, w, ow), dt)                           # [ow, W]
    return [b.matmul(b.matmul(mh_t, cts[0]), mw)]


@jvp_rule(Resize)
def resize_jvp(b, node, ins, outs, tangents):
    return [None if tangents[0] is None else b.add_node(node.op, (tangents[0],))[0]]
