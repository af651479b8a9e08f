"""Layout canonicalization: transposes and reshapes written the many ways exporters write them
become one canonical form, so head splits, key transposes and linear layers look the same in
every export. Each rule replaces only its root (an interior node that something else reads
stays for that reader; dead ones go in DCE):

  transpose(transpose(x, p), q)            -> transpose(x, p∘q)      (identity: x)
  reshape(reshape(x))                      -> reshape(x)             (same dims: x)
  transpose(x, identity) / reshape, expand, cast to what x already is -> x
  reshape(transpose(reshape(x, merge), p), split-back) -> transpose(x, p on the merged groups)
  transpose(reshape(x, merge), p)          -> reshape(transpose(x, p on the groups), merge')
    (in these two, transposes producing x compose into the new one in the same match)
  reshape(x) that only moves size-1 axes   -> transpose(x, p)
  reshape(F(reshape(x, [prod(L), E])), [L.., N]) for row-wise F (elementwise, last-axis
                                           norms, @ w) -> F(x)  (rows unflattened)
  reshape(flat(x) @ w (+ b), [L.., N])     -> x' @ w (+ b)   (a linear layer on flattened rows)
  split(x, axis, sizes)                    -> narrow(x, axis, start_i, size_i) per piece
                                              (as the ONNX importer writes Split)
"""
from __future__ import annotations

import dataclasses
import functools

from ...ir.ops.elementwise import Binary, BinaryFn, Cast, Unary
from ...ir.ops.linalg import MatMul
from ...ir.ops.norm import LayerNorm, RmsNorm
from ...ir.ops.shape import Expand, Reshape, Split, Transpose
from ...ir.shapes import normalize_axis
from ...ir.symbolic import SymDim
from ...rewrite import Match, Rule

__all__ = ["LAYOUT_RULES", "merge_groups", "live_users", "LIVE_READS"]


def _producer(g, v):
    return g.nodes[v.node]


_LIVE_DEPTH = 4  # how far below a reader `live_users` looks for a use
LIVE_READS = _LIVE_DEPTH + 1  # `Rule.reads_users` of a rule calling live_users on its nodes


def _live(g, node, depth: int) -> bool:
    if g.is_output(node.value) or depth == 0:
        return True
    return any(_live(g, u, depth - 1) for u in g.users(node.value))


def live_users(g, v, depth: int = _LIVE_DEPTH) -> list:
    """The readers of v whose results are used (nodes a rewrite made dead stay in the graph
    until the pass's sweeps end; a chain longer than `depth` counts as used). It reads the
    graph up to `depth` + 1 edges below v: a rule calling it declares `reads_users` (see
    `Rule`)."""
    return [u for u in g.users(v) if _live(g, u, depth)]


def _root_match(rule, g, node, values: dict, nodes: dict | None = None, data=None,
                consumed: tuple[int, ...] | None = None) -> Match:
    return Match(rule, g, node, {"root": node, **(nodes or {})}, values, consumed or (node.id,),
                 data=data)


def _sole_reads(g, node, chain) -> tuple[int, ...]:
    """The root and the leading nodes of `chain` (what the match reads above it, nearest
    first) that nothing outside the match reads or returns: the match removes them at once,
    instead of leaving them dead (for other rules to rewrite) until DCE. It reads their
    readers: a rule calling it declares `reads_users` 1."""
    ids = [node.id]
    for n in chain:
        if g.is_output(n.value) or any(u.id not in ids for u in g.users(n.id)):
            break
        ids.append(n.id)
    return tuple(ids)


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
                          root_test=lambda op: isinstance(op, Transpose), depth=2)


def _compose_reshapes(g, node, ctx):
    inner = _producer(g, node.inputs[0])
    if isinstance(inner.op, Reshape):
        yield _root_match(COMPOSE_RESHAPES, g, node, {"x": inner.inputs[0]})


def _build_reshape(b, m):
    x = m.v("x")
    dims = m.root.outputs[0].dims
    return x if b.shape_of(x).dims == dims else b.reshape(x, dims)


COMPOSE_RESHAPES = Rule("ComposeReshapes", _build_reshape, matcher=_compose_reshapes,
                        root_test=lambda op: isinstance(op, Reshape), depth=2)


def _identity(g, node, ctx):
    op, x = node.op, node.inputs[0]
    src = g.shape_of(x)
    same = ((isinstance(op, Transpose) and op.perm == tuple(range(len(op.perm))))
            or (isinstance(op, (Reshape, Expand)) and src.dims == node.outputs[0].dims)
            or (isinstance(op, Cast) and op.dtype == src.dtype))
    if same:
        yield _root_match(DROP_IDENTITY, g, node, {"x": x})


DROP_IDENTITY = Rule("DropIdentityLayout", lambda b, m: m.v("x"), matcher=_identity,
                     root_test=lambda op: isinstance(op, (Transpose, Reshape, Expand, Cast)),
                     depth=1)


# -- reshape / transpose / reshape ----------------------------------------------------------------
@functools.lru_cache(maxsize=1 << 12)
def _prod(dims: tuple) -> SymDim:
    """The product of `dims` (ints and symbols; a pure function of the tuple, memoized)."""
    p = SymDim.of(1)
    for d in dims:
        p = p * SymDim.of(d)
    return p


def merge_groups(src: tuple, dst: tuple) -> list[range] | None:
    """For a reshape that only merges consecutive axes: the src axes making each dst axis
    (`[batch, 4, seq, 16] -> [4*batch, seq, 16]` gives [0:2], [2:3], [3:4]); else None."""
    groups = _merge_groups(tuple(src), tuple(dst))
    return None if groups is None else list(groups)


@functools.lru_cache(maxsize=1 << 12)
def _merge_groups(src: tuple, dst: tuple) -> tuple[range, ...] | None:
    """`merge_groups` as a tuple, memoized (dims are ints and strings: hashable)."""
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
    return tuple(groups)


_FOLDS = 1  # transposes above x that a match composes in (more: ComposeTransposes, later)


def _fold_transposes(g, x, perm: tuple) -> tuple:
    """(x', perm', folded) with transpose(x', perm') = transpose(x, perm): up to `_FOLDS`
    transposes producing x (`folded`, nearest first) composed in, as ComposeTransposes would in
    the next sweeps. It reads `_FOLDS` edges above x."""
    folded = []
    for _ in range(_FOLDS):
        n = _producer(g, x)
        if not isinstance(n.op, Transpose):
            break
        perm = tuple(n.op.perm[k] for k in perm)
        x = n.inputs[0]
        folded.append(n)
    return x, perm, folded


def _collapse(g, node, ctx):
    mid = _producer(g, node.inputs[0])
    if not isinstance(mid.op, Transpose):
        return
    first = _producer(g, mid.inputs[0])
    if not isinstance(first.op, Reshape):
        return
    x = first.inputs[0]
    xd, yd, zd = g.shape_of(x).dims, first.outputs[0].dims, node.outputs[0].dims
    if len(xd) < len(yd):
        return  # a split (merge_groups would say so after multiplying dims)
    groups = _merge_groups(xd, yd)
    if groups is None:
        return  # the first reshape must only merge axes
    p = mid.op.perm
    ranges = [groups[a] for a in p]  # x axes of each transposed axis, in output order
    want = tuple(xd[k] for r in ranges for k in r)
    if want != tuple(zd):
        return  # the second reshape does not split the merged axes back
    x, perm, folded = _fold_transposes(g, x, tuple(k for r in ranges for k in r))
    yield _root_match(COLLAPSE_RESHAPE_TRANSPOSE, g, node, {"x": x}, data={"perm": perm},
                      consumed=_sole_reads(g, node, [mid, first, *folded]))


COLLAPSE_RESHAPE_TRANSPOSE = Rule("CollapseReshapeTranspose", _build_transpose,
                                  matcher=_collapse, root_test=lambda op: isinstance(op, Reshape),
                                  depth=3 + _FOLDS,  # reshape <- transpose <- reshape <- x
                                  reads_users=1)  # which interiors only the match reads


def _transpose_of_merge(g, node, ctx):
    """transpose(reshape(x, merge), p) where the reshape only merges consecutive axes (at least
    two into one): the transpose moves the groups of x instead, and a merge follows. Exporters
    write repeat_kv and key transposes on [B*H, S, D] (bmm) views; this brings them back to
    the head axes."""
    inner = _producer(g, node.inputs[0])
    if not isinstance(inner.op, Reshape):
        return
    x = inner.inputs[0]
    xd, yd = g.shape_of(x).dims, inner.outputs[0].dims
    if len(xd) <= len(yd):
        return
    groups = _merge_groups(xd, yd)
    if groups is None:
        return
    x, perm, folded = _fold_transposes(g, x, tuple(k for a in node.op.perm for k in groups[a]))
    yield _root_match(TRANSPOSE_BEFORE_MERGE, g, node, {"x": x},
                      data={"perm": perm, "dims": node.outputs[0].dims},
                      consumed=_sole_reads(g, node, [inner, *folded]))


def _build_transpose_before_merge(b, m):
    return b.reshape(_build_transpose(b, m), m.data["dims"])


TRANSPOSE_BEFORE_MERGE = Rule("TransposeBeforeMerge", _build_transpose_before_merge,
                              matcher=_transpose_of_merge,
                              root_test=lambda op: isinstance(op, Transpose),
                              depth=2 + _FOLDS,  # transpose <- reshape <- x
                              reads_users=1)  # which interiors only the match reads


def _unit_axes_reshape(g, node, ctx):
    """A reshape that keeps the rank and the order of the non-unit axes, only moving size-1
    axes ([B, 16, 1, S] -> [B, 1, 16, S]), is a transpose (which then composes)."""
    x = node.inputs[0]
    xd, zd = g.shape_of(x).dims, node.outputs[0].dims
    if len(xd) != len(zd) or xd == zd:
        return
    xs = [i for i, d in enumerate(xd) if d != 1]
    zs = [i for i, d in enumerate(zd) if d != 1]
    if len(xs) != len(zs) or [xd[i] for i in xs] != [zd[i] for i in zs]:
        return
    ones = iter(i for i, d in enumerate(xd) if d == 1)
    real = iter(xs)
    perm = tuple(next(real) if d != 1 else next(ones) for d in zd)
    yield _root_match(UNIT_AXES_AS_TRANSPOSE, g, node, {"x": x}, data={"perm": perm})


UNIT_AXES_AS_TRANSPOSE = Rule("UnitAxesReshapeAsTranspose", _build_transpose,
                              matcher=_unit_axes_reshape,
                              root_test=lambda op: isinstance(op, Reshape),
                              depth=1)  # the reshape and its input's type


# -- row-wise ops on flattened rows ---------------------------------------------------------------
def _row_flat(g, v):
    """x when v = reshape(x, [prod(L), E]) with x [L..., E] (rank >= 3); else None."""
    n = _producer(g, v)
    if not isinstance(n.op, Reshape):
        return None
    x = n.inputs[0]
    xd, fd = g.shape_of(x).dims, n.outputs[0].dims
    if len(fd) != 2 or len(xd) < 3 or xd[-1] != fd[1] or _prod(xd[:-1]) != SymDim.of(fd[0]):
        return None
    return x


def _row_inputs(g, node) -> list[int] | None:
    """Indices of the [M, E] operands of a row-wise op on [M, *] rows (None: not row-wise)."""
    op, ins = node.op, node.inputs
    if node.outputs[0].rank != 2:
        return None
    if isinstance(op, (LayerNorm, RmsNorm)):
        return [0] if normalize_axis(op.axis, 2) == 1 else None
    if isinstance(op, (Unary, Cast)):
        return [0]
    if isinstance(op, MatMul):
        return [0] if g.shape_of(ins[1]).rank == 2 else None
    if isinstance(op, Binary):
        ranks = [g.shape_of(v).rank for v in ins]
        if any(r not in (0, 1, 2) for r in ranks) or 2 not in ranks:
            return None
        return [i for i in (0, 1) if ranks[i] == 2]
    return None


_ROWS_LIMIT = 64  # row-wise nodes UnflattenRows walks through (a chain at most this long)


def _unflatten_rows(g, node, ctx, limit: int = _ROWS_LIMIT):
    """reshape(F(reshape(x, [prod(L), E]), ...), [L..., N]) where F is a small graph of
    row-wise ops (elementwise with vectors, last-axis norms, x @ w) on the flattened rows: F
    runs on the [L..., E] rows themselves (OPT flattens [B, S, E] to [B*S, E] around its MLP),
    so residual norms and linear layers see [B, S, E]. Every node of F and every flattening
    reshape it reads must be read only inside F (nothing is computed twice)."""
    lead = node.outputs[0].dims[:-1]
    src = node.inputs[0]
    if len(lead) < 2 or g.shape_of(src).rank != 2 or _prod(lead) != SymDim.of(
            g.shape_of(src).dims[0]):
        return
    inner, leaves, stack = {}, {}, [src]
    while stack:
        v = stack.pop()
        if v.node in inner or v.node in leaves:
            continue
        x = _row_flat(g, v)
        if x is not None and g.shape_of(x).dims[:-1] == lead:
            leaves[v.node] = x
            continue
        n = _producer(g, v)
        rows = _row_inputs(g, n)
        if rows is None or len(inner) >= limit:
            return
        inner[v.node] = rows
        stack.extend(n.inputs[i] for i in rows)
    if not leaves:
        return
    inside = set(inner) | {node.id}
    for nid in list(inner) + list(leaves):
        n = g.nodes[nid]
        if g.is_output(n.value) or any(u.id not in inside for u in live_users(g, n.value)):
            return
    values = {f"leaf{nid}": x for nid, x in leaves.items()}
    for nid, rows in inner.items():
        for i, v in enumerate(g.nodes[nid].inputs):
            if i not in rows:
                values[f"arg{nid}_{i}"] = v
    yield _root_match(UNFLATTEN_ROWS, g, node, values,
                      data={"inner": inner, "leaves": set(leaves), "rank": len(lead) + 1})


def _build_unflattened(b, m):
    g, d = m.graph, m.data
    made: dict[int, object] = {}

    def rows(v):
        if v.node in d["leaves"]:
            return m.v(f"leaf{v.node}")
        if v.node not in made:
            n = g.nodes[v.node]
            ins = [rows(u) if i in d["inner"][n.id] else m.v(f"arg{n.id}_{i}")
                   for i, u in enumerate(n.inputs)]
            op = n.op
            if isinstance(op, (LayerNorm, RmsNorm)):
                op = dataclasses.replace(op, axis=d["rank"] - 1)
            made[n.id] = b.add_node(op, ins)[0]
        return made[v.node]

    y = rows(m.root.inputs[0])
    dims = m.root.outputs[0].dims
    return y if b.shape_of(y).dims == dims else b.reshape(y, dims)


UNFLATTEN_ROWS = Rule("UnflattenRows", _build_unflattened, matcher=_unflatten_rows,
                      root_test=lambda op: isinstance(op, Reshape),
                      depth=_ROWS_LIMIT + 2, reads_users=LIVE_READS)


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
    # the interiors feed only this layer: the match removes them at once (not left dead)
    consumed = tuple(n.id for n in (node, add, inner, flat) if n is not None)
    yield _root_match(UNFLATTEN_LINEAR, g, node, values, data={"k": fd[1], "lead": lead},
                      consumed=consumed)


def _build_linear(b, m):
    x = m.v("x")
    want = m.data["lead"] + (m.data["k"],)
    if b.shape_of(x).dims != want:
        x = b.reshape(x, want)
    y = b.matmul(x, m.v("w"))
    return b.add(y, m.v("b")) if "b" in m.values else y


UNFLATTEN_LINEAR = Rule("UnflattenLinear", _build_linear, matcher=_unflatten_linear,
                        root_test=lambda op: isinstance(op, Reshape),
                        depth=4, reads_users=1)  # reshape <- add <- matmul <- reshape <- x

# -- split into pieces ---------------------------------------------------------------------------
def _split(g, node, ctx):
    """Every split: its pieces are narrows, the one form fusions read (a fused QKV projection's
    q / k / v columns, a gated MLP's halves), whichever frontend wrote them."""
    yield _root_match(SPLIT_AS_NARROWS, g, node, {"x": node.inputs[0]})


def _build_narrows(b, m):
    op, x = m.root.op, m.v("x")
    starts = [0]
    for size in op.sizes[:-1]:
        starts.append(starts[-1] + size)
    return tuple(b.narrow(x, op.axis, start, size) for start, size in zip(starts, op.sizes))


SPLIT_AS_NARROWS = Rule("SplitAsNarrows", _build_narrows, matcher=_split,
                        root_test=lambda op: isinstance(op, Split), depth=1)

LAYOUT_RULES = (SPLIT_AS_NARROWS, COMPOSE_TRANSPOSES, COMPOSE_RESHAPES, DROP_IDENTITY,
                COLLAPSE_RESHAPE_TRANSPOSE, TRANSPOSE_BEFORE_MERGE, UNIT_AXES_AS_TRANSPOSE,
                UNFLATTEN_LINEAR, UNFLATTEN_ROWS)
