"""FuseRmsNormReshape: per-head QK-norm (reshape to heads, RMSNorm over the head dim) fuses;
a norm over more than the last axis, a reshape read elsewhere, or an unclaimed kind do not."""
import pytest

import braze as bz
from braze.passes.base import RulePass, run_passes
from braze.passes.fusion.rms_norm_reshape import RULES
from braze.passes.targets import TARGETS
from braze.passes.unfuse import unfuse_fused_for_autodiff
from braze.rewrite import MissReason, RewriteContext
from braze.testing import assert_equivalent

CPU = RewriteContext(target=TARGETS["cpu"])


def fuse(g, ctx=CPU):
    return RulePass("FuseRmsNormReshape", RULES).run(g, ctx)


def qk_norm_graph(gamma=True, beta=False, batch=2, axis=-1, extra_reader=None):
    """q = x @ w; per-head rms_norm(reshape(q, [B, S, H, D])); heads moved to axis 1."""
    g = bz.Graph("qk_norm")
    x = g.input("x", bz.Shape((batch, 5, 32)))
    q = g.mm(x, g.param("wq", bz.Shape((32, 32))))
    heads = g.reshape(q, (batch, 5, 4, -1))
    dims = (8,) if axis == -1 else (4, 8)
    gm = g.param("q_gamma", bz.Shape(dims)) if gamma else None
    bt = g.param("q_beta", bz.Shape(dims)) if beta else None
    out = [g.transpose(g.rms_norm(heads, gm, bt, axis=axis), (0, 2, 1, 3))]
    if extra_reader == "mul":
        out.append(g.mul(heads, heads))
    elif extra_reader == "output":
        out.append(heads)
    g.set_outputs(out)
    return g


@pytest.mark.parametrize("batch", [2, "batch"])
@pytest.mark.parametrize("gamma,beta", [(True, False), (True, True), (False, False)])
def test_per_head_qk_norm_fires(gamma, beta, batch):
    g = qk_norm_graph(gamma, beta, batch)
    res = fuse(g)
    assert res.graph.op_counts() == {"matmul": 1, "fused_rms_norm_reshape": 1, "transpose": 1}
    (node,) = [n for n in res.graph.nodes if n.op.kind == "fused_rms_norm_reshape"]
    assert node.op.dims == (batch, 5, 4, 8)
    assert (node.op.has_gamma, node.op.has_beta) == (gamma, beta)
    assert res.stats["FuseRmsNormReshape"].matches == 1 and not res.misses
    assert_equivalent(g, res.graph)


def test_norm_over_several_axes_is_an_axis_mismatch():
    g = qk_norm_graph(axis=-2)
    res = fuse(g)
    assert not res.changed
    (miss,) = res.misses
    assert miss.reason is MissReason.AXIS_MISMATCH and "axis 2" in miss.detail


@pytest.mark.parametrize("reader,reason", [("mul", MissReason.MULTI_CONSUMER),
                                           ("output", MissReason.GRAPH_OUTPUT)])
def test_reshape_read_elsewhere_is_not_fused_away(reader, reason):
    g = qk_norm_graph(extra_reader=reader)
    res = fuse(g)
    assert not res.changed
    assert [m.reason for m in res.misses] == [reason]


def test_target_without_the_claim_does_not_fuse():
    res = fuse(qk_norm_graph(), RewriteContext(target=TARGETS["onnxruntime"]))
    assert not res.changed
    assert [m.reason for m in res.misses] == [MissReason.UNSUPPORTED_BY_TARGET]


def test_fuse_unfuse_round_trip():
    g = qk_norm_graph(gamma=True, beta=True, batch="batch")
    fused, _ = run_passes(g, [RulePass("FuseRmsNormReshape", RULES)], CPU,
                          verify=True, check_numerics=True)
    assert fused.count("fused_rms_norm_reshape") == 1
    plain = unfuse_fused_for_autodiff(fused)
    assert plain.count("fused_rms_norm_reshape") == 0 and plain.count("reshape") >= 1
    assert_equivalent(g, plain)
