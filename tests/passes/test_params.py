"""promote_params_to_inputs and specialize_params: chosen params become inputs (same name and
shape) or constants (given or stored values), the rest of the graph is unchanged, numbers agree,
the input graph is never changed, and bad names / values are errors naming the param."""
import numpy as np
import pytest

import braze as bz
from braze.testing import assert_equivalent

RNG = np.random.default_rng(1)


def linear():
    g = bz.Graph("lin")
    x = g.input("x", bz.Shape(("batch", 6)))
    w = g.param("w", bz.Shape((6, 4)), RNG.standard_normal((6, 4)).astype(np.float32))
    b = g.param("b", bz.Shape((4,)))
    g.set_outputs([g.gelu(g.add(g.mm(x, w), b))])
    return g


def test_promoted_params_are_inputs_of_the_same_name_and_shape():
    g = linear()
    before = str(g)
    out = bz.promote_params_to_inputs(g, ["w", "b"])
    assert str(g) == before and set(g.weights) == {"w"}
    assert [n.op.name for n in out.inputs] == ["x", "w", "b"]
    assert out.params == [] and out.weights == {}
    assert out.shape_of(out.input_value("w")) == bz.Shape((6, 4))
    assert out.op_counts() == g.op_counts()
    feeds = bz.random_feeds(g, 0, {"batch": 3})
    ps = bz.init_params(g, 0)
    (want,) = bz.interpret(g, feeds, ps)
    (got,) = bz.interpret(out, {**feeds, **ps})
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_specialize_bakes_stored_or_given_values_as_constants():
    g = linear()
    bias = RNG.standard_normal(4).astype(np.float32)
    out = bz.specialize_params(g, {"b": bias, "w": g.weights["w"] * 2})
    assert out.params == [] and out.weights == {}
    consts = {n.name: n.op.value for n in out.nodes if n.op.kind == "constant"}
    np.testing.assert_array_equal(consts["b"], bias)
    np.testing.assert_array_equal(consts["w"], g.weights["w"] * 2)
    stored = bz.specialize_params(g, ["w"])
    assert [p.op.name for p in stored.params] == ["b"] and stored.count("constant") == 1
    assert_equivalent(g, stored, symbols={"batch": 2})


def test_specialized_weights_then_fold_with_simplify():
    g = bz.Graph("prep")
    x = g.input("x", bz.Shape((2, 6)))
    w = g.param("w", bz.Shape((4, 6)))
    g.set_outputs([g.mm(x, g.transpose(w, (1, 0)))])
    value = RNG.standard_normal((4, 6)).astype(np.float32)
    out = bz.simplify(bz.specialize_params(g, {"w": value}))
    assert out.op_counts() == {"matmul": 1} and out.count("constant") == 1
    assert_equivalent(g, out, params={"w": value})


@pytest.mark.parametrize("call,message", [
    (lambda g: bz.specialize_params(g, ["nope"]), "no param named 'nope'; its params: b, w"),
    (lambda g: bz.promote_params_to_inputs(g, ["x"]), "no param named 'x'"),
    (lambda g: bz.specialize_params(g, ["b"]), "param 'b' f32\\[4\\] .* has no stored value"),
    (lambda g: bz.specialize_params(g, {"w": np.zeros((4, 6), np.float32)}),
     "param 'w' \\(from .*test_params.py:\\d+\\) has shape \\(4, 6\\)"),
    (lambda g: bz.specialize_params(g, {"b": np.zeros(4)}), "param 'b' .* is f64"),
])
def test_errors_name_the_param(call, message):
    g = linear()
    with pytest.raises(bz.GraphError, match=message):
        call(g)


def test_symbolic_params_cannot_be_baked():
    g = bz.Graph("sym")
    x = g.input("x", bz.Shape(("n",)))
    g.set_outputs([g.add(x, g.param("p", bz.Shape(("n",))))])
    with pytest.raises(bz.GraphError, match="param 'p' .* symbolic shape"):
        bz.specialize_params(g, {"p": np.zeros(3, np.float32)})
    out = bz.promote_params_to_inputs(g, "p")
    assert out.shape_of(out.input_value("p")) == bz.Shape(("n",))
