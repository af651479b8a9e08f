"""Layout helpers the lowerings share: permutations, products of (symbolic) dims, and transpose
/ reshape that add no node when they would change nothing."""
from __future__ import annotations

from collections.abc import Sequence

from ...ir.graph import Graph
from ...ir.op import Value
from ...ir.shapes import Dim
from ...ir.symbolic import SymDim


def product_dim(dims: Sequence[Dim]) -> Dim:
    """The product of `dims` as one dim (an int, or a symbolic product such as "5*b")."""
    total = SymDim.of(1)
    for d in dims:
        total = total * SymDim.of(d)
    return total.to_dim()


def inverse_permutation(perm: Sequence[int]) -> tuple[int, ...]:
    """The permutation that undoes `perm` (transpose by perm, then by this, is the identity)."""
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def transpose_if_needed(g: Graph, x: Value, perm: Sequence[int]) -> Value:
    """`g.transpose(x, perm)`, or `x` itself when `perm` is the identity."""
    perm = tuple(perm)
    return x if perm == tuple(range(len(perm))) else g.transpose(x, perm)


def reshape_if_needed(g: Graph, x: Value, dims: Sequence[Dim]) -> Value:
    """`g.reshape(x, dims)`, or `x` itself when it already has `dims`."""
    dims = tuple(dims)
    return x if g.shape_of(x).dims == dims else g.reshape(x, dims)


def per_channel(g: Graph, v: Value, rank: int) -> Value:
    """A `[C]` vector shaped to broadcast along axis 1 of a rank-`rank` `[N, C, ...]` tensor."""
    c = g.shape_of(v).dims[0]
    return reshape_if_needed(g, v, (c,) + (1,) * (rank - 2))
