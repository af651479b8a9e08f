"""ONNX matrix products: MatMul, Gemm (transposed weights transposed once, at import, into a
new param) and two-operand Einsum contractions written as transpose + matmul (+ reshape), so the
fusions see ordinary matmuls."""
from __future__ import annotations

import re

from ....ir.ops.io import Param
from ....ir.symbolic import SymDim
from ..context import ImportContext, NodeView, converter


@converter("MatMul")
def matmul(ctx: ImportContext, node: NodeView):
    return [ctx.g.matmul(ctx.value(node, 0), ctx.value(node, 1))]


def transposed_weight(ctx: ImportContext, v):
    """`v` transposed: a new param holding the transposed stored value when `v` is a 2-D
    param with a value (computed once, here), else a transpose node."""
    g = ctx.g
    node = g.node(v)
    if isinstance(node.op, Param) and node.op.name in g.weights and len(ctx.dims(v)) == 2:
        name = f"{node.op.name}.T"
        try:
            return g.node_by_name(name).value
        except Exception:  # noqa: BLE001 - not made yet
            w = g.weights[node.op.name].T.copy()
            with g.provenance_scope(node.provenance):
                return g.param(name, node.op.shape.with_dims(w.shape), value=w)
    return g.transpose(v, (1, 0))


@converter("Gemm")
def gemm(ctx, node):
    g = ctx.g
    a, b = ctx.value(node, 0), ctx.value(node, 1)
    if node.attr("transA", 0):
        a = g.transpose(a, (1, 0))
    if node.attr("transB", 0):
        b = transposed_weight(ctx, b)
    y = g.matmul(a, b)
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if alpha != 1.0:
        y = g.mul(y, ctx.const_like(alpha, y))
    if ctx.has(node, 2) and beta != 0.0:
        c = ctx.value(node, 2)
        if beta != 1.0:
            c = g.mul(c, ctx.const_like(beta, c))
        y = g.add(y, c)
    return [y]


_TERM = re.compile(r"^[a-zA-Z.]*$")


def _letters(spec: str, rank: int, ctx, node) -> list[str]:
    """Subscript letters of one operand, with '...' expanded to fresh upper-case letters."""
    if "..." in spec:
        head, tail = spec.split("...")
        n = rank - len(head) - len(tail)
        if n < 0:
            raise ctx.fail(node, f"einsum term {spec!r} does not fit rank {rank}")
        return list(head) + [chr(ord("Z") - i) for i in range(n)][::-1] + list(tail)
    if len(spec) != rank:
        raise ctx.fail(node, f"einsum term {spec!r} does not fit rank {rank}")
    return list(spec)


@converter("Einsum")
def einsum(ctx, node):
    eq = node.attr("equation").replace(" ", "")
    vals = [ctx.value(node, i) for i in range(len(node.inputs))]
    lhs, _, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(vals) or len(vals) not in (1, 2) or not all(_TERM.match(t) for t in
                                                                     terms):
        raise ctx.fail(node, f"einsum {eq!r}: braze imports one- and two-operand forms")
    ins = [_letters(t, len(ctx.dims(v)), ctx, node) for t, v in zip(terms, vals)]
    if not _:
        counts = {c: sum(t.count(c) for t in ins) for c in set(sum(ins, []))}
        out_l = sorted(c for c, n in counts.items() if n == 1)
    else:
        ell = max((len(ctx.dims(v)) - len(t.replace("...", "")) for t, v in zip(terms, vals)),
                  default=0)
        out_l = _letters(out, len(out.replace("...", "")) + (ell if "..." in out else 0), ctx,
                         node)
    for i, (v, t) in enumerate(zip(vals, ins)):
        vals[i], ins[i] = _diagonals(ctx, node, v, t)
    if len(vals) == 1:
        return [_reduce_to(ctx, vals[0], ins[0], out_l)]
    a, b = vals
    la, lb = ins
    # letters only one side uses and the output does not: sum them out first
    a, la = _sum_out(ctx, a, la, set(lb) | set(out_l))
    b, lb = _sum_out(ctx, b, lb, set(la) | set(out_l))
    batch = [c for c in la if c in lb and c in out_l]
    contract = [c for c in la if c in lb and c not in out_l]
    lfree = [c for c in la if c not in lb]
    rfree = [c for c in lb if c not in la]
    size = {c: d for t, v in ((la, a), (lb, b)) for c, d in zip(t, ctx.dims(v))}
    g = ctx.g
    a = _permute(g, a, la, batch + lfree + contract)
    b = _permute(g, b, lb, batch + contract + rfree)
    k = _prod(size, contract)
    n = _prod(size, rfree)
    if len(contract) != 1 or len(rfree) != 1:
        b = g.reshape(b, [size[c] for c in batch] + [k, n])
        a = g.reshape(a, [size[c] for c in batch + lfree] + [k])
    if batch and len(lfree) != 1:
        a = g.reshape(a, [size[c] for c in batch] + [_prod(size, lfree), k])
    y = g.matmul(a, b)
    full = batch + lfree + rfree
    if tuple(ctx.dims(y)) != tuple(size[c] for c in full):
        y = g.reshape(y, [size[c] for c in full])
    return [_permute(g, y, full, out_l)]


def _diagonals(ctx, node, v, letters: list[str]):
    """A term that repeats a subscript ("ii") reads a diagonal: bring the two axes last, flatten
    them and step by n + 1 (static n)."""
    g = ctx.g
    while len(set(letters)) != len(letters):
        c = next(c for c in letters if letters.count(c) > 1)
        p = letters.index(c)
        q = letters.index(c, p + 1)
        dims = ctx.dims(v)
        n = dims[p]
        if dims[q] != n or not isinstance(n, int):
            raise ctx.fail(node, f"einsum subscript {c!r} repeats over axes of sizes {n} and "
                                 f"{dims[q]}; a diagonal needs equal static sizes")
        rest = [i for i in range(len(letters)) if i not in (p, q)]
        perm = rest + [p, q]
        if perm != sorted(perm):
            v = g.transpose(v, tuple(perm))
        v = g.reshape(v, [dims[i] for i in rest] + [n * n])
        v = g.slice(v, -1, 0, n * n, n + 1)
        letters = [letters[i] for i in rest] + [c]
    return v, letters


def _prod(size, letters):
    p = SymDim.of(1)
    for c in letters:
        p = p * SymDim.of(size[c])
    return p.to_dim()


def _permute(g, v, have: list[str], want: list[str]):
    if have == want:
        return v
    return g.transpose(v, tuple(have.index(c) for c in want))


def _sum_out(ctx, v, letters, keep: set):
    drop = [i for i, c in enumerate(letters) if c not in keep]
    if not drop:
        return v, letters
    return ctx.g.sum(v, drop), [c for c in letters if c in keep]


def _reduce_to(ctx, v, letters, out_l):
    v, letters = _sum_out(ctx, v, letters, set(out_l))
    return _permute(ctx.g, v, letters, list(out_l))
