"""The rewrite driver's rebuild leaves no reference cycles behind: the graphs of intermediate
sweeps are freed as soon as they are dropped, not by a later cyclic-GC pass (which `bz.fuse`
would pay for, since it pauses the GC while passes run)."""
import gc

import braze as bz
from braze.rewrite import P, Rule, V, rewrite
from braze.testing import assert_equivalent

NEG_NEG = Rule("NegNeg", lambda b, m: m.v("x"), pattern=P.neg(P.neg(V("x"))))


def _graph():
    g = bz.Graph("chain")
    h = g.input("x", bz.Shape((2, 3)))
    for _ in range(6):
        h = g.exp(g.neg(g.neg(h)))
    g.set_outputs([h])
    return g


def _garbage_cycles_left_by(run) -> int:
    """Objects in unreachable cycles after `run()` (the GC paused meanwhile)."""
    run()  # warm caches (op inference, dispatch tables)
    was = gc.isenabled()
    gc.disable()
    try:
        gc.collect()
        run()
        return gc.collect()
    finally:
        if was:
            gc.enable()


def test_rewriting_creates_no_garbage_cycles():
    g = _graph()
    res = rewrite(g, [NEG_NEG])
    assert res.changed and res.graph.op_counts() == {"exp": 6}
    assert_equivalent(g, res.graph)
    assert _garbage_cycles_left_by(lambda: rewrite(g, [NEG_NEG])) == 0


def test_fusing_creates_no_garbage_cycles():
    from braze.models import bert_encoder

    g = bert_encoder(layers=2, hidden=64, heads=4, batch=2, seq=8)
    fused, _ = bz.fuse(g, "cpu")
    assert fused.count("fused_attention_block") == 2
    assert _garbage_cycles_left_by(lambda: bz.fuse(g, "cpu")) == 0
