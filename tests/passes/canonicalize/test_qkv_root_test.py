"""SelectQKVColumns' root test (a select, or a reshape / transpose to 4-D) and its retry hook
(the nodes whose layout chain holds a select) skip only layout nodes where its matcher finds
nothing: on fused-QKV layouts (per-head narrows, [B, S, H, 3, D] gathers, multi-query heads,
GPT-2's canonical [q | k | v] narrows) every root the matcher yields at passes both, and the
pass selects the columns as whole sweeps do."""
import dataclasses

import numpy as np
import pytest

import braze as bz
from braze.ir.equality import graph_diff
from braze.ir.ops.indexing import Slice
from braze.ir.ops.shape import Gather, Narrow, Reshape, Transpose
from braze.passes.base import RulePass
from braze.passes.canonicalize import canonicalize_passes
from braze.passes.canonicalize.fused_qkv import SELECT_QKV_COLUMNS
from braze.rewrite import RewriteContext
from braze.testing import assert_equivalent

H, D = 2, 4
E = H * D
LAYOUT = (Reshape, Transpose, Narrow, Slice, Gather)


def _qkv_heads(g, x, layout):
    """q, k, v as [B, H, S, D] selected out of one projection in `layout`."""
    rng = np.random.default_rng(0)
    width = {"mqa": (H + 2) * D}.get(layout, 3 * E)
    w = g.param("w", bz.Shape((E, width)), value=rng.standard_normal((E, width)).astype("f4"))
    p = g.add(g.matmul(x, w), g.param("b", bz.Shape((width,))))
    if layout == "neox":  # [B, S, H, 3D], each head's block narrowed after the transpose
        heads = g.transpose(g.reshape(p, ("b", "s", H, 3 * D)), (0, 2, 1, 3))
        return [g.narrow(heads, -1, j * D, D) for j in range(3)]
    if layout == "bloom":  # [B, S, H, 3, D], index j gathered
        t = g.reshape(p, ("b", "s", H, 3, D))
        return [g.transpose(g.gather(t, g.constant(np.array(j)), 3), (0, 2, 1, 3))
                for j in range(3)]
    if layout == "mqa":  # [B, S, H + 2, D]: H query heads, one k head, one v head
        t = g.reshape(p, ("b", "s", H + 2, D))
        q = g.transpose(g.narrow(t, 2, 0, H), (0, 2, 1, 3))
        kv = [g.transpose(g.narrow(t, 2, H + j, 1), (0, 2, 1, 3)) for j in range(2)]
        return [q] + [g.expand(t, ("b", H, "s", D)) for t in kv]
    # gpt2: [q | k | v] narrowed, then each split into heads (already canonical)
    return [g.transpose(g.reshape(g.narrow(p, -1, j * E, E), ("b", "s", H, D)), (0, 2, 1, 3))
            for j in range(3)]


def _graph(layout):
    g = bz.Graph(layout)
    x = g.input("x", bz.Shape(("b", "s", E)))
    o = g.attention(*_qkv_heads(g, x, layout))
    g.set_outputs([g.reshape(g.transpose(o, (0, 2, 1, 3)), ("b", "s", E))])
    return g


def _before_the_layout_pass(g):
    ctx = RewriteContext()
    for p in canonicalize_passes():
        if p.name == "CanonicalizeAttentionLayout":
            return p, g, ctx
        g = p.run(g, ctx).graph
    raise AssertionError("no CanonicalizeAttentionLayout pass")


@pytest.mark.parametrize("layout", ["neox", "bloom", "mqa", "gpt2"])
def test_every_root_the_matcher_yields_at_passes_the_root_test(layout):
    g0 = _graph(layout)
    layout_pass, g, ctx = _before_the_layout_pass(g0)
    roots = [n for n in g.nodes if isinstance(n.op, LAYOUT)
             and list(SELECT_QKV_COLUMNS.matcher(g, n, ctx))]
    assert all(SELECT_QKV_COLUMNS.root_test(n.op) for n in roots)
    hooked = set(SELECT_QKV_COLUMNS.retry(g, set()))
    assert {n.id for n in roots} <= hooked
    assert len(hooked) < sum(isinstance(n.op, LAYOUT) for n in g.nodes)
    assert bool(roots) == (layout != "gpt2")  # the canonical narrows select nothing new
    rejected = [n for n in g.nodes if isinstance(n.op, LAYOUT)
                and not SELECT_QKV_COLUMNS.root_test(n.op)]
    assert rejected  # the test skips something on every layout (3-D reshapes at least)
    res = layout_pass.run(g, ctx)
    if roots:
        assert res.stats["SelectQKVColumns"].matches > 0
    assert_equivalent(g0, res.graph, params=bz.init_params(g0, 0),
                      symbols={"b": 2, "s": 3}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layout", ["neox", "bloom", "mqa", "gpt2"])
def test_the_layout_pass_with_the_hook_matches_whole_sweeps(layout):
    layout_pass, g, ctx = _before_the_layout_pass(_graph(layout))
    whole = dataclasses.replace(SELECT_QKV_COLUMNS, retry=None)
    rules = tuple(whole if r is SELECT_QKV_COLUMNS else r for r in layout_pass.rules)
    near, every = layout_pass.run(g, ctx), RulePass(layout_pass.name, rules).run(g, ctx)
    assert graph_diff(near.graph, every.graph) is None
    assert {k: s.matches for k, s in near.stats.items()} == \
        {k: s.matches for k, s in every.stats.items()}
