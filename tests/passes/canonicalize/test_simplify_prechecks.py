"""AlgebraicSimplify's operand precheck (`_operand_shape_test`) is a necessary condition of each
rule's pattern: on roots of every shape the rules look for (the identity and its near misses,
operands in both orders), a root the pattern matches always passes it, and it does reject the
roots it exists for (so the rules skip them without running the pattern)."""
import numpy as np

import braze as bz
from braze.passes.canonicalize.simplify import ALGEBRAIC_RULES, _operand_shape_test


def _roots():
    g = bz.Graph("roots")
    x = g.input("x", bz.Shape((3, 4), bz.i32))
    y = g.input("y", bz.Shape((3, 4), bz.i32))
    f = g.input("f", bz.Shape((3, 4)))
    b = g.input("b", bz.Shape((3, 4), bz.bool_))
    c = g.input("c", bz.Shape((3, 4), bz.bool_))
    p = g.softmax(f)
    zero = g.constant(np.zeros((), np.float32))

    def not_(v):
        return g.unary(v, bz.UnaryFn.NOT)
    outs = [
        g.sub(x, x), g.sub(x, y), g.maximum(x, x), g.maximum(x, y), g.minimum(y, y),
        g.logical_and(b, b), g.logical_and(b, c), g.logical_or(c, c), g.logical_or(b, c),
        g.mul(x, g.constant(np.ones((), np.int32))), g.mul(g.constant(np.ones((), np.int32)), x),
        g.neg(g.neg(f)), g.neg(f), g.neg(g.exp(f)), not_(not_(b)), not_(b),
        g.where(b, x, x), g.where(b, x, y), g.where(g.isnan(p), zero, p),
        g.where(g.isnan(f), zero, p), g.where(b, zero, p), g.where(g.isinf(p), zero, p),
        g.cast(g.cast(f, bz.f64), bz.f32), g.cast(f, bz.f64), g.cast(g.exp(f), bz.f64),
    ]
    g.set_outputs(outs)
    return g


def test_every_match_passes_the_precheck_and_the_precheck_rejects_near_misses():
    g = _roots()
    matched = rejected = checked_rules = 0
    for rule in ALGEBRAIC_RULES:
        test = _operand_shape_test(rule.pattern)
        if test is None:
            continue
        checked_rules += 1
        for node in g.nodes:
            if not rule.root_test(node.op):
                continue
            hits = list(rule.pattern.match_node(g, node, {}, ()))
            passes = test(g.nodes, node)
            assert passes or not hits, f"{rule.name} precheck rejects a match at {node.label}"
            matched += bool(hits)
            rejected += not passes
    assert checked_rules >= 8  # x-x, max, min, and, or, --x, !!x, where(c,x,x), guard, casts
    assert matched >= 10 and rejected >= 8


def test_rules_without_a_repeated_or_nested_operand_have_no_precheck():
    by_name = {r.name: r for r in ALGEBRAIC_RULES}
    for name in ("MulOne", "AddZero", "FullSlice", "ConcatEmpty", "WhereTrue"):
        assert _operand_shape_test(by_name[name].pattern) is None, name
    for name in ("SubSelf", "WhereSame", "NegNeg", "CastCast", "SoftmaxNanGuard"):
        assert _operand_shape_test(by_name[name].pattern) is not None, name
