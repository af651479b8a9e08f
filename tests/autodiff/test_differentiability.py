"""Registry completeness: every op kind has a VJP rule, a decomposition autodiff uses, or an
explicit non_differentiable mark with a reason; and every kind's example graph
(braze.op_examples) differentiates to the finite-difference gradient."""
from __future__ import annotations

import numpy as np
import pytest

import braze as bz
from braze.autodiff import differentiability, grad_with_loss, non_differentiable, vjp_rule
from braze.autodiff.registry import non_differentiable_reason
from braze.errors import AutodiffError
from braze.ir.op import OP_REGISTRY, Op
from braze.op_examples import OP_EXAMPLES, example_graph, example_input_shape


def _all_kinds() -> list[str]:
    import braze.ir.ops  # noqa: F401  (registers every kind)

    return sorted(OP_REGISTRY)


@pytest.mark.parametrize("kind", _all_kinds())
def test_every_op_kind_is_differentiable_or_marked(kind):
    cls = OP_REGISTRY[kind]
    how = differentiability(cls)
    assert how in ("rule", "decomposition", "non_differentiable"), (
        f"op {kind!r} ({cls.__name__}) has no VJP rule, no decomposition and no "
        "non_differentiable mark: add one in braze/autodiff/rules/")
    if how == "non_differentiable":
        assert len(non_differentiable_reason(cls)) > 10


def test_marks_are_for_ops_without_float_gradients():
    marked = {k for k in _all_kinds() if differentiability(OP_REGISTRY[k]) == "non_differentiable"}
    assert marked == {"compare", "isnan", "isinf", "argmax", "input", "param", "constant",
                      "range", "sym_const", "quantize"} | (marked & {"top_k"})


# Kinds whose gradient is a deliberate estimator, not the derivative: fake_quantize is a
# staircase (finite differences see 0 or a jump); tests/autodiff/test_rules_quant.py checks its
# straight-through gradient against torch instead. dynamic_quant_matmul quantizes its operand
# with fake_quantize (tests/passes/test_quantize_dynamic.py checks its gradient).
# stop_gradient has zero gradient by definition (tests/autodiff/test_stop_gradient.py).
ESTIMATED_GRADIENTS = {"fake_quantize", "dynamic_quant_matmul", "stop_gradient"}


def _float_examples() -> list[str]:
    out = []
    for kind in sorted(set(OP_EXAMPLES) - ESTIMATED_GRADIENTS):
        g = example_graph(kind)
        if g.shape_of(g.outputs[0]).dtype.is_float and kind not in ("input", "param",
                                                                     "constant"):
            out.append(kind)
    return out


@pytest.mark.parametrize("kind", _float_examples())
def test_example_graph_gradient_matches_finite_differences(kind):
    g = example_graph(kind)
    loss = bz.Graph(f"{kind}_loss")
    from braze.autodiff.reverse import clone_into

    vmap = clone_into(loss, g)
    out = vmap[g.outputs[0]]
    rng = np.random.default_rng(0)
    r = rng.normal(size=tuple(g.shape_of(g.outputs[0]).dims)).astype(np.float32)
    loss.set_outputs([loss.sum(loss.mul(out, loss.constant(r)))])
    params = bz.init_params(loss, seed=1)
    x = (rng.normal(size=example_input_shape().dims) + 0.1).astype(np.float32)
    if kind == "isnan":
        x = np.abs(x) + 0.5
    grads = grad_with_loss(loss, ["x"])
    got = bz.interpret(grads, {"x": x}, params, float64=True)[1]
    f = lambda v: float(bz.interpret(loss, {"x": v}, params, float64=True)[0])  # noqa: E731
    eps = 1e-3
    want = np.zeros(x.shape)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        want[idx] = (f(xp) - f(xm)) / (float(xp[idx]) - float(xm[idx]))
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)


def test_registering_a_rule_twice_is_refused():
    class _Probe(Op):
        pass

    vjp_rule(_Probe)(lambda *a: [None])
    with pytest.raises(TypeError, match="registered twice"):
        vjp_rule(_Probe)(lambda *a: [None])
    with pytest.raises(ValueError, match="needs a reason"):
        non_differentiable(_Probe, "")


def test_an_op_without_any_rule_is_named_in_the_error():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class _Opaque(Op):
        kind = "autodiff_test_opaque"
        arity = 1

        def infer(self, ins):
            return ins[0]

        def reference(self, x):
            return x

    try:
        g = bz.Graph("opaque")
        x = g.input("x", bz.Shape((3,), bz.f64))
        y = g.add_node(_Opaque(), (x,), name="mystery")[0]
        g.set_outputs([g.sum(y)])
        with pytest.raises(AutodiffError, match="mystery.*autodiff_test_opaque.*no VJP rule"):
            grad_with_loss(g, ["x"])
    finally:
        OP_REGISTRY.pop("autodiff_test_opaque", None)
