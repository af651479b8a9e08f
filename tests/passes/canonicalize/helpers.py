"""Shared helpers for the canonicalization tests (imported as `from helpers import ...`)."""
import braze as bz
from braze.passes.base import RulePass, run_passes
from braze.passes.canonicalize import canonicalize_passes
from braze.passes.cleanup import DCE_PASS
from braze.rewrite import RewriteContext
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
