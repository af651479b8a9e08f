"""FuseResidualLN / FuseResidualRmsNorm: post-norm and pre-norm residual norms fuse (the sum is
exposed when read again or returned), the norm axis is kept, and broadcast residuals or
unclaimed kinds are refused with a reason."""
import pytest

import braze as bz
from braze.ir.op import Value
from braze.passes.base import RulePass, run_passes
from braze.passes.fusion.residual_norm import RULES
from braze.passes.targets import TARGETS
from braze.passes.unfuse import unfuse_fused_for_autodiff
from braze.rewrite import MissReason, RewriteContext
from braze.testing import assert_equivalent

CPU = RewriteContext(target=TARGETS["cpu"])
FUSED = ("fused_residual_ln", "fused_residual_rms_norm")


def fuse(g, ctx=CPU):
    return RulePass("FuseResidualNorm", RULES).run(g, ctx)


def fused_nodes(g):
    return [n for n in g.nodes if n.op.kind in FUSED]


def affine(g, dims, gamma, beta, tag=""):
    return (g.param(f"gamma{tag}", bz.Shape(dims)) if gamma else None,
            g.param(f"beta{tag}", bz.Shape(dims)) if beta else None)


def post_norm_graph(gamma=True, beta=True, residual_first=False, batch="batch"):
    """BERT-style: LN(x + attn_out) with attn_out = x @ w."""
    g = bz.Graph("post_norm")
    x = g.input("x", bz.Shape((batch, 5, 16)))
    attn_out = g.mm(x, g.param("w", bz.Shape((16, 16))))
    s = g.add(attn_out, x) if residual_first else g.add(x, attn_out)
    g.set_outputs([g.layer_norm(s, *affine(g, (16,), gamma, beta), eps=1e-12)])
    return g


@pytest.mark.parametrize("residual_first", [False, True])
@pytest.mark.parametrize("gamma,beta", [(True, True), (True, False), (False, True),
                                        (False, False)])
def test_post_norm_layer_norm_fires(gamma, beta, residual_first):
    g = post_norm_graph(gamma, beta, residual_first)
    res = fuse(g)
    assert res.graph.op_counts() == {"matmul": 1, "fused_residual_ln": 1}
    (node,) = fused_nodes(res.graph)
    op = node.op
    assert (op.has_gamma, op.has_beta, op.expose_sum, op.eps) == (gamma, beta, False, 1e-12)
    assert len(node.inputs) == 2 + gamma + beta
    assert res.stats["FuseResidualLN"].matches == 1 and not res.misses
    assert_equivalent(g, res.graph)


def test_input_graph_is_not_mutated():
    g = post_norm_graph()
    before = str(g)
    fuse(g)
    assert str(g) == before


def pre_norm_chain(third_residual: bool):
    """LLaMA-style: x1 = x + a; n1 = rms(x1); x2 = x1 + f(n1); n2 = rms(x2) [; x3 = x2 + f(n2)]."""
    g = bz.Graph("pre_norm")
    x = g.input("x", bz.Shape((2, 5, 16)))
    a = g.input("a", bz.Shape((2, 5, 16)))
    w1 = g.param("w1", bz.Shape((16, 16)))
    w2 = g.param("w2", bz.Shape((16, 16)))
    x1 = g.add(x, a)
    n1 = g.rms_norm(x1, g.param("g1", bz.Shape((16,))))
    x2 = g.add(x1, g.silu(g.mm(n1, w1)))
    n2 = g.rms_norm(x2, g.param("g2", bz.Shape((16,))))
    g.set_outputs([g.add(x2, g.mm(n2, w2))] if third_residual else [n2])
    return g


@pytest.mark.parametrize("third_residual", [False, True])
def test_pre_norm_chain_fuses_both_and_exposes_read_sums(third_residual):
    g = pre_norm_chain(third_residual)
    res = fuse(g)
    assert res.graph.count("fused_residual_rms_norm") == 2
    # the only add left is the final residual add, which no norm reads
    assert res.graph.count("add") == (1 if third_residual else 0)
    assert res.graph.count("rms_norm") == 0
    first, second = fused_nodes(res.graph)
    assert first.op.expose_sum and len(first.outputs) == 2
    assert second.op.expose_sum is third_residual
    assert first.values[1] in second.inputs  # the next residual add reads the exposed sum
    assert res.stats["FuseResidualRmsNorm"].matches == 2
    assert_equivalent(g, res.graph)


def test_layer_norm_axis_is_kept():
    g = bz.Graph("ln_axis")
    x = g.input("x", bz.Shape((2, 3, 4, 8)))
    r = g.input("r", bz.Shape((2, 3, 4, 8)))
    gamma, beta = affine(g, (4, 8), True, True)
    ln = g.layer_norm(g.add(x, r), gamma, beta, axis=-2)
    g.set_outputs([ln])
    res = fuse(g)
    (node,) = fused_nodes(res.graph)
    assert node.op.axis == g.nodes[ln.node].op.axis == 2
    assert_equivalent(g, res.graph)


def test_broadcast_residual_is_a_shape_mismatch():
    g = bz.Graph("bcast")
    x = g.input("x", bz.Shape((2, 5, 16)))
    s = g.add(x, g.param("r", bz.Shape((16,))))
    g.set_outputs([g.layer_norm(s)])
    res = fuse(g)
    assert not res.changed
    (miss,) = res.misses
    assert (miss.pattern, miss.reason) == ("FuseResidualLN", MissReason.SHAPE_MISMATCH)
    assert "(16,)" in miss.detail and miss.hint


@pytest.mark.parametrize("rms", [False, True])
def test_sum_returned_as_graph_output_is_the_second_output(rms):
    g = bz.Graph("sum_out")
    x = g.input("x", bz.Shape((2, 5, 16)))
    r = g.input("r", bz.Shape((2, 5, 16)))
    s = g.add(x, r)
    y = g.rms_norm(s) if rms else g.layer_norm(s, *affine(g, (16,), True, True))
    g.set_outputs([y, s])
    res = fuse(g)
    (node,) = fused_nodes(res.graph)
    assert res.graph.op_counts() == {node.op.kind: 1}
    assert node.op.expose_sum
    assert res.graph.outputs == [Value(node.id, 0), Value(node.id, 1)]
    assert_equivalent(g, res.graph)


def test_target_without_the_claim_does_not_fuse():
    g = pre_norm_chain(False)
    g2 = post_norm_graph()
    for graph, pattern in ((g, "FuseResidualRmsNorm"), (g2, "FuseResidualLN")):
        res = fuse(graph, RewriteContext(target=TARGETS["reference"]))
        assert not res.changed
        assert {(m.pattern, m.reason) for m in res.misses} == {
            (pattern, MissReason.UNSUPPORTED_BY_TARGET)}


def test_each_kind_follows_its_own_claim():
    only_ln = TARGETS["cpu"].with_options(claims=frozenset({"fused_residual_ln"}))
    g = bz.Graph("both")
    x = g.input("x", bz.Shape((2, 16)))
    r = g.input("r", bz.Shape((2, 16)))
    g.set_outputs([g.layer_norm(g.add(x, r)), g.rms_norm(g.add(r, x))])
    res = fuse(g, RewriteContext(target=only_ln))
    assert res.graph.op_counts() == {"fused_residual_ln": 1, "add": 1, "rms_norm": 1}
    assert {(m.pattern, m.reason, m.detail) for m in res.misses} == {
        ("FuseResidualRmsNorm", MissReason.UNSUPPORTED_BY_TARGET,
         "target 'cpu' does not claim fused_residual_rms_norm")}
    assert_equivalent(g, res.graph)


@pytest.mark.parametrize("make", [post_norm_graph, lambda: pre_norm_chain(True)])
def test_fuse_unfuse_round_trip(make):
    g = make()
    fused, _ = run_passes(g, [RulePass("FuseResidualNorm", RULES)], CPU,
                          verify=True, check_numerics=True)
    assert fused_nodes(fused)
    plain = unfuse_fused_for_autodiff(fused)
    assert not fused_nodes(plain)
    assert plain.count("add") == g.count("add")
    assert_equivalent(g, plain)
