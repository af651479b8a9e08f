"""AlgebraicSimplify's sweeps patch one working copy instead of rebuilding the graph per sweep
(braze/rewrite/in_place.py): the graph, the statistics and the misses must be exactly the rewrite
driver's, and a match whose replacement has no slot must fall back to the driver."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import braze as bz
from braze.ir.equality import graphs_equal
from braze.ir.ops.elementwise import UnaryFn
from braze.passes.canonicalize import simplify
from braze.passes.canonicalize.simplify import SIMPLIFY_RULES, AlgebraicSimplify
from braze.passes.cleanup import eliminate_dead_code
from braze.rewrite import RewriteContext, V, rewrite
from braze.rewrite.dispatch import KindsPresent
from braze.rewrite.in_place import rewrite_in_place
from braze.testing import assert_equivalent

X = V("x")


def _layout(g):
    """Node by node: op, inputs, types, name, provenance (ids and order included)."""
    return [(n.id, n.op, n.inputs, n.outputs, n.name, n.provenance) for n in g.nodes], \
        list(g.outputs), list(g.input_ids), list(g.param_ids)


def _misses(res):
    return [(m.pattern, m.node, m.node_id, m.reason, m.detail, m.context, m.hint)
            for m in res.misses]


def _stats(res):
    """Matches per rule. (Attempts and near-miss counts follow where each sweep looks, which the
    driver may narrow further per rule: retrying more nodes finds no other match or miss.)"""
    return {k: s.matches for k, s in res.stats.items()}


def _driver_simplify(g):
    """AlgebraicSimplify with the in-place sweeps off (the rewrite driver every round)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(simplify, "rewrite_in_place", lambda *a, **k: None)
    try:
        return AlgebraicSimplify().run(g)
    finally:
        mp.undo()


def _same_as_driver(g):
    before = _layout(g)
    fast, driver = AlgebraicSimplify().run(g), _driver_simplify(g)
    assert _layout(g) == before  # the input is not changed
    assert _layout(fast.graph) == _layout(driver.graph)
    assert graphs_equal(fast.graph, driver.graph)
    assert fast.changed == driver.changed
    assert _misses(fast) == _misses(driver)
    assert _stats(fast) == _stats(driver)
    # the op kinds the sweeps carried to the result are those of counting it afresh
    assert KindsPresent.of(fast.graph)._count == KindsPresent(fast.graph)._count
    return fast


# -- graphs made of what the rules match ------------------------------------------------------
def _step(g, x, kind):
    s = g.shape_of(x)
    dims = s.dims
    if kind == "flatten":
        return g.reshape(x, (-1,)) if s.rank > 1 else g.reshape(x, (1, dims[0]))
    if kind == "merge":
        return g.reshape(x, (-1, *dims[2:])) if s.rank > 2 else g.reshape(x, dims)
    if kind == "transpose":
        return g.transpose(x, tuple(reversed(range(s.rank))))
    if kind == "transpose_id":
        return g.transpose(x, tuple(range(s.rank)))
    if kind == "mul_one":
        return g.mul(x, g.constant(np.ones((), s.dtype.np)))
    if kind == "add_zero":
        return g.add(g.constant(np.zeros((), s.dtype.np)), x)
    if kind == "add_zero_wide":  # a zero that broadcasts: a SHAPE_MISMATCH miss
        return g.add(x, g.constant(np.zeros((2, *dims), s.dtype.np))) if s.is_static else x
    if kind == "nan_guard":
        p = g.softmax(x, -1) if s.dtype.is_float else x
        return g.where(g.isnan(p), g.constant(np.zeros((), s.dtype.np)), p)
    if kind == "nan_guard_plain":  # not a softmax output: a PATTERN_MISMATCH miss
        return g.where(g.isnan(x), g.constant(np.zeros((), s.dtype.np)), x)
    if kind == "neg_neg":
        return g.neg(g.neg(x)) if s.dtype.is_float else x
    if kind == "cast_f64":
        return g.cast(g.cast(x, bz.f64), s.dtype)
    if kind == "cast_f16":  # a rounding middle cast: a DTYPE_MISMATCH miss
        return g.cast(g.cast(x, bz.f16), s.dtype) if s.dtype.is_float else x
    if kind == "concat_one":
        return g.concat([x], 0)
    if kind == "int_sub_self":  # zeros of two nodes: no slot, the driver runs
        i = g.cast(x, bz.i32)
        return g.cast(g.sub(i, i), s.dtype)
    if kind == "max_self":
        return g.maximum(x, x)
    return g.exp(x)


KINDS = ["flatten", "merge", "transpose", "transpose_id", "mul_one", "add_zero", "add_zero_wide",
         "nan_guard", "nan_guard_plain", "neg_neg", "cast_f64", "cast_f16", "concat_one",
         "int_sub_self", "max_self", "exp"]


@st.composite
def simplify_graphs(draw):
    g = bz.Graph("simplify")
    dims = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    if draw(st.booleans()):
        dims = ("batch", *dims)
    pool = [g.input("x", bz.Shape(dims))]
    for _ in range(draw(st.integers(1, 9))):
        x = pool[draw(st.integers(0, len(pool) - 1))]
        pool.append(_step(g, x, draw(st.sampled_from(KINDS))))
    outs = [pool[-1]] + [pool[i] for i in draw(st.lists(st.integers(0, len(pool) - 1),
                                                         max_size=2, unique=True))]
    g.set_outputs(list(dict.fromkeys(outs)))
    return g


@settings(max_examples=150, deadline=None)
@given(g=simplify_graphs())
def test_in_place_sweeps_equal_the_driver_on_random_graphs(g):
    res = _same_as_driver(g)
    assert_equivalent(g, res.graph)


def test_a_reshape_chain_halves_per_sweep_as_in_the_driver():
    g = bz.Graph("chain")
    h = g.input("x", bz.Shape(("batch", 2, 3, 4)))
    for dims in [(-1, 12), (-1, 3, 4), (-1, 2, 12), (-1,), ("batch", 24), ("batch", 2, 12),
                 ("batch", 6, 4), ("batch", 2, 3, 4)]:
        h = g.reshape(h, dims)
    g.set_outputs([g.exp(h)])
    res = rewrite_in_place(g, SIMPLIFY_RULES, RewriteContext(), max_sweeps=32)
    assert res is not None and res.changed  # every match fitted in place
    driver = rewrite(g, SIMPLIFY_RULES, max_sweeps=32)
    assert {k: s.matches for k, s in res.stats.items()} == \
        {k: s.matches for k, s in driver.stats.items()}
    assert res.stats["ComposeReshapes"].matches > 7  # later sweeps matched what earlier made
    fast = _same_as_driver(g)
    assert fast.graph.op_counts() == {"exp": 1}  # the chain ends where it started
    assert_equivalent(g, fast.graph)


def test_zeros_of_two_nodes_fall_back_to_the_driver():
    g = bz.Graph("sub_self")
    i = g.input("i", bz.Shape((3, 4), bz.i32))
    g.set_outputs([g.exp(g.cast(g.sub(i, i), bz.f32))])
    assert rewrite_in_place(g, SIMPLIFY_RULES, RewriteContext(), max_sweeps=32) is None
    res = _same_as_driver(g)
    assert res.stats["SubSelf"].matches == 1 and res.graph.count("sub") == 0
    assert_equivalent(g, res.graph)


def test_misses_name_the_nodes_by_the_driver_ids():
    """Nameless nodes are named by id: after a removed root the driver's ids are one less."""
    g = bz.Graph("misses")
    x = g.input("x", bz.Shape((2, 3)))
    y = g.mul(g.neg(g.neg(x)), g.constant(np.float32(1)))  # neg(neg(..)) and *1 go
    guard = g.where(g.isnan(y), g.constant(np.float32(0)), y)  # not a softmax: kept
    wide = g.add(guard, g.constant(np.full((4, 2, 3), -0.0, np.float32)))  # broadcasts: kept
    g.set_outputs([wide])
    res = _same_as_driver(g)
    reasons = {m.pattern: m.reason.name for m in res.misses}
    assert reasons == {"SoftmaxNanGuard": "PATTERN_MISMATCH", "AddZero": "SHAPE_MISMATCH"}
    assert res.graph.count("neg") == 0 and res.graph.count("mul") == 0
    assert_equivalent(g, res.graph)


def test_a_result_with_nothing_dead_is_its_own_graph():
    """reshape(reshape(x)) with the inner reshape read elsewhere: the outer one is replaced in
    its slot and nothing dies, so the working copy is the result; it shares no index with the
    input graph."""
    g = bz.Graph("slot")
    x = g.input("x", bz.Shape((2, 3, 4)))
    inner = g.reshape(x, (6, 4))
    outer = g.reshape(inner, (24,))
    g.set_outputs([g.exp(inner), g.tanh(outer)])
    work = rewrite_in_place(g, SIMPLIFY_RULES, RewriteContext(), max_sweeps=32)
    assert work is not None and work.changed and not work.dead
    before = _layout(g)
    res = _same_as_driver(g)
    out = res.graph
    assert out is not g and out.nodes[outer.node].inputs == (x,)
    assert eliminate_dead_code(out)[0] is out  # nothing dead
    out.exp(x)  # growing the result leaves the input as it was
    assert _layout(g) == before and len(g.users(x)) == 1
    assert_equivalent(g, res.graph)


# -- replacements that fail: the misses are the driver's (its trial build explains them) ------
def _wrong_dtype(b, m):
    return b.cast(b.sigmoid(m.v("x")), bz.f64)  # changes the root's dtype


def _bad_build(b, m):
    return b.matmul(m.v("x"), m.v("x"))  # (2, 3) @ (2, 3) does not build


def _reads_itself(b, m):
    return m.new(m.root.values[0])


# root-only rules, as AlgebraicSimplify's table makes them
def _u(fn, x):
    return simplify._unary(UnaryFn[fn], x)


FAILING = (
    simplify._rule("AbsAbs", _u("ABS", _u("ABS", X)), lambda b, m: b.abs(m.v("x"))),  # a slot
    simplify._rule("NegNeg", _u("NEG", _u("NEG", X)), lambda b, m: m.v("x")),  # a tombstone
    simplify._rule("WrongDtype", _u("EXP", X), _wrong_dtype),
    simplify._rule("BadBuild", _u("TANH", X), _bad_build),
    simplify._rule("ReadsItself", _u("SIGMOID", X), _reads_itself),
)


def test_failing_replacements_give_the_drivers_misses():
    g = bz.Graph("failing")
    h = g.input("x", bz.Shape((2, 3)))
    for _ in range(3):
        h = g.tanh(g.exp(g.abs(g.abs(g.neg(g.neg(g.sigmoid(h)))))))
    g.set_outputs([h])
    fast = rewrite_in_place(g, FAILING, RewriteContext(), max_sweeps=32)
    driver = rewrite(g, FAILING, max_sweeps=32)
    assert fast is not None
    assert _misses(fast) == _misses(driver)  # ids of the driver's graph, after the removals
    assert {m.pattern: m.reason.name for m in fast.misses} == {
        "WrongDtype": "INVALID_REPLACEMENT", "BadBuild": "INVALID_REPLACEMENT",
        "ReadsItself": "CAPTURE_INSIDE_MATCH"}
    assert {k: s.matches for k, s in fast.stats.items()} == \
        {k: s.matches for k, s in driver.stats.items()}
    assert fast.stats["AbsAbs"].matches == 3 and fast.stats["NegNeg"].matches == 3
    out, _ = eliminate_dead_code(fast.graph)
    assert _layout(out) == _layout(eliminate_dead_code(driver.graph)[0])
    assert_equivalent(g, out)
