"""Causal masks become the CAUSAL (or SLIDING_WINDOW) mask kind, and a mask that hides no key
(a decode step of one token; an exported all-zeros mask, which algebraic simplification keeps
because x + 0.0 is not x at x = -0.0) becomes NONE.

Exporters build a causal mask in many ways: a constant triangular table, Trilu of ones,
Range + compare, vmap-style index arithmetic, combined with and-masks and turned additive with
where(m, 0, -inf). When an attention's additive mask depends on no graph input and no learned
param - only on constants and the symbolic dims - it is a function of the dims alone, and braze
decides what it is by evaluating that subgraph with the reference interpreter for several
sequence lengths and comparing with braze's causal pattern (0 where a key is visible, -inf or
the dtype's minimum where it is not, the same for every batch and head). The pattern aligns
the last query with the last key, so a KV-cache decode step's mask, built from
`past_len + seq` (query i sees keys <= past_len + i), is causal too: each symbol is bound on
its own per probe, so the query and key lengths differ as they do at run time. A sliding
window at least as wide as every probed key length would look causal, so the probed lengths
start past the mask's largest integer constant (where a window's width lives; up to
LONGEST_PROBE, above it the mask is left as it is). A mask that also
reads data (a padding mask from attention_mask) stays a CUSTOM mask: correct, and still
fused."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...errors import BrazeError
from ...interpret import interpret
from ...ir.graph import Graph
from ...ir.op import Value
from ...ir.ops.attention import Attention, MaskKind, visible_keys
from ...ir.ops.generate import Range
from ...ir.ops.io import Constant, Input, Param
from ...ir.symbolic import dim_symbols, eval_dim
from ...rewrite import Match, Rule
from .attention import MASK_FLOOR

__all__ = ["RECOGNIZE_CAUSAL_MASK", "classify_mask"]

PROBE_LENGTHS = (3, 6, 11)
# with several symbols (a decode step's past and seq), probe i binds the j-th symbol (sorted
# by name) to PROBE_LENGTHS[(i + j) % 3]: every symbol takes every length, in differing pairs
LONGEST_PROBE = 256  # the largest constant probed past (masks of about [267, 534] at most)


def _ancestors(g, v: Value) -> list[int] | None:
    """Node ids computing v (topological), or None if it reads an input or a param."""
    seen, stack = set(), [v.node]
    while stack:
        nid = stack.pop()
        if nid in seen:
            continue
        seen.add(nid)
        op = g.nodes[nid].op
        if isinstance(op, (Input, Param)):
            return None
        stack.extend(u.node for u in g.nodes[nid].inputs)
    return sorted(seen)


def _subgraph(g, ids: list[int], v: Value) -> Graph:
    sub = Graph("mask", record_provenance=False)
    vmap = {}
    for nid in ids:
        n = g.nodes[nid]
        outs = sub.clone_node(n, [vmap[u] for u in n.inputs], g)
        vmap.update(zip(n.values, outs))
    sub.set_outputs([vmap[v]])
    return sub


def classify_mask(g, mask: Value, q_len, k_len) -> tuple[MaskKind, int] | None:
    """(CAUSAL, 0), (SLIDING_WINDOW, w) or (NONE, 0) when the additive mask is provably that
    pattern (last query aligned with the last key) for every probed binding of the sequence
    lengths; None otherwise. `q_len` / `k_len` are the scores' dims (ints or symbolic)."""
    ids = _ancestors(g, mask)
    if ids is None:
        return None
    sub = _subgraph(g, ids, mask)
    names = set()
    for n in sub.nodes:
        for s in n.outputs:
            names |= s.symbol_names
    lengths = dim_symbols(q_len) | dim_symbols(k_len)
    order = sorted(names | lengths)
    # sequence lengths past every integer constant of the mask: a window (one of them) is
    # narrower than every probed key length, so no probe mistakes it for causal
    shift = _largest_int_constant(sub) if lengths else 0
    if shift >= LONGEST_PROBE:
        return None  # a window that wide could hide from every probe we can afford
    probes = [{s: PROBE_LENGTHS[(i + j) % len(PROBE_LENGTHS)] + shift * (s in lengths)
               for j, s in enumerate(order)} for i in range(len(PROBE_LENGTHS))]
    found = None
    for env in probes:
        sq, sk = eval_dim(q_len, env), eval_dim(k_len, env)
        if sk < sq:
            return None
        try:
            (m,) = interpret(sub, {}, symbols=env)
        except BrazeError:
            return None
        kind = _pattern(np.asarray(m, np.float64), sq, sk)
        if kind is None or (found is not None and kind != found):
            return None
        found = kind
        if not order:
            break  # static lengths: one evaluation is the whole truth
    return found


def _largest_int_constant(sub: Graph) -> int:
    """The largest magnitude among the integer constants and range bounds of the mask's
    subgraph (0 when none): a window's width is one of them."""
    big = 0
    for n in sub.nodes:
        if isinstance(n.op, Constant) and n.op.value.dtype.kind in "iu" and n.op.value.size:
            big = max(big, int(np.abs(n.op.value).max()))
        elif isinstance(n.op, Range):
            big = max(big, int(abs(n.op.start)), int(abs(n.op.delta)))
    return big


def _pattern(m: np.ndarray, sq: int, sk: int) -> tuple[MaskKind, int] | None:
    if m.ndim < 2 or m.shape[-2:] != (sq, sk):
        return None
    flat = m.reshape(-1, sq, sk)
    if not (flat == flat[:1]).all():
        return None  # differs between batches or heads
    grid = flat[0]
    visible = grid == 0
    masked = grid <= MASK_FLOOR
    if not (visible | masked).all():
        return None
    if visible.all():  # softmax(s + 0) is softmax(s): exp gives one for either zero's sign
        return (MaskKind.NONE, 0)
    window = int(visible.sum(axis=1)[-1])
    if window == 0:
        return None
    kind = MaskKind.CAUSAL if window == sk else MaskKind.SLIDING_WINDOW
    want = visible_keys(kind, sq, sk, window if kind is MaskKind.SLIDING_WINDOW else 0)
    if not np.array_equal(visible, want):
        return None
    return (kind, window if kind is MaskKind.SLIDING_WINDOW else 0)


def _matcher(g, node, ctx):
    op = node.op
    if op.mask is not MaskKind.CUSTOM:
        return
    q, k = (g.shape_of(v) for v in node.inputs[:2])
    found = classify_mask(g, node.inputs[3], q.dims[2], k.dims[2])
    if found is None:
        return
    kind, window = found
    yield Match(RECOGNIZE_CAUSAL_MASK, g, node, {"root": node},
                {"q": node.inputs[0], "k": node.inputs[1], "v": node.inputs[2]}, (node.id,),
                data={"kind": kind, "window": window})


def _build(b, m):
    op = replace(m.root.op, mask=m.data["kind"], window=m.data["window"])
    return b.add_node(op, [m.v("q"), m.v("k"), m.v("v")])[0]


RECOGNIZE_CAUSAL_MASK = Rule("RecognizeCausalMask", _build, matcher=_matcher,
                             root_test=lambda op: isinstance(op, Attention))
