"""The pattern matcher's answers, in backtracking order: commutative operands both ways,
alternatives in order, a Var named twice binding one value, `where` tests, output indices,
ops named by label, kind or class, and the nodes each match consumes."""
import braze as bz
from braze.ir.ops.elementwise import Binary, Unary
from braze.ir.ops.io import Input
from braze.rewrite import P, V
from braze.rewrite.pattern import Pat


def _graph():
    g = bz.Graph("p")
    x = g.input("x", bz.Shape((2, 3)))
    y = g.input("y", bz.Shape((2, 3)))
    s = g.add(g.exp(x), y)
    g.set_outputs([g.mul(s, s), g.mul(s, x)])
    return g, x, y, s


def _all(pat, g, v):
    return [({k: getattr(w, "id", w) for k, w in b.items()}, c)
            for b, c in pat.match_value(g, v, {}, ())]


def test_commutative_operands_match_both_ways_in_order():
    g, x, y, s = _graph()
    got = _all(P.add(V("a"), V("b")), g, s)
    e = g.nodes[s.node].inputs[0]
    assert got == [({"a": e, "b": y}, (s.node,)), ({"a": y, "b": e}, (s.node,))]


def test_nested_patterns_consume_their_nodes_and_capture_names():
    g, x, y, s = _graph()
    got = _all(P.add(P.exp(V("x"), name="e"), V("r"), name="sum"), g, s)
    e = g.nodes[s.node].inputs[0]
    assert got == [({"sum": s.node, "e": e.node, "x": x, "r": y}, (s.node, e.node))]


def test_a_var_named_twice_binds_one_value():
    g, x, y, s = _graph()
    square, scaled = (g.nodes[v.node].value for v in g.outputs)
    twice = P.mul(V("t"), V("t"))
    assert _all(twice, g, square) == [({"t": s}, (square.node,))] * 2  # both operand orders
    assert _all(twice, g, scaled) == []


def test_where_tests_and_alternatives_in_order():
    g, x, y, s = _graph()
    is_input = V("i", where=lambda gg, v: isinstance(gg.nodes[v.node].op, Input))
    alt = P.add(P.exp(V("x")), is_input) | P.add(V("u"), V("w"))
    got = _all(alt, g, s)
    assert [sorted(b) for b, _ in got] == [["i", "x"], ["u", "w"], ["u", "w"]]
    assert _all(P.add(is_input, is_input), g, s) == []


def test_ops_by_label_kind_or_class_and_output_index():
    g, x, y, s = _graph()
    for op in ("add", "binary", Binary, ("exp", Binary), (Unary, "add")):
        assert _all(Pat(op, None), g, s) == [({}, (s.node,))]
    assert _all(Pat(("exp", Unary), None), g, s) == []
    assert _all(Pat("add", None).output(1), g, s) == []
    assert _all(Pat("add", None).output(None), g, s) == [({}, (s.node,))]
