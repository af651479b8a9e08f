"""LowerBatchNormInference: inference batch_norm becomes (x - mean) * (gamma / sqrt(var + eps))
+ beta with per-channel broadcasts and the interpreter's numbers (rank 2 to 5, symbolic dims);
graphs without batch_norm are left alone; a backend without it gets it through
rewrite_for_backend."""
from collections import Counter

import pytest
from lowering_helpers import op_counts

import braze as bz
from braze.passes.targets import all_op_names
from braze.testing import assert_equivalent


def _bn(dims, channels, eps=1e-5):
    g = bz.Graph("bn")
    x = g.input("x", bz.Shape(dims))
    stats = [g.param(n, bz.Shape((channels,))) for n in ("gamma", "beta", "mean", "var")]
    g.set_outputs([g.batch_norm(x, *stats, eps=eps)])
    return g


@pytest.mark.parametrize("dims", [(4, 3), (2, 3, 7), ("n", 5, 3, "w"), (1, 3, 2, 3, 2)],
                         ids=["rank2", "rank3", "symbolic", "rank5"])
def test_batch_norm_lowers_to_per_channel_arithmetic_with_equal_numbers(dims):
    g = _bn(dims, dims[1], eps=1e-3)
    res = bz.LowerBatchNormInference.run(g)
    assert res.changed
    kinds = op_counts(res.graph)
    assert "batch_norm" not in kinds
    assert (kinds["sub"], kinds["mul"], kinds["add"], kinds["rsqrt"]) == (1, 2, 2, 1)
    assert kinds["reshape"] == (0 if len(dims) == 2 else 3)
    assert_equivalent(g, res.graph, symbols={"n": 2, "w": 4})


def test_scale_is_computed_on_the_channel_vectors():
    res = bz.LowerBatchNormInference.run(_bn((2, 4, 3, 3), 4))
    (rsqrt,) = [n for n in res.graph.nodes if n.op.label == "rsqrt"]
    assert res.graph.shape_of(rsqrt.values[0]).dims == (4,)


def test_graph_without_batch_norm_is_unchanged():
    g = bz.Graph("ln")
    x = g.input("x", bz.Shape((2, 4)))
    g.set_outputs([g.layer_norm(x)])
    res = bz.LowerBatchNormInference.run(g)
    assert not res.changed and res.graph is g


def test_input_graph_is_not_mutated():
    g = _bn((2, 3, 4), 3)
    before = str(g)
    bz.LowerBatchNormInference(g)
    assert str(g) == before


def test_backend_without_batch_norm_gets_it_through_rewrite_for_backend():
    g = _bn(("n", 3, 4, 4), 3)
    target = bz.get_target("cpu").restrict(all_op_names() - {"batch_norm"}, name="no_bn")
    trace = Counter()
    low = bz.rewrite_for_backend(g, target, trace=trace)
    assert trace == Counter({"LowerBatchNormInference": 1})
    assert bz.legalize(low, target) is low
    assert_equivalent(g, low, symbols={"n": 3})
