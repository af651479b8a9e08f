"""LowerDotGeneral: every batch / contracting layout becomes transpose + reshape + one matmul
with the interpreter's numbers, symbolic dims included; graphs without dot_general are left
alone; a backend without dot_general gets it through rewrite_for_backend."""
from collections import Counter

import pytest
from lowering_helpers import op_counts

import braze as bz
from braze.passes.targets import all_op_names
from braze.testing import assert_equivalent


def _dot(sa, sb, lc, rc, lb=(), rb=()):
    g = bz.Graph("dot")
    a, b = g.input("a", bz.Shape(sa)), g.input("b", bz.Shape(sb))
    g.set_outputs([g.dot_general(a, b, lc, rc, lb, rb)])
    return g


CASES = {
    "batched_matmul": ((2, 8, 5), (2, 5, 3), (2,), (1,), (0,), (0,)),
    "two_contracting_no_batch": ((4, 3, 5, 6), (6, 3, 7), (1, 3), (1, 0)),
    "matrix_vector": ((3, 4), (4,), (1,), (0,)),
    "batch_not_leading": ((2, 3, 4, 5), (5, 2, 4, 6), (3, 2), (0, 2), (0,), (1,)),
    "full_contraction": ((2, 3), (2, 3), (0, 1), (0, 1)),
    "batch_dims_swapped": ((2, 3, 4), (3, 2, 7, 4), (2,), (3,), (0, 1), (1, 0)),
    "outer_product": ((3,), (4, 2), (), ()),
    "symbolic": (("b", 5, 7), (7, "b", "n"), (2,), (0,), (0,), (1,)),
    "symbolic_free_dims": (("b", "s", 6), (6, 5), (2,), (0,)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_layout_lowers_to_one_matmul_with_equal_numbers(case):
    g = _dot(*CASES[case])
    res = bz.LowerDotGeneral.run(g)
    assert res.changed
    kinds = op_counts(res.graph)
    assert kinds["matmul"] == 1 and "dot_general" not in kinds
    assert set(kinds) <= {"matmul", "transpose", "reshape"}
    assert_equivalent(g, res.graph, symbols={"b": 3, "n": 4, "s": 5})


def test_plain_linear_layout_needs_no_transpose_or_reshape():
    # x[b, s, d] contracting d with w[d, n]: exactly x @ w
    res = bz.LowerDotGeneral.run(_dot((2, 3, 6), (6, 5), (2,), (0,)))
    assert op_counts(res.graph) == Counter({"matmul": 1})


def test_graph_without_dot_general_is_unchanged():
    g = bz.Graph("mm")
    x = g.input("x", bz.Shape((2, 3)))
    g.set_outputs([g.mm(x, g.param("w", bz.Shape((3, 4))))])
    res = bz.LowerDotGeneral.run(g)
    assert not res.changed and res.graph is g


def test_input_graph_is_not_mutated():
    g = _dot(*CASES["two_contracting_no_batch"])
    before = str(g)
    bz.LowerDotGeneral(g)
    assert str(g) == before and op_counts(g) == Counter({"dot_general": 1})


def test_backend_without_dot_general_gets_it_through_rewrite_for_backend():
    g = _dot(*CASES["batch_not_leading"])
    target = bz.get_target("cpu").restrict(all_op_names() - {"dot_general"}, name="no_dot")
    with pytest.raises(bz.LegalizeError):
        bz.legalize(g, target)
    trace = Counter()
    low = bz.rewrite_for_backend(g, target, trace=trace)
    assert trace == Counter({"LowerDotGeneral": 1})
    assert bz.legalize(low, target) is low
    assert_equivalent(g, low)
