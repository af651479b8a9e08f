"""Layout canonicalization: transposes and reshapes written the many ways exporters write them
become one canonical form, so head splits, key transposes and linear layers look the same in
every export. Each rule replaces only its root (an interior node that something else reads
stays for that reader; dead ones go in DCE):

  transpose(transpose(x, p), q)            -> transpose(x, p∘q)      (identity: x)
  reshape(reshape(x))                      -> reshape(x)             (same dims: x)
  transpose(x, identity) / reshape, expand, cast to what x already is -> x
  reshape(transpose(reshape(x, merge), p), split-back) -> transpose(x, p on the merged groups)
  reshape(flat(x) @ w (+ b), [L.., N])     -> x' @ w (+ b)   (a linear layer on flattened rows)
"""
from __future__ import annotations

from ...ir.ops.elementwise import Binary, BinaryFn, Cast
from ...ir.ops.linalg import MatMul
from ...ir.ops.shape import Expand, Reshape, Transpose
from ...ir.symbolic import SymDim
from ...rewrite import Match, Rule

__all__ = ["LAYOUT_RULES", "merge_groups"]


def _producer(g, v):
    return g.nodes[v.node]


def _root_match(rule, g, node, values: dict, nodes: dict | None = None, data=None) -> Match:
    return Match(rule, g, node, {"root": node, **(nodes or {})}, values, (node.id,),
                 data=data)


# -- transpose / reshape chains -------------------------------------------------------------------
def _compose_transposes(g, node, ctx):
    inner = _producer(g, node.inputs[0])
    if isinstance(inner.op, Transpose):
        perm = tuple(inner.op.perm[o] for o in node.op.perm)
        yield _root_match(COMPOSE_TRANSPOSES, g, node, {"x": inner.inputs[0]}, data={"perm": perm})


def _build_transpose(b, m):
    perm = m.data["perm"]
    x = m.v("x")
    return x if perm == tuple(range(len(perm))) else b.transpose(x, perm)


COMPOSE_TRANSPOSES = Rule("ComposeTransposes", _build_transpose, matcher=_compose_transposes,
                          root_test=lambda op: isinstance(op, Transpose))


def _compose_reshapes(g, node, ctx):
    inner = _producer(g, node.inputs[0])
    if isinstance(inner.op, Reshape):
        yield _root_match(COMPOSE_RESHAPES, g, node, {"x": inner.inputs[0]})


def _build_reshape(b, m):
    x = m.v("x")
    dims = m.root.outputs[0].dims
    return x if b.shape_of(x).dims == dims else b.reshape(x, dims)


COMPOSE_RESHAPES = Rule("ComposeReshapes", _build_reshape, matcher=_compose_reshapes,
                        root_test=lambda op: isinstance(op, Reshape))


def _identity(g, node, ctx):
    op, x = node.op, node.inputs[0]
    src = g.shape_of(x)
    same = ((isinstance(op, Transpose) and op.perm == tuple(range(len(op.perm))))
            or (isinstance(op, (Reshape, Expand)) and src.dims == node.outputs[0].dims)
            or (isinstance(op, Cast) and op.dtype == src.dtype))
    if same:
        yield _root_match(DROP_IDENTITY, g, node, {"x": x})


DROP_IDENTITY = Rule("DropIdentityLayout", lambda b, m: m.v("x"), matcher=_identity,
                     root_test=lambda op: isinstance(op, (Transpose, Reshape, Expand, Cast)))


# -- reshape / transpose / reshape ----------------------------------------------------------------
def _prod(dims) -> SymDim:
    p = SymDim.of(1)
    for d in dims:
        p = p * SymDim.of(d)
    return p


def merge_groups(src: tuple, dst: tuple) -> list[range] | None:
    """For a reshape that only merges consecutive axes: the src axes making each dst axis
    (`[batch, 4, seq, 16] -> [4*batch, seq, 16]` gives [0:2], [2:3], [3:4]); else None."""
    groups, i = [], 0
    for d in dst:
        start, p = i, SymDim.of(1)
        while i < len(src):
            p = p * SymDim.of(src[i])
            i += 1
            if p == SymDim.of(d):
                break
        else:
            return None
        groups.append(range(start, i))
    if i != len(src):
        if not groups or any(src[k] != 1 for k in range(i, len(src))):
            return None
        groups[-1] = range(groups[-1].start, len(src))
    return groups


def _collapse(g, node, ctx):
    mid = _producer(g, node.inputs[0])
    if not isinstance(mid.op, Transpose):
        return
    first = _producer(g, mid.inputs[0])
    if not isinstance(first.op, Reshape):
        return
    x = first.inputs[0]
    xd, yd, zd = g.shape_of(x).dims, first.outputs[0].dims, node.outputs[0].dims
    groups = merge_groups(xd, yd)
    if groups is None:
        return  # the first reshape must only merge axes
    p = mid.op.perm
    ranges = [groups[a] for a in p]  # x axes of each transposed axis, in output order
    want = tuple(xd[k] for r in ranges for k in r)
    if want != tuple(zd):
        return  # the second reshape does not split the merged axes back
    perm = tuple(k for r in ranges for k in r)
    yield _root_match(COLLAPSE_RESHAPE_TRANSPOSE, g, node, {"x": x}, data={"perm": perm})


COLLAPSE_RESHAPE_TRANSPOSE = Rule("CollapseReshapeTranspose", _build_transpose,
                                  matcher=_collapse, root_test=lambda op: isinstance(op, Reshape))


# -- a linear layer applied to flattened rows -----------------------------------------------------
def _unflatten_linear(g, node, ctx):
    """reshape(flat(x) @ w (+ b)) with flat(x) [M, K] and the result [L..., N], prod(L) = M,
    where x's dims start with L: the same linear layer on x itself (without flattening)."""
    inner = _producer(g, node.inputs[0])
    bias = None
    if isinstance(inner.op, Binary) and inner.op.fn is BinaryFn.ADD:
        for mm_v, b_v in ((inner.inputs[0], inner.inputs[1]), (inner.inputs[1], inner.inputs[0])):
            mm = _producer(g, mm_v)
            if isinstance(mm.op, MatMul) and g.shape_of(b_v).rank <= 1:
                bias, add, inner = b_v, inner, mm
                break
        else:
            return
    else:
        add = None
    if not isinstance(inner.op, MatMul):
        return
    flat = _producer(g, inner.inputs[0])
    w = inner.inputs[1]
    if not isinstance(flat.op, Reshape) or g.shape_of(w).rank != 2:
        return
    x = flat.inputs[0]
    xd = g.shape_of(x).dims
    fd, zd = flat.outputs[0].dims, node.outputs[0].dims
    if len(fd) != 2 or len(zd) < 2:
        return
    lead = tuple(zd[:-1])
    if tuple(xd[:len(lead)]) != lead or _prod(lead) != SymDim.of(fd[0]):
        return
    for interior in (flat, inner, add):  # each must feed only this layer
        if interior is not None and len(g.users(interior.value)) != 1:
            return
        if interior is not None and g.is_output(interior.value):
            return
    values = {"x": x, "w": w}
    if bias is not None:
        values["b"] = bias
    yield _root_match(UNFLATTEN_LINEAR, g, node, values, data={"k": fd[1], "lead": lead})


def _build_linear(b, m):
    x = m.v("x")
    want = m.data["lead"] + (m.data["k"],)
    if b.shape_of(x).dims != want:
        x = b.reshape(x, want)
    y = b.matmul(x, m.v("w"))
    return b.add(y, m.v("b")) if "b" in m.values else y


UNFLATTEN_LINEAR = Rule("UnflattenLinear", _build_linear, matcher=_unflatten_linear,
                        root_test=lambda op: isinstance(op, Reshape))

LAYOUT_RULES = (COMPOSE_TRANSPOSES, COMPOSE_RESHAPES, DROP_IDENTITY, COLLAPSE_RESHAPE_TRANSPOSE,
                UNFLATTEN_LINEAR)
