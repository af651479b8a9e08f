"""Shared helpers for the canonicalization tests (imported as `from helpers import ...`)."""
import dataclasses

import braze as bz
from braze.ir.equality import graph_diff
from braze.passes.base import RulePass, run_passes
from braze.passes.canonicalize import canonicalize_passes
from braze.passes.cleanup import DCE_PASS
from braze.rewrite import RewriteContext, rewrite
from braze.testing import assert_equivalent


def canonicalize(g):
    """Run the canonicalization stage only; returns (graph, misses)."""
    out, results = run_passes(g, canonicalize_passes(), RewriteContext(bz.get_target("cpu")),
                              verify=True)
    return out, [m for r in results for m in r.misses]


def run_rules(g, *rules):
    """Apply `rules` to a fixpoint, then drop the dead interiors; returns (graph, misses)."""
    passes = [RulePass("t", rules), DCE_PASS]
    out, results = run_passes(g, passes, RewriteContext(bz.get_target("cpu")), verify=True)
    return out, results[0].misses


def check_same(g, out, **kw):
    assert_equivalent(g, out, rtol=kw.pop("rtol", 1e-5), atol=kw.pop("atol", 1e-5), **kw)
    assert_equivalent(g, bz.unfuse_fused_for_autodiff(out), rtol=1e-5, atol=1e-5, **kw)


def whole_sweeps(rule):
    """`rule` tried at every node in every sweep (no depth, reach or retry hook)."""
    copy = dataclasses.replace(rule, retry=None, reads_users=0)
    copy.depth = None
    return copy


def check_same_as_whole_sweeps(g, rules, max_sweeps=16):
    """Rewriting with `rules` retried near the changes gives the graph and match counts of
    whole sweeps, and the numbers of g."""
    near = rewrite(g, rules, max_sweeps=max_sweeps)
    whole = rewrite(g, tuple(whole_sweeps(r) for r in rules), max_sweeps=max_sweeps)
    assert graph_diff(near.graph, whole.graph) is None
    assert {k: s.matches for k, s in near.stats.items()} == \
        {k: s.matches for k, s in whole.stats.items()}
    assert_equivalent(g, near.graph, params=bz.init_params(g, 0), rtol=1e-4, atol=1e-5)
