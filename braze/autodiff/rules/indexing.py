"""VJP and JVP rules of the indexing ops. gather's cotangent is the closed-form
`gather_backward` (scatter-add by index); gather_elements and top_k's values scatter their
cotangent back along the axis with a one-hot (eq against a range) and a sum. All three are
linear in the data, so their JVPs apply the op to the tangent. Indices carry no gradient."""
from __future__ import annotations

from ...errors import AutodiffError
from ...ir.ops.indexing import GatherElements, TopK
from ...ir.ops.shape import Gather
from ...ir.shapes import normalize_axis
from ..registry import jvp_rule, vjp_rule


@vjp_rule(Gather)
def gather_vjp(b, node, ins, outs, cts):
    ct = cts[0]
    if ct is None or not node.outputs[0].dtype.is_float:
        return [None, None]
    x, idx = ins
    ax = normalize_axis(node.op.axis, b.shape_of(x).rank)
    size = b.shape_of(x).dims[ax]
    if not isinstance(size, int):
        raise AutodiffError(f"{node.describe()}: the gradient of gather needs a static size "
                            f"along axis {ax}, got {size!r}; bind the symbol first")
    return [b.gather_backward(ct, idx, ax, size), None]


def scatter_along(b, ct, idx, axis: int, x_dims: tuple):
    """The transpose of take_along_axis: out[.., j, ..] = sum_i ct[.., i, ..] [idx[.., i, ..]
    == j] along `axis`, zero-padded where idx's other dims are shorter than x's."""
    n = x_dims[axis]
    rank = len(x_dims)
    idx_dims = b.shape_of(idx).dims
    norm = b.where(b.lt(idx, 0), b.add(idx, n), idx)
    hot = b.eq(b.reshape(norm, idx_dims + (1,)), b.arange(n, dtype=b.shape_of(idx).dtype))
    picked = b.mul(b.reshape(ct, idx_dims + (1,)), b.cast(hot, b.shape_of(ct).dtype))
    summed = b.sum(picked, axis)  # [.. idx dims without axis .., n]
    perm = tuple(range(axis)) + (rank - 1,) + tuple(range(axis, rank - 1))
    out = b.transpose(summed, perm) if axis != rank - 1 else summed
    have = b.shape_of(out).dims
    pads = []
    for i, (got, want) in enumerate(zip(have, x_dims)):
        if got == want:  # symbolic dims (a batch) compare by name
            pads.append((0, 0))
        elif isinstance(got, int) and isinstance(want, int):
            pads.append((0, want - got))
        else:
            raise AutodiffError(f"the gradient of a gather along axis {axis} needs the indices' "
                                f"dim {i} ({got!r}) to equal the data's ({want!r}) or both to "
                                "be static")
    return b.pad(out, tuple(pads)) if any(p[1] for p in pads) else out


@vjp_rule(GatherElements)
def gather_elements_vjp(b, node, ins, outs, cts):
    ct = cts[0]
    if ct is None or not node.outputs[0].dtype.is_float:
        return [None, None]
    x, idx = ins
    dims = b.shape_of(x).dims
    return [scatter_along(b, ct, idx, normalize_axis(node.op.axis, len(dims)), dims), None]


@vjp_rule(TopK)
def top_k_vjp(b, node, ins, outs, cts):
    ct = cts[0]
    if ct is None or not node.outputs[0].dtype.is_float:
        return [None]
    dims = b.shape_of(ins[0]).dims
    return [scatter_along(b, ct, outs[1], normalize_axis(node.op.axis, len(dims)), dims)]


@jvp_rule(Gather, GatherElements)
def gather_jvp(b, node, ins, outs, tangents):
    t = tangents[0]
    return [None if t is None else b.add_node(node.op, (t, ins[1]))[0]]


@jvp_rule(TopK)
def top_k_jvp(b, node, ins, outs, tangents):
    t = tangents[0]
    if t is None or not node.outputs[0].dtype.is_float:
        return [None, None]
    return [b.gather_elements(t, outs[1], node.op.axis), None]
