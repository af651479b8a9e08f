"""MaterializeStaticGenerators: a static `range` / `sym_const` becomes a constant with the same
values (so a target of primitives runs a lowered softmax cross-entropy, whose one-hot is built
with a range); symbolic ones are left alone; rewrite_for_backend uses it only where the target
does not claim the generator."""
import numpy as np
from lowering_helpers import op_counts

import braze as bz
from braze.passes.lower import MaterializeStaticGenerators
from braze.testing import assert_equivalent


def _positions(length):
    g = bz.Graph("pos")
    x = g.input("x", bz.Shape(("b", 4), bz.f32))
    pos = g.cast(g.arange(length, start=1, delta=0.5, dtype=bz.f32), bz.f32)
    shape = g.sym_const((2, 2), dtype=bz.i64)
    g.set_outputs([g.add(x, g.reshape(g.narrow(pos, 0, 0, 4), (4,))), shape])
    return g


def test_static_generators_become_constants_with_the_same_values():
    g = _positions(6)
    res = MaterializeStaticGenerators.run(g)
    assert res.changed
    assert "range" not in op_counts(res.graph) and "sym_const" not in op_counts(res.graph)
    assert op_counts(g)["range"] == 1                       # input not mutated
    assert_equivalent(g, res.graph, symbols={"b": 3})


def test_symbolic_range_is_left_alone():
    g = bz.Graph("sym")
    x = g.input("x", bz.Shape(("seq",), bz.i64))
    g.set_outputs([g.add(x, g.arange("seq"))])
    assert not MaterializeStaticGenerators.run(g).changed


def test_lowered_cross_entropy_runs_on_a_target_of_primitives():
    g = bz.Graph("loss")
    logits = g.input("logits", bz.Shape((4, 7), bz.f32))
    labels = g.input("labels", bz.Shape((4,), bz.i32))
    g.set_outputs([g.softmax_cross_entropy(logits, labels)])
    prims = {"binary", "unary", "compare", "reduce", "cast", "reshape", "expand", "softmax",
             "log_softmax", "constant"}
    low = bz.rewrite_for_backend(g, prims)
    assert "range" not in op_counts(low) and "softmax_cross_entropy" not in op_counts(low)
    assert bz.dispatch_report(g, prims).legal
    feeds = {"logits": np.random.default_rng(0).standard_normal((4, 7)).astype(np.float32),
             "labels": np.array([0, 6, 3, 3], np.int32)}
    np.testing.assert_allclose(bz.interpret(low, feeds)[0], bz.interpret(g, feeds)[0],
                               rtol=1e-6)
    assert bz.rewrite_for_backend(g, prims | {"range"}).count("range") == 1
