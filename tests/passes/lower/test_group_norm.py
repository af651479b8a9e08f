"""LowerGroupNorm: group_norm becomes a reshape into groups, last-axis mean / variance,
normalize, reshape back and the per-channel affine, with the interpreter's numbers (with and
without gamma / beta, one group or one per channel, symbolic dims); every reduction is over the
trailing axis; a backend without group_norm that reduces only the last axis gets it through
rewrite_for_backend."""
from collections import Counter

import pytest
from lowering_helpers import op_counts

import braze as bz
from braze.passes.constraints import reduces_last_axis_only
from braze.passes.targets import all_op_names
from braze.testing import assert_equivalent


def _gn(dims, groups, gamma=True, beta=True, eps=1e-5):
    g = bz.Graph("gn")
    x = g.input("x", bz.Shape(dims))
    c = dims[1]
    ga = g.param("gamma", bz.Shape((c,))) if gamma else None
    be = g.param("beta", bz.Shape((c,))) if beta else None
    g.set_outputs([g.group_norm(x, groups, ga, be, eps=eps)])
    return g


CASES = {
    "two_groups": ((2, 6, 5, 3), 2, True, True),
    "one_group": ((3, 4, 7), 1, True, False),
    "group_per_channel": ((2, 5, 3, 3), 5, False, True),
    "no_affine_rank2": ((4, 6), 3, False, False),
    "symbolic": (("n", 6, "h", 5), 3, True, True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_group_norm_lowers_with_equal_numbers(case):
    dims, groups, gamma, beta = CASES[case]
    g = _gn(dims, groups, gamma, beta, eps=1e-3)
    res = bz.LowerGroupNorm.run(g)
    assert res.changed
    kinds = op_counts(res.graph)
    assert "group_norm" not in kinds and kinds["reduce_mean"] == 2
    assert (kinds["mul"], kinds["add"]) == (2 + gamma, 1 + beta)
    for n in res.graph.nodes:
        assert reduces_last_axis_only(n, res.graph), n.op.label
    assert_equivalent(g, res.graph, symbols={"n": 2, "h": 3})


def test_groups_are_one_trailing_axis():
    res = bz.LowerGroupNorm.run(_gn(("n", 6, 4, 5), 3))
    first = next(n for n in res.graph.nodes if n.op.kind == "reshape")
    assert res.graph.shape_of(first.values[0]).dims == ("n", 3, 40)


def test_graph_without_group_norm_is_unchanged():
    g = bz.Graph("bn")
    x = g.input("x", bz.Shape((2, 3)))
    g.set_outputs([g.rms_norm(x)])
    res = bz.LowerGroupNorm.run(g)
    assert not res.changed and res.graph is g


def test_input_graph_is_not_mutated():
    g = _gn((2, 6, 3), 2)
    before = str(g)
    bz.LowerGroupNorm(g)
    assert str(g) == before


def test_backend_without_group_norm_reducing_last_axis_only_gets_a_legal_graph():
    g = _gn(("n", 8, 3, 3), 4)
    target = bz.get_target("cpu").restrict(all_op_names() - {"group_norm"}, name="no_gn")
    target = target.with_options(constraints=frozenset({"reduce_last_axis_only"}))
    trace = Counter()
    low = bz.rewrite_for_backend(g, target, trace=trace)
    assert trace == Counter({"LowerGroupNorm": 1})  # no decomposition, no further lowering
    assert bz.legalize(low, target) is low
    assert_equivalent(g, low, symbols={"n": 2})
