"""The driver's safety rule: a match whose interior value is read outside it (or returned) is
refused with a reason naming that value and its first outside reader."""
import braze as bz
from braze.rewrite import MissReason, P, Rule, V, rewrite

# exp(neg(x)) -> exp(x * -1) drops neg(x), which others may read
EXP_NEG = Rule("ExpNeg", lambda b, m: b.exp(b.mul(m.v("x"), -1.0)),
               pattern=P.exp(P.neg(V("x"), name="n")))


def _graph(n_readers: int, returned: bool):
    g = bz.Graph("safety")
    x = g.input("x", bz.Shape((3,)))
    n = g.neg(x)
    outs = [g.exp(n)]
    outs += [g.tanh(n) if i == 0 else g.abs(n) for i in range(n_readers)]
    g.set_outputs(outs + ([n] if returned else []))
    return g


def test_an_interior_value_read_outside_names_its_first_reader():
    res = rewrite(_graph(2, returned=False), (EXP_NEG,))
    (miss,) = res.misses
    assert miss.reason is MissReason.MULTI_CONSUMER
    assert "tanh" in miss.detail  # the first reader outside, in node order
    assert "abs" not in miss.detail


def test_an_interior_graph_output_blocks_the_match():
    res = rewrite(_graph(0, returned=True), (EXP_NEG,))
    (miss,) = res.misses
    assert miss.reason is MissReason.GRAPH_OUTPUT and not res.changed


def test_a_match_read_only_inside_fuses():
    res = rewrite(_graph(0, returned=False), (EXP_NEG,))
    assert res.changed and res.stats["ExpNeg"].matches == 1 and not res.misses
