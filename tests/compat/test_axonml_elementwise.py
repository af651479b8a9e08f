"""FusedElementwise: every builder op and convenience constructor matches NumPy, and the chain
runs as ONE braze ElementwiseRegion whose body holds braze's elementwise ops."""
import numpy as np
import pytest

import braze as bz
from braze.compat.axonml import (
    ElementwiseOp,
    FusedElementwise,
    fuse_elementwise,
    fused_add_relu,
    fused_mul_add,
    fused_scale_bias_relu,
)
from braze.ir.ops.region import ElementwiseRegion

X = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
POS = np.abs(X) + 0.1

# builder call, input, NumPy expectation
CASES = {
    "add": (lambda b: b.add(1.5), X, lambda x: x + 1.5),
    "mul": (lambda b: b.mul(-2.0), X, lambda x: x * -2.0),
    "relu": (lambda b: b.relu(), X, lambda x: np.maximum(x, 0)),
    "leaky_relu": (lambda b: b.leaky_relu(0.1), X, lambda x: np.where(x >= 0, x, 0.1 * x)),
    "sigmoid": (lambda b: b.sigmoid(), X, lambda x: 1 / (1 + np.exp(-x))),
    "tanh": (lambda b: b.tanh(), X, np.tanh),
    "exp": (lambda b: b.exp(), X, np.exp),
    "log": (lambda b: b.log(), POS, np.log),
    "sqrt": (lambda b: b.sqrt(), POS, np.sqrt),
    "square": (lambda b: b.square(), X, lambda x: x * x),
    "clamp": (lambda b: b.clamp(-0.5, 0.25), X, lambda x: np.minimum(np.maximum(x, -0.5), 0.25)),
    "neg": (lambda b: b.neg(), X, lambda x: -x),
    "abs": (lambda b: b.abs(), X, np.abs),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_builder_op_matches_numpy(name):
    step, x, want = CASES[name]
    fused = step(FusedElementwise.builder()).build()
    assert len(fused) == 1
    got = fused.forward(x)
    assert got.shape == x.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want(x.astype(np.float64)), rtol=1e-6, atol=1e-7)


def test_readme_chain():
    fused = FusedElementwise.builder().mul(2.0).add(1.0).relu().build()
    np.testing.assert_allclose(fused(X), np.maximum(X * 2 + 1, 0), rtol=1e-6)


def test_all_thirteen_ops_chained_in_one_region():
    # in CASES order: relu/sigmoid/exp keep the values positive before log and sqrt
    b = FusedElementwise.builder()
    want = X.astype(np.float64)
    for step, _, fn in CASES.values():
        step(b)
        want = fn(want)
    fused = b.build()
    assert len(fused) == len(CASES) == 13
    got = fused(X)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_forward_evaluates_one_braze_elementwise_region():
    fused = fused_scale_bias_relu(3.0, -1.0)
    fused(X)
    g = fused.graph(bz.f32, 2)
    (node,) = [n for n in g.nodes if not n.op.source]
    assert isinstance(node.op, ElementwiseRegion)
    assert [s.op.label for s in node.op.steps] == ["mul", "add", "relu"]
    (got,) = bz.interpret(g, {"x": X})
    np.testing.assert_array_equal(got, fused(X))


def test_region_can_be_appended_to_a_braze_graph():
    g = bz.Graph("m")
    x = g.input("x", bz.Shape((3, 4)))
    g.set_outputs([fused_mul_add(2.0, 0.5).apply_to(g, x)])
    assert g.op_counts() == {"elementwise_region": 1}
    np.testing.assert_allclose(bz.interpret(g, {"x": X})[0], X * 2 + 0.5, rtol=1e-6)


def test_convenience_constructors():
    np.testing.assert_allclose(fused_add_relu(0.5)(X), np.maximum(X + 0.5, 0), rtol=1e-6)
    np.testing.assert_allclose(fused_mul_add(2.0, -1.0)(X), X * 2 - 1, rtol=1e-6)
    np.testing.assert_allclose(fused_scale_bias_relu(0.5, 0.25)(X),
                               np.maximum(X * 0.5 + 0.25, 0), rtol=1e-6)
    ops = [ElementwiseOp.Neg, ElementwiseOp.Exp, ElementwiseOp.MulConst(0.5)]
    f = fuse_elementwise(ops)
    assert f.ops == tuple(ops) and len(f) == 3
    np.testing.assert_allclose(f(X), np.exp(-X) * 0.5, rtol=1e-6)


def test_inputs_of_other_ranks_dtypes_and_the_empty_chain():
    f = fused_add_relu(-1.0)
    np.testing.assert_allclose(f(np.array(3.0)), 2.0)
    ints = f(np.arange(4))
    assert ints.dtype == np.float32 and ints.tolist() == [0, 0, 1, 2]
    x64 = X.astype(np.float64)
    assert f(x64).dtype == np.float64
    np.testing.assert_array_equal(FusedElementwise([])(X), X)


def test_ops_print_as_axonml_variants_and_bad_ones_are_refused():
    assert repr(ElementwiseOp.Clamp(0, 6)) == "ElementwiseOp.Clamp(0.0, 6.0)"
    assert repr(ElementwiseOp.Relu) == "ElementwiseOp.Relu"
    assert ElementwiseOp.LeakyRelu(0.2) == ElementwiseOp("leaky_relu", (0.2,))
    with pytest.raises(ValueError, match="min <= max"):
        ElementwiseOp.Clamp(1, 0)
    with pytest.raises(TypeError, match="takes ElementwiseOps"):
        FusedElementwise(["relu"])
