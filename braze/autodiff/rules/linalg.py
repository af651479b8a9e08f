"""VJP and JVP rules of the matrix products. `matmul` follows NumPy (1-D operands promoted,
batch dims broadcast, so cotangents are summed back down); `dot_general`'s cotangents are
dot_generals against the other operand, transposed back into the operand's axis order."""
from __future__ import annotations

from ...ir.graph import Graph
from ...ir.op import Value
from ...ir.ops.linalg import DotGeneral, MatMul
from ..emit import add_optional
from ..registry import jvp_rule, unbroadcast, vjp_rule


def _swap_last(b: Graph, v: Value) -> Value:
    rank = b.shape_of(v).rank
    return b.transpose(v, tuple(range(rank - 2)) + (rank - 1, rank - 2))


@vjp_rule(MatMul)
def matmul_vjp(b, node, ins, outs, cts):
    (ct,) = cts
    a, c = ins
    if ct is None:
        return [None, None]
    sa, sc = b.shape_of(a), b.shape_of(c)
    a2 = b.reshape(a, (1,) + sa.dims) if sa.rank == 1 else a
    c2 = b.reshape(c, sc.dims + (1,)) if sc.rank == 1 else c
    ct_dims = b.shape_of(ct).dims
    if sa.rank == 1:
        ct_dims = ct_dims[:-1] + (1,) + ct_dims[-1:] if sc.rank > 1 else ct_dims + (1,)
    if sc.rank == 1:
        ct_dims = ct_dims + (1,)
    ct2 = b.reshape(ct, ct_dims) if ct_dims != b.shape_of(ct).dims else ct
    da = unbroadcast(b, b.matmul(ct2, _swap_last(b, c2)), b.shape_of(a2))
    dc = unbroadcast(b, b.matmul(_swap_last(b, a2), ct2), b.shape_of(c2))
    if sa.rank == 1:
        da = b.reshape(da, sa.dims)
    if sc.rank == 1:
        dc = b.reshape(dc, sc.dims)
    return [da, dc]


@jvp_rule(MatMul)
def matmul_jvp(b, node, ins, outs, tangents):
    ta, tc = tangents
    a, c = ins
    left = None if ta is None else b.matmul(ta, c)
    right = None if tc is None else b.matmul(a, tc)
    return [add_optional(b, left, right)]


def _dot_operand_ct(b: Graph, op: DotGeneral, ct: Value, other: Value, rank: int,
                    side: str) -> Value:
    """Cotangent of the `side` operand (rank `rank`) of `op`, from the output cotangent and
    the other operand."""
    mine, theirs = ("lhs", "rhs") if side == "lhs" else ("rhs", "lhs")
    my_contract = op.lhs_contract if side == "lhs" else op.rhs_contract
    their_contract = op.rhs_contract if side == "lhs" else op.lhs_contract
    my_batch = op.lhs_batch if side == "lhs" else op.rhs_batch
    their_batch = op.rhs_batch if side == "lhs" else op.lhs_batch
    other_rank = b.shape_of(other).rank
    n_batch = len(my_batch)
    n_lhs_free = len(op.free_dims(rank if side == "lhs" else other_rank, "lhs"))
    my_free = op.free_dims(rank, mine)
    their_free = op.free_dims(other_rank, theirs)
    # ct dims: batch, lhs free, rhs free; contract ct's `theirs` free dims with other's free dims
    start = n_batch + (n_lhs_free if side == "lhs" else 0)
    ct_their_free = tuple(range(start, start + len(their_free)))
    res = b.dot_general(ct, other, ct_their_free, tuple(their_free),
                        tuple(range(n_batch)), tuple(their_batch))
    # res dims: batch, my free (in order), other's remaining dims = their contract dims sorted
    remaining = sorted(their_contract)
    source = [0] * rank
    for i, d in enumerate(my_batch):
        source[d] = i
    for j, d in enumerate(my_free):
        source[d] = n_batch + j
    for d_mine, d_theirs in zip(my_contract, their_contract):
        source[d_mine] = n_batch + len(my_free) + remaining.index(d_theirs)
    if source == list(range(rank)):
        return res
    return b.transpose(res, tuple(source))


@vjp_rule(DotGeneral)
def dot_general_vjp(b, node, ins, outs, cts):
    (ct,) = cts
    a, c = ins
    if ct is None:
        return [None, None]
    op = node.op
    return [_dot_operand_ct(b, op, ct, c, b.shape_of(a).rank, "lhs"),
            _dot_operand_ct(b, op, ct, a, b.shape_of(c).rank, "rhs")]


@jvp_rule(DotGeneral)
def dot_general_jvp(b, node, ins, outs, tangents):
    ta, tc = tangents
    a, c = ins
    op = node.op
    left = None if ta is None else b.add_node(op, (ta, c))[0]
    right = None if tc is None else b.add_node(op, (a, tc))[0]
    return [add_optional(b, left, right)]
