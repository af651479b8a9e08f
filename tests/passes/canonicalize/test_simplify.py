"""AlgebraicSimplify and bz.simplify: every identity fires (op counts, numerics on fresh random
inputs, fuse -> unfuse round trip), per-rule statistics name the rule's file and line, rules that
would change a value's shape or dtype (or its NaNs) are reported misses, interiors read elsewhere
stay, and bz.simplify reaches a fixed point with CSE and DCE in a bounded number of rounds."""
import linecache
import os

import ml_dtypes
import numpy as np
import pytest
from helpers import check_same
from hypothesis import given, settings
from hypothesis import strategies as st

import braze as bz
from braze.errors import PassError
from braze.passes.base import run_passes
from braze.passes.canonicalize import canonicalize_passes
from braze.passes.canonicalize.simplify import (
    SIMPLIFY_RULES,
    AlgebraicSimplify,
    exact_cast,
    simplify_with_stats,
)
from braze.rewrite import MissReason, RewriteContext
from braze.testing import random_graphs

CPU = RewriteContext(bz.get_target("cpu"))


def run(g):
    """AlgebraicSimplify as the pipeline runs it (no CSE); returns the PassResult."""
    _, (res,) = run_passes(g, [AlgebraicSimplify()], CPU, verify=True)
    return res


def graph(shape=("b", 4, 6), dtype=bz.f32):
    g = bz.Graph("s")
    return g, g.input("x", bz.Shape(shape, dtype))


# -- every identity fires -------------------------------------------------------------------------
def _mul_one(g, x):
    return g.mul(g.constant(np.ones((6,), np.float32)), x)           # 1*x, a broadcast vector


def _where_true(g, x):
    return g.where(g.constant(np.ones((4, 1), bool)), x, g.exp(x))


def _where_false(g, x):
    return g.where(g.constant(False), g.exp(x), x)


def _nan_guard(g, x):
    p = g.softmax(x)
    return g.where(g.isnan(p), 0.0, p)


def _nan_guard_cast(g, x):
    p = g.cast(g.softmax(g.cast(x, bz.f32)), bz.f16)
    return g.where(g.isnan(p), g.constant(0.0, bz.f16), p)


FIRES = {   # rule -> (builder of the expression on x, x's dtype)
    "MulOne": (_mul_one, bz.f32),
    "AddZero": (lambda g, x: g.add(-0.0, x), bz.f32),
    "SubZero": (lambda g, x: g.sub(x, 0.0), bz.f32),
    "DivOne": (lambda g, x: g.div(x, 1.0), bz.f32),
    "PowOne": (lambda g, x: g.pow(x, 1.0), bz.f32),
    "MaxSelf": (lambda g, x: g.maximum(x, x), bz.f32),
    "MinSelf": (lambda g, x: g.minimum(x, x), bz.f32),
    "AndSelf": (lambda g, x: g.logical_and(x, x), bz.bool_),
    "OrSelf": (lambda g, x: g.logical_or(x, x), bz.bool_),
    "NegNeg": (lambda g, x: g.neg(g.neg(x)), bz.f32),
    "NotNot": (lambda g, x: g.activation(g.activation(x, "not"), "not"), bz.bool_),
    "WhereSame": (lambda g, x: g.where(g.gt(x, 0.0), x, x), bz.f32),
    "WhereTrue": (_where_true, bz.f32),
    "WhereFalse": (_where_false, bz.f32),
    "SoftmaxNanGuard": (_nan_guard, bz.f32),                         # -> softmax(x)
    "FullNarrow": (lambda g, x: g.narrow(x, -1, 0, 6), bz.f32),
    "FullSlice": (lambda g, x: g.slice(x, 1, 0, 2**31), bz.f32),
    "ConcatOne": (lambda g, x: g.concat([x], 1), bz.f32),
    "ComposeTransposes": (lambda g, x: g.transpose(g.transpose(x, (1, 0, 2)), (1, 0, 2)), bz.f32),
    "ComposeReshapes": (lambda g, x: g.reshape(g.reshape(x, ("b", 24)), ("b", 4, 6)), bz.f32),
    "DropIdentityLayout": (lambda g, x: g.expand(x, ("b", 4, 6)), bz.f32),
}


@pytest.mark.parametrize("rule", sorted(FIRES))
def test_identity_fires_and_keeps_the_value(rule):
    build, dtype = FIRES[rule]
    g, x = graph(dtype=dtype)
    g.set_outputs([build(g, x)])
    res = run(g)
    out = res.graph
    assert res.stats[rule].matches >= 1, res.stats[rule]
    if rule == "SoftmaxNanGuard":
        assert out.op_counts() == {"softmax": 1}
    else:
        assert out.outputs == [out.input_value("x")], out   # the expression is x itself
    assert not res.misses
    check_same(g, out, symbols={"b": 3})


@pytest.mark.parametrize("build", [_nan_guard, _nan_guard_cast])
def test_the_sdpa_guard_goes_through_casts_and_keeps_a_fully_masked_row_zero(build):
    g, x = graph(dtype=bz.f16 if build is _nan_guard_cast else bz.f32)
    g.set_outputs([build(g, x)])
    out = run(g).graph
    assert out.count("isnan") == 0 and out.count("where") == 0 and out.count("softmax") == 1
    dt = np.float16 if build is _nan_guard_cast else np.float32
    feed = np.full((2, 4, 6), -np.inf, dt)                  # every score masked
    feed[0, 1, 2] = 1.0
    (want,), (got,) = bz.interpret(g, {"x": feed}), bz.interpret(out, {"x": feed})
    np.testing.assert_array_equal(got, want)
    assert not np.isnan(got).any() and got[1].sum() == 0
    check_same(g, out, symbols={"b": 2}, rtol=1e-3, atol=1e-3)


def test_transpose_chain_becomes_one_transpose_and_reshape_chain_one_reshape():
    g, x = graph()
    t = g.transpose(g.transpose(g.transpose(x, (1, 0, 2)), (0, 2, 1)), (2, 1, 0))
    r = g.reshape(g.reshape(g.reshape(x, ("b", 24)), ("b", 2, 12)), ("b", 12, 2))
    g.set_outputs([t, r])
    out = run(g).graph
    assert out.op_counts() == {"transpose": 1, "reshape": 1}
    (tn,) = [n for n in out.nodes if n.op.kind == "transpose"]
    assert tn.op.perm == (0, 2, 1)                     # [b, 4, 6] -> [b, 6, 4]
    check_same(g, out, symbols={"b": 2})


@pytest.mark.parametrize("mid,folds", [(bz.f64, True), (bz.f16, False), (bz.bf16, False)])
def test_cast_through_an_exact_type_folds_and_a_rounding_one_is_a_reported_miss(mid, folds):
    g, x = graph()
    g.set_outputs([g.cast(g.cast(x, mid), bz.f32), g.cast(g.cast(x, mid), bz.i32)])
    res = run(g)
    out = res.graph
    if folds:
        assert out.count("cast") == 1 and out.outputs[0] == out.input_value("x")
        (c,) = [n for n in out.nodes if n.op.kind == "cast"]
        assert c.op.dtype == bz.i32 and c.inputs[0] == out.input_value("x")
        assert not res.misses
    else:
        assert out.count("cast") == 4
        reasons = {(m.pattern, m.reason) for m in res.misses}
        assert reasons == {("CastCast", MissReason.DTYPE_MISMATCH)}
        assert f"f32 -> {mid} rounds" in res.misses[0].detail
    check_same(g, out, symbols={"b": 2})


def test_exact_casts():
    assert exact_cast(bz.f16, bz.f32) and exact_cast(bz.bf16, bz.f64) and exact_cast(bz.i8, bz.f16)
    assert exact_cast(bz.u8, bz.bf16) and exact_cast(bz.i32, bz.f64)
    assert exact_cast(bz.bool_, bz.f16)
    assert not exact_cast(bz.f32, bz.f16) and not exact_cast(bz.f16, bz.bf16)
    assert not exact_cast(bz.i32, bz.f32) and not exact_cast(bz.i64, bz.f64)
    assert not exact_cast(bz.i16, bz.f16) and not exact_cast(bz.f32, bz.i64)
    for src in (bz.i8, bz.u8, bz.i16, bz.f16, bz.bf16):       # the table against NumPy
        for dst in (bz.f16, bz.bf16, bz.f32, bz.i16, bz.i32):
            if exact_cast(src, dst):
                info = ml_dtypes.finfo(src.np) if src.is_float else np.iinfo(src.np)
                vals = np.array([info.min, info.max, 1, 0], src.np)
                assert (vals.astype(dst.np).astype(src.np) == vals).all(), (src, dst)


def test_integer_x_minus_x_is_zeros_with_the_broadcast_shape():
    g = bz.Graph("z")
    x = g.input("x", bz.Shape(("b", 1, 6), bz.i32))
    y = g.input("y", bz.Shape((4, 1), bz.i32))
    d = g.sub(x, x)
    g.set_outputs([d, g.add(d, y)])                      # x - x, then broadcast against y
    res = run(g)
    assert res.stats["SubSelf"].matches == 1 and res.graph.count("sub") == 0
    assert res.graph.shape_of(res.graph.outputs[0]).dims == ("b", 1, 6)
    check_same(g, res.graph, symbols={"b": 3})


# -- must not fire (the reason is in the report) --------------------------------------------------
def _misses(g):
    _, report = bz.fuse(g, "cpu")
    return {(m.pattern, m.reason): m for m in report.misses}


@pytest.mark.filterwarnings("ignore:invalid value")
def test_float_x_minus_x_stays_because_of_inf_and_nan():
    g, x = graph()
    g.set_outputs([g.sub(x, x)])
    misses = _misses(g)
    m = misses[("SubSelf", MissReason.DTYPE_MISMATCH)]
    assert "inf or NaN" in m.detail
    out = run(g).graph
    assert out.count("sub") == 1
    feed = {"x": np.full((1, 4, 6), np.inf, np.float32)}
    assert np.isnan(bz.interpret(out, feed)[0]).all()


def test_identities_that_would_change_the_broadcast_shape_do_not_fire():
    g = bz.Graph("bc")
    x = g.input("x", bz.Shape((6,)))
    c = g.input("c", bz.Shape((4, 1), bz.bool_))
    g.set_outputs([
        g.mul(x, g.constant(np.ones((4, 6), np.float32))),   # x*1 broadcasts x to [4, 6]
        g.add(x, g.constant(np.full((2, 1), -0.0, np.float32))),  # x+0 broadcasts x to [2, 6]
        g.where(c, x, x),                                   # c broadcasts x to [4, 6]
    ])
    misses = _misses(g)
    for rule in ("MulOne", "AddZero", "WhereSame"):
        m = misses[(rule, MissReason.SHAPE_MISMATCH)]
        assert f"{rule} would turn" in m.detail and "f32[6]" in m.detail
    out = run(g).graph
    assert out.op_counts() == {"mul": 1, "add": 1, "where": 1}
    check_same(g, out)


@pytest.mark.filterwarnings("ignore:invalid value")
def test_a_nan_guard_on_a_value_that_can_be_nan_stays():
    g, x = graph()
    p = g.log(x)                                       # NaN for negative x
    g.set_outputs([g.where(g.isnan(p), 0.0, p)])
    m = _misses(g)[("SoftmaxNanGuard", MissReason.PATTERN_MISMATCH)]
    assert "not a softmax" in m.detail
    out = run(g).graph
    assert out.count("isnan") == 1
    check_same(g, out, symbols={"b": 2})


def test_near_identities_are_left_alone_without_noise():
    g, x = graph()
    ys = [g.mul(x, 2.0), g.add(x, 1e-30), g.mul(x, g.constant(np.array([1.0, 1.0, 1.0, 1.0,
                                                                          1.0, 0.5], np.float32))),
          g.narrow(x, -1, 1, 5), g.slice(x, 1, 0, 4, 2), g.slice(x, 1, -1, -5, -1),
          g.where(g.gt(x, 0.0), x, g.neg(x)), g.sub(x, g.exp(x)), g.neg(x)]
    g.set_outputs(ys)
    res = run(g)
    assert not res.changed and not res.misses
    assert sum(s.matches for s in res.stats.values()) == 0


def test_an_interior_read_elsewhere_stays_for_its_reader():
    g, x = graph()
    inner = g.neg(x)
    outer = g.neg(inner)
    g.set_outputs([g.exp(outer), inner])               # inner is an output too
    out = run(g).graph
    assert out.count("neg") == 1
    (e,) = [n for n in out.nodes if n.op.label == "exp"]
    assert e.inputs[0] == out.input_value("x")
    check_same(g, out, symbols={"b": 2})


# -- statistics, pipeline, bz.simplify -------------------------------------------------------------
def test_every_rule_records_its_own_file_and_line():
    names = [r.name for r in SIMPLIFY_RULES]
    assert len(set(names)) == len(names)
    here = os.path.dirname(bz.__file__)
    for r in SIMPLIFY_RULES:
        fname, line = r.source.split(":")
        path = os.path.join(here, "passes", "canonicalize", fname)
        text = linecache.getline(path, int(line))
        assert r.name in text or f"Rule(\"{r.name}\"" in text or r.name.upper() in text, \
            (r.name, r.source, text)
    g, x = graph()
    g.set_outputs([g.mul(g.add(x, -0.0), 1.0)])
    _, stats = simplify_with_stats(g)
    assert stats["MulOne"].matches == 1 and stats["MulOne"].source.startswith("simplify.py:")
    assert stats["AddZero"].matches == 1 and stats["DivOne"].matches == 0


def test_fuse_runs_simplify_first_so_the_linear_layer_fuses():
    g, x = graph()
    w, b = g.param("w", bz.Shape((6, 5))), g.param("bias", bz.Shape((5,)))
    h = g.div(g.mul(x, 1.0), 1.0)                       # an exporter's no-op scaling
    y = g.neg(g.neg(g.gelu(g.add(g.mm(g.cast(g.cast(h, bz.f64), bz.f32), w), b))))
    g.set_outputs([y])
    names = [p.name for p in canonicalize_passes()]
    assert names[0] == "AlgebraicSimplify" and "AlgebraicSimplifyAgain" in names
    fused, report = bz.fuse(g, "cpu")
    assert fused.op_counts() == {"fused_matmul_bias_act": 1}
    assert report.rule_stats["MulOne"].matches == 1 and report.rule_stats["DivOne"].matches == 1
    assert report.rule_stats["MulOne"].source.startswith("simplify.py:")
    check_same(g, fused, symbols={"b": 2})


def test_fuse_cleanup_simplifies_even_without_canonicalization():
    g, x = graph()
    g.set_outputs([g.tanh(g.neg(g.neg(g.mul(x, 1.0))))])
    names = [p.name for p in bz.fusion_passes("cpu")]
    assert names[-3:] == ["CleanupSimplify", "CommonSubexpressionElimination",
                          "DeadCodeElimination"]
    fused, report = bz.fuse(g, "cpu", canonicalize=False, regions=False)
    assert fused.op_counts() == {"tanh": 1}
    assert report.rule_stats["NegNeg"].matches == 1
    check_same(g, fused, symbols={"b": 2})


def test_simplify_reaches_a_fixed_point_with_cse_and_dce():
    g = bz.Graph("fix")
    x = g.input("x", bz.Shape(("b", 6), bz.i64))
    a = g.add(g.mul(x, 3), 1)
    a2 = g.add(g.mul(x, 3), 1)                          # the same value, computed twice
    z = g.sub(a, a2)                                    # zero once CSE merges a and a2
    g.set_outputs([g.add(g.neg(g.neg(x)), z)])
    text = str(g)
    out = bz.simplify(g)
    assert str(g) == text                               # the input is not changed
    assert out.op_counts() == {"expand": 1, "add": 1}   # x + zeros
    check_same(g, out, symbols={"b": 2})
    again = bz.simplify(out)
    assert str(again) == str(out)                       # a fixed point


def test_simplify_rounds_do_not_grow_with_the_graph():
    """Each round is one linear sweep; a long chain settles in the same few rounds."""
    for n in (10, 600):
        g, x = graph()
        y = x
        for i in range(n):
            y = g.neg(g.neg(g.mul(g.add(y, -0.0), 1.0)))
            y = g.transpose(g.transpose(y, (1, 0, 2)), (1, 0, 2))
            y = g.relu(y) if i % 50 == 0 else y
        g.set_outputs([y])
        res = AlgebraicSimplify(cse=True, max_rounds=2).run(g, CPU)
        assert res.graph.op_counts() == {"relu": (n + 49) // 50}
    check_same(g, res.graph, symbols={"b": 2})


def test_equal_after_simplifying_needs_a_second_round_and_the_bound_is_a_pass_error():
    g = bz.Graph("rounds")
    x = g.input("x", bz.Shape(("b", 6), bz.i32))
    a, b = g.add(g.mul(x, 1), 3), g.add(x, 3)         # equal once x*1 is x and CSE merges
    g.set_outputs([g.sub(a, b)])
    with pytest.raises(PassError, match="no fixed point in 1 rounds"):
        AlgebraicSimplify(cse=True, max_rounds=1).run(g, CPU)
    out = bz.simplify(g)
    assert out.op_counts() == {"expand": 1}
    check_same(g, out, symbols={"b": 2})


def test_a_long_transpose_chain_settles():
    """The chain halves per sweep; 600 transposes need 10 sweeps, beyond the driver's default."""
    g, x = graph()
    y = x
    for i in range(600):
        y = g.transpose(y, (1, 0, 2) if i % 3 else (0, 2, 1))
    g.set_outputs([y])
    out = bz.simplify(g)
    assert out.count("transpose") <= 1
    check_same(g, out, symbols={"b": 2})


# -- real exports -------------------------------------------------------------------------------
@pytest.mark.parametrize("family,variant", [("gpt2", "sdpa"), ("llama", "sdpa"),
                                            ("bert", "dynamo"), ("llama", "eager")])
def test_real_exports_lose_the_guards_and_no_ops_and_keep_their_outputs(hf_zoo, family, variant):
    from braze.models.hf import hf_inputs

    g = hf_zoo.graph(family, variant)
    out, stats = simplify_with_stats(g)
    assert out.count("isnan") == 0 and len(out.nodes) < len(g.nodes)
    if variant != "eager":
        assert stats["SoftmaxNanGuard"].matches == 2           # one per layer
    assert stats["ComposeReshapes"].matches > 0
    assert str(bz.simplify(out)) == str(out)
    vocab = hf_zoo.module(family).vocab_size
    for padding in ("left", "none"):
        feeds = hf_inputs(2, 7, vocab=vocab, seed=5, padding=padding)
        (want,), (got,) = bz.interpret(g, feeds), bz.interpret(out, feeds)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- constant folding in the fixed point --------------------------------------------------------
def test_simplify_folds_what_the_rules_expose_and_simplifies_what_folds_expose():
    """where(True, c, x) -> c makes exp(c) known (a fold after a rule); 1 computed as
    exp(0) makes x * 1 an identity (a rule after a fold); equal values merge (CSE)."""
    g, x = graph((4, 6))
    c = g.constant(np.full((4, 6), 2.0, np.float32))
    picked = g.where(g.constant(True), c, g.exp(x))           # a run-time op until WhereTrue
    one = g.exp(g.constant(np.zeros((6,), np.float32)))
    y = g.add(g.mul(x, one), g.exp(picked))
    g.set_outputs([y, g.sub(y, g.exp(picked))])
    before = str(g)
    out, stats = simplify_with_stats(g)
    assert str(g) == before
    assert out.op_counts() == {"add": 1, "sub": 1}
    assert out.count("constant") == 1                         # exp(c) once, CSE'd
    assert stats["WhereTrue"].matches == 1 and stats["MulOne"].matches == 1
    assert stats["ConstantFolding"].matches >= 2
    check_same(g, out)
    assert str(bz.simplify(out)) == str(out)                  # a fixed point


def test_simplify_folds_stored_weights_but_fuse_folds_constants_only():
    g, x = graph((2, 6))
    w = g.param("w", bz.Shape((4, 6)), np.arange(24, dtype=np.float32).reshape(4, 6))
    half = g.div(g.constant(np.float32(1)), g.constant(np.float32(2)))
    g.set_outputs([g.mul(g.mm(x, g.transpose(w, (1, 0))), half)])
    out = bz.simplify(g)
    assert out.op_counts() == {"matmul": 1, "mul": 1}
    assert [p.op.name for p in out.params] == ["transpose(w)"]
    check_same(g, out)
    fused, report = bz.fuse(g, "cpu")
    assert "div" not in fused.op_counts()                     # the constant folded
    assert report.weight_prep_after == 2   # transpose(w) * 0.5 (FoldMatMulScale): weight prep
    assert [p.op.name for p in fused.params] == ["w"]


def test_simplify_leaves_over_cap_folds_computed_and_counts_them():
    g, x = graph((64, 64))
    grid = g.add(g.constant(np.ones((64, 1), np.float32)), g.constant(np.ones((1, 64), np.float32)))
    g.set_outputs([g.mul(x, g.tanh(grid))])
    out, stats = simplify_with_stats(g, max_elements=100)
    assert out.op_counts() == {"add": 1, "tanh": 1, "mul": 1}
    assert stats["ConstantFolding"].near_misses == 1
    res = AlgebraicSimplify(cse=True).run(g, CPU)            # bz.fuse's default cap folds it
    assert res.graph.op_counts() == {"mul": 1}
    check_same(g, out)


def test_simplify_never_folds_input_dependent_nodes():
    g, x = graph()
    w = g.param("w", bz.Shape((6, 6)))                         # no stored value: run time
    y = g.add(g.mm(x, g.neg(w)), g.exp(x))
    g.set_outputs([y])
    out = bz.simplify(g)
    assert out.op_counts() == g.op_counts() and out.count("constant") == 0
    check_same(g, out, symbols={"b": 2})


@pytest.mark.parametrize("keep", [1, 2])
def test_concat_drops_operands_empty_along_its_axis(keep):
    """A rope over the whole head writes concat([rotated, x[..., n:]]) with an empty pass-through
    part (Phi-3 through TorchScript / torch.export): the empty operand goes; all-empty stays."""
    g, x = graph()
    empty = g.slice(x, 2, 6, 6)
    parts = [g.mul(x, 2.0), empty] + [g.add(x, 1.0)] * (keep - 1)
    g.set_outputs([g.concat(parts, 2), g.concat([empty, empty], 2)])
    res = run(g)
    assert res.stats["ConcatEmpty"].matches == 1
    concats = [n for n in res.graph.nodes if n.op.kind == "concat"]
    assert [len(n.inputs) for n in concats] == ([2] if keep == 1 else [2, 2])
    check_same(g, res.graph, symbols={"b": 2})


# -- skipping constant folding where it has nothing to try ------------------------------------
def _fold_tries(g, fold_weights):
    from braze.passes.const_fold import fold_constants

    return fold_constants(g, fold_weights=fold_weights)[1].attempts


@st.composite
def _sources_and_ops(draw):
    """Inputs, constants, params with and without stored values, and unary / binary ops on
    any of them (some read known values alone, some not)."""
    g = bz.Graph("fold")
    shape = bz.Shape((2, 3))
    pool = [g.input("x", shape)]
    for i in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["input", "constant", "param", "stored", "unary", "binary"]))
        pick = st.integers(0, len(pool) - 1)
        if kind == "input":
            pool.append(g.input(f"x{i}", shape))
        elif kind == "constant":
            pool.append(g.constant(np.full((2, 3), i, np.float32)))
        elif kind in ("param", "stored"):
            value = np.ones((2, 3), np.float32) if kind == "stored" else None
            pool.append(g.param(f"w{i}", shape, value=value))
        elif kind == "unary":
            pool.append(g.exp(pool[draw(pick)]))
        else:
            pool.append(g.add(pool[draw(pick)], pool[draw(pick)]))
    g.set_outputs([pool[-1]])
    return g


@settings(max_examples=150, deadline=None)
@given(g=st.one_of(_sources_and_ops(), random_graphs(max_nodes=8)), fold_weights=st.booleans())
def test_fold_is_skipped_only_where_it_tries_nothing(g, fold_weights):
    from braze.passes.const_fold import may_fold

    assert may_fold(g, fold_weights) == (_fold_tries(g, fold_weights) > 0)


def test_fold_precheck_finds_known_readers_and_leaves_the_rest():
    from braze.passes.const_fold import may_fold

    g, x = graph()
    w = g.param("w", bz.Shape((6,)), value=np.ones(6, np.float32))
    g.set_outputs([g.add(x, g.neg(w))])                          # neg(w): known with weights
    assert may_fold(g, True) and _fold_tries(g, True) == 1
    assert not may_fold(g, False) and _fold_tries(g, False) == 0
    c = g.constant(np.ones(6, np.float32))
    g.set_outputs([g.add(x, g.exp(c))])                          # exp(constant): known
    assert may_fold(g, False) and _fold_tries(g, False) == 1
    res = AlgebraicSimplify().run(g, CPU)
    assert res.stats["ConstantFolding"].matches == 1 and res.graph.count("exp") == 0
    quiet = AlgebraicSimplify().run(run(g).graph, CPU)            # nothing left to fold: skipped
    assert quiet.stats["ConstantFolding"].attempts == 0
    assert quiet.stats["ConstantFolding"].source == res.stats["ConstantFolding"].source


def _negative_zeros():
    return {"x": np.asarray([[-0.0, 0.0, -1.5, 2.0, np.inf, -np.inf, np.nan]] * 2, np.float32)}


@pytest.mark.parametrize("build", [lambda g, x: g.add(x, 0.0), lambda g, x: g.add(0.0, x),
                                   lambda g, x: g.sub(x, -0.0)],
                         ids=["x+0", "0+x", "x-(-0)"])
def test_float_zero_that_would_turn_negative_zero_positive_is_kept(build):
    """-0.0 + 0.0 is +0.0 (IEEE): x + 0.0 and x - (-0.0) are not x for a float x that may be
    -0.0, so they stay (LLVM folds them only under fast-math)."""
    g = bz.Graph("signed_zero")
    x = g.input("x", bz.Shape((2, 7)))
    g.set_outputs([build(g, x)])
    out = run(g).graph
    assert out.op_counts() == g.op_counts()
    feeds = _negative_zeros()
    (got,), (want,) = bz.interpret(out, feeds), bz.interpret(g, feeds)
    assert np.signbit(want[0, 0]) == np.signbit(got[0, 0]) == False  # noqa: E712


@pytest.mark.parametrize("build", [lambda g, x: g.add(x, -0.0), lambda g, x: g.sub(x, 0.0)],
                         ids=["x+(-0)", "x-0"])
def test_signed_zero_identities_fold_and_keep_negative_zero(build):
    g = bz.Graph("signed_zero")
    x = g.input("x", bz.Shape((2, 7)))
    g.set_outputs([build(g, x)])
    out = run(g).graph
    assert out.outputs == [out.input_value("x")]
    feeds = _negative_zeros()
    np.testing.assert_array_equal(np.signbit(bz.interpret(g, feeds)[0]),
                                  np.signbit(feeds["x"]))


@pytest.mark.parametrize("rule,build", [
    ("AddPosZero", lambda g, x: g.add(g.cast(x, bz.f32), 0.0)),    # a cast int is never -0.0
    ("AddPosZero", lambda g, x: g.add(0.0, g.exp(g.cast(x, bz.f32)))),
    ("SubNegZero", lambda g, x: g.sub(g.sigmoid(g.cast(x, bz.f32)), -0.0)),
    ("AddZero", lambda g, x: g.cast(g.add(x, 0), bz.f32)),           # integers: always exact
    ("SubZero", lambda g, x: g.cast(g.sub(x, 0), bz.f32)),
])
def test_zero_folds_where_x_cannot_be_negative_zero(rule, build):
    g = bz.Graph("never_negative_zero")
    x = g.input("x", bz.Shape((2, 7), bz.i32))
    g.set_outputs([build(g, x)])
    res = run(g)
    assert res.stats[rule].matches == 1
    assert "add" not in res.graph.op_counts() and "sub" not in res.graph.op_counts()
    check_same(g, res.graph)
