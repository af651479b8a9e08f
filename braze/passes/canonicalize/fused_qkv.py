"""Fused QKV projections in any layout become the canonical head split of a projection, so the
attention block fusion sees q, k and v the one way it knows:

  q = transpose(reshape(x @ w + b, [B, S, H, D]), (0, 2, 1, 3))   (or q's [B, S, H, D] form)

Exporters select q, k and v out of one projection in many layouts: GPT-2 narrows [q | k | v]
(already canonical), GPT-NeoX reshapes to [B, S, H, 3D] and narrows each head's block, BLOOM
reshapes to [B, S, H, 3, D] and gathers index j, Falcon's multi-query layout reshapes to
[B, S, H + 2, D] and narrows / gathers heads (by constants, or by integer tables that
torch.export lifts into stored params), grouped layouts (new Falcon) reshape to
[B, S, Hkv, r + 2, D]. Rather than match each, the rule reads the layout chain (reshape,
transpose, narrow, slice, gather by constant indices) between a projection and the value that
feeds the attention, and evaluates it with the reference interpreter on an index-coded
projection: each output element names the token and the projection column it reads. The chain
is data-independent (it has no other inputs), so this is exact; it is accepted when every
element reads its own token's row and the column depends only on (head, d). Then

  - columns that form one contiguous run in order  -> transpose(reshape(narrow(P, -1, a, n)))
    (the attention block fusion narrows the projection itself: no weight copy);
  - any other column set -> x @ w[:, cols] + b[cols] (a new param when w has a stored value,
    else a gather of w's columns that only reads params: weight preparation)."""
from __future__ import annotations

import hashlib

import numpy as np

from ...errors import BrazeError
from ...interpret import interpret
from ...ir.dtypes import i64
from ...ir.graph import Graph
from ...ir.ops.attention import Attention, Rope
from ...ir.ops.elementwise import Binary, BinaryFn
from ...ir.ops.indexing import Slice
from ...ir.ops.io import Input, Param
from ...ir.ops.linalg import MatMul
from ...ir.ops.norm import LayerNorm, RmsNorm
from ...ir.ops.shape import Gather, Narrow, Reshape, Transpose
from ...ir.shapes import Shape
from ...ir.symbolic import SymDim
from ...rewrite import Match, Rule
from .layout import live_users

__all__ = ["SELECT_QKV_COLUMNS"]

_LAYOUT = (Reshape, Transpose, Narrow, Slice, Gather)
_SELECT = (Narrow, Slice, Gather)
PROBE = (2, 3)  # batch and sequence lengths the layout chain is evaluated at


def _projection(g, v):
    """(x, w, b or None) when v = x @ w (+ b) with a 2-D w and a 1-D b."""
    n = g.nodes[v.node]
    b = None
    if isinstance(n.op, Binary) and n.op.fn is BinaryFn.ADD:
        for mm_v, b_v in (n.inputs, n.inputs[::-1]):
            mm = g.nodes[mm_v.node]
            if isinstance(mm.op, MatMul) and g.shape_of(b_v).rank == 1:
                n, b = mm, b_v
                break
        else:
            return None
    if not isinstance(n.op, MatMul) or g.shape_of(n.inputs[1]).rank != 2:
        return None
    return n.inputs[0], n.inputs[1], b


def _chain(g, node) -> list | None:
    """The layout nodes from `node` down to the first value they do not make (outermost
    first); gather indices must be computed from constants and dims only."""
    chain = []
    while isinstance(node.op, _LAYOUT):
        if isinstance(node.op, Gather) and not _dims_only(g, node.inputs[1]):
            return None
        chain.append(node)
        node = g.nodes[node.inputs[0].node]
    return chain


def _stored_index(g, node) -> np.ndarray | None:
    """The stored value of an integer param (an index table such as torch.export's lifted
    constants: integers are never trained); None for anything else."""
    if isinstance(node.op, Param) and node.op.shape.dtype.is_int:
        return g.weights.get(node.op.name)
    return None


def _dims_only(g, v, limit: int = 64) -> bool:
    """Whether v is computed from constants, stored integer params and symbolic dims alone (a
    few nodes at most)."""
    seen, stack = set(), [v.node]
    while stack:
        nid = stack.pop()
        if nid in seen:
            continue
        seen.add(nid)
        node = g.nodes[nid]
        if _stored_index(g, node) is not None:
            continue
        if len(seen) > limit or isinstance(node.op, (Input, Param)):
            return False
        stack.extend(u.node for u in node.inputs)
    return True


def _clone(sub, g, v, memo: dict):
    """Copy v's (dims-only) computation into `sub` (a stored integer param as a constant)."""
    if v not in memo:
        n = g.nodes[v.node]
        stored = _stored_index(g, n)
        if stored is not None:
            outs = (sub.constant(stored),)
        else:
            outs = sub.clone_node(n, [_clone(sub, g, u, memo) for u in n.inputs], g)
        memo.update(zip(n.values, outs))
    return memo[v]


def _feeds_attention(g, node) -> bool:
    """Every reader of node is an attention (as q, k or v), a rope on the way to one, or a
    per-head q/k norm whose head transpose goes on to one (Persimmon)."""
    if not any(_reads_as_qkv(g, u, node.value) for u in g.users(node.value)):
        return False  # the cheap test first: most values feed no attention
    users = live_users(g, node.value)
    if not users or g.is_output(node.value):
        return False
    return all(_reads_as_qkv(g, u, node.value) for u in users)


def _reads_as_qkv(g, u, v) -> bool:
    if isinstance(u.op, Attention):
        return v in u.inputs[:3]
    if isinstance(u.op, Rope):
        return u.inputs[0] == v
    if not isinstance(u.op, (LayerNorm, RmsNorm)) or u.inputs[0] != v:
        return False
    rank = u.outputs[0].rank
    if u.op.axis % rank != rank - 1:
        return False  # a norm across heads would mix the selected columns
    heads = live_users(g, u.value)
    return bool(heads) and all(
        isinstance(t.op, Transpose) and not g.is_output(t.value)
        and all(_reads_as_qkv(g, r, t.value) for r in live_users(g, t.value)) for t in heads)


def _columns(g, chain, src) -> tuple[np.ndarray, bool] | None:
    """Evaluate the chain on an index-coded [B, S, N] source: (cols [H, D], heads_first) when
    element [b, h, s, d] (or [b, s, h, d]) reads row (b, s), column cols[h, d]."""
    b_dim, s_dim, n = g.shape_of(src).dims
    if not isinstance(n, int):
        return None
    symbols: dict[str, int] = {}
    sizes = []
    for dim, probe in zip((b_dim, s_dim), PROBE):
        if isinstance(dim, int):
            sizes.append(dim)
            continue
        sym = SymDim.of(dim)
        names = sym.symbols
        if len(names) != 1 or SymDim.of(next(iter(names))) != sym:
            return None  # an expression, not a plain symbol
        symbols[next(iter(names))] = probe
        sizes.append(probe)
    bsz, ssz = sizes
    sub = Graph("qkv_columns", record_provenance=False)
    v = sub.input("p", Shape((b_dim, s_dim, n), i64))
    memo: dict = {}
    for node in reversed(chain):
        extra = [_clone(sub, g, i, memo) for i in node.inputs[1:]]
        v = sub.add_node(node.op, [v] + extra)[0]
    sub.set_outputs([v])
    code = np.arange(bsz * ssz * n, dtype=np.int64).reshape(bsz, ssz, n)
    try:
        (out,) = interpret(sub, {"p": code}, symbols=symbols)
    except BrazeError:
        return None
    out = np.asarray(out)
    dims = chain[0].outputs[0].dims
    if out.ndim != 4 or dims[0] != b_dim:
        return None
    if dims[2] == s_dim and dims[1] != s_dim:
        heads_first, bshd = True, out.transpose(0, 2, 1, 3)
    elif dims[1] == s_dim:
        heads_first, bshd = False, out
    else:
        return None
    rows, cols = bshd // n, bshd % n
    want_rows = (np.arange(bsz)[:, None] * ssz + np.arange(ssz)[None, :])[:, :, None, None]
    if not (rows == want_rows).all() or not (cols == cols[:1, :1]).all():
        return None
    return cols[0, 0], heads_first


def _matcher(g, node, ctx):
    if node.outputs[0].rank != 4:
        return
    chain = _chain(g, node)  # before the readers: most head layouts select nothing
    if not chain or not any(isinstance(c.op, _SELECT) for c in chain):
        return
    kinds = [type(c.op) for c in chain]
    if kinds in ([Transpose, Reshape, Narrow], [Reshape, Narrow]) and \
            chain[-1].op.axis in (-1, 2):
        return  # already the canonical narrow of the projection (before the readers' walk)
    if not _feeds_attention(g, node):
        return
    src = chain[-1].inputs[0]
    if g.shape_of(src).rank != 3 or _projection(g, src) is None:
        return
    found = _columns(g, chain, src)
    if found is None:
        return
    cols, heads_first = found
    x, w, bias = _projection(g, src)
    values = {"x": x, "w": w, "p": src}
    if bias is not None:
        values["b"] = bias
    flat = cols.reshape(-1)
    run = bool((np.diff(flat) == 1).all())
    yield Match(SELECT_QKV_COLUMNS, g, node, {"root": node}, values, (node.id,),
                data={"cols": cols, "heads_first": heads_first, "run": run})


def _select(b, m, name: str, cols: np.ndarray, axis: int):
    """The chosen columns of weight `name`: a new stored param, or a gather (weight prep)."""
    old = m.values[name]
    node = m.graph.nodes[old.node]
    if isinstance(node.op, Param) and node.op.name in m.graph.weights:
        tag = hashlib.sha1(cols.tobytes()).hexdigest()[:10]
        pname = f"{node.op.name}.cols_{tag}"
        try:
            return b.node_by_name(pname).value
        except Exception:  # noqa: BLE001 - not made yet
            value = np.take(m.graph.weights[node.op.name], cols, axis=axis)
            return b.param(pname, node.op.shape.with_dims(value.shape), value=value)
    return b.gather(m.v(name), b.constant(cols), axis)


def _build(b, m):
    d = m.data
    cols = d["cols"]
    h, hd = cols.shape
    flat = cols.reshape(-1)
    bd, sd, _ = m.shape("p").dims
    if d["run"]:
        y = b.narrow(m.v("p"), -1, int(flat[0]), flat.size)
    else:
        y = b.matmul(m.v("x"), _select(b, m, "w", flat, 1))
        if "b" in m.values:
            y = b.add(y, _select(b, m, "b", flat, 0))
    heads = b.reshape(y, (bd, sd, h, hd))
    return b.transpose(heads, (0, 2, 1, 3)) if d["heads_first"] else heads


def _may_make_heads(op) -> bool:
    """Root test: a layout op whose result can be 4-D (a select, or a reshape / transpose to
    4-D: their attributes fix the rank)."""
    if isinstance(op, Reshape):
        return len(op.dims) == 4
    if isinstance(op, Transpose):
        return len(op.perm) == 4
    return isinstance(op, _SELECT)


def _below_selects(g, changed) -> set[int]:
    """The retry hook: every node whose layout chain (`_chain`: the matcher reads nothing else
    first) holds a select, changed or not. The matcher finds nothing anywhere else, and there
    are few such nodes (a head split narrowed or gathered out of a fused projection, the
    selects themselves), so a follow-up sweep tries the rule there instead of at every
    layout node."""
    out: set[int] = set()
    stack = [n.id for n in g.nodes if isinstance(n.op, _SELECT)]
    nodes = g.nodes
    while stack:
        nid = stack.pop()
        if nid in out:
            continue
        out.add(nid)
        for c in g.reader_ids((nid,)):
            reader = nodes[c]
            if isinstance(reader.op, _LAYOUT) and reader.inputs[0].node == nid:
                stack.append(c)
    return out


SELECT_QKV_COLUMNS = Rule("SelectQKVColumns", _build, matcher=_matcher,
                          root_test=_may_make_heads, retry=_below_selects)
