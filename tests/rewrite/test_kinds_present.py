"""KindsPresent.of keeps a graph's op kinds per graph: nodes appended since are counted in, and
a graph patched in place since (a node replaced, nodes dropped) is counted again, so a rule's
requirement is never judged on stale kinds."""
import dataclasses

import braze as bz
from braze.ir.ops.elementwise import Unary, UnaryFn
from braze.ir.ops.reduce import Softmax
from braze.rewrite.driver import KindsPresent


def test_kinds_follow_appends_and_in_place_patches():
    g = bz.Graph("kinds")
    x = g.input("x", bz.Shape((2, 3)))
    g.set_outputs([g.exp(x)])
    assert not KindsPresent.of(g).meets(frozenset({(Softmax,)}))
    g.set_outputs([g.softmax(g.outputs[0], -1)])                # appended
    assert KindsPresent.of(g).meets(frozenset({(Softmax,)}))

    work = g.detached_copy()
    assert KindsPresent.of(work).meets(frozenset({("exp",)}))
    exp = next(n for n in work.nodes if n.op.label == "exp")
    work.replace_node(dataclasses.replace(exp, op=Unary(UnaryFn.LOG)))
    kinds = KindsPresent.of(work)
    assert kinds.meets(frozenset({("log",)})) and not kinds.meets(frozenset({("exp",)}))
    work.drop_after(len(work.nodes) - 1)                         # the softmax goes
    assert not KindsPresent.of(work).meets(frozenset({(Softmax,)}))
    assert KindsPresent.of(g).meets(frozenset({("exp",)}))        # the original is untouched
