"""lower_logical_kernels: logical ops (norms, softmax, attention, rope, the activations) and
fused kinds become primitives through their own decompositions with the interpreter's numbers;
`kinds` limits what is lowered; primitive graphs come back as they are; a backend without
gelu / silu kernels gets them through rewrite_for_backend (LowerLogicalActivations)."""
from collections import Counter

import pytest
from lowering_helpers import op_counts

import braze as bz
import braze.models  # noqa: F401
from braze.errors import GraphError
from braze.passes.lower.logical import LOGICAL_KINDS
from braze.passes.targets import all_op_names
from braze.testing import assert_equivalent

X = bz.Shape(("b", 3, 8))


def _graph(build, shape=X):
    g = bz.Graph("logical")
    g.set_outputs([build(g, g.input("x", shape))])
    return g


def _p(g, name, *dims):
    return g.param(name, bz.Shape(dims))


CASES = {
    "gelu": lambda g, x: g.gelu(x),
    "gelu_approx": lambda g, x: g.gelu_approx(x),
    "silu": lambda g, x: g.silu(x),
    "quick_gelu": lambda g, x: g.quick_gelu(x),
    "hard_swish": lambda g, x: g.hard_swish(g.mul(x, 4.0)),
    "layer_norm": lambda g, x: g.layer_norm(x, _p(g, "g", 8), _p(g, "b", 8), eps=1e-3),
    "rms_norm": lambda g, x: g.rms_norm(x, _p(g, "g", 8)),
    "softmax": lambda g, x: g.softmax(x, 1),
    "log_softmax": lambda g, x: g.log_softmax(x),
    "attention": lambda g, x: g.attention(*[g.reshape(x, ("b", 1, 3, 8))] * 3, kind="causal"),
    "rope": lambda g, x: g.rope(g.reshape(x, ("b", 1, 3, 8)), _p(g, "cos", 3, 4),
                                _p(g, "sin", 3, 4)),
}


@pytest.mark.parametrize("label", sorted(CASES))
def test_each_logical_op_lowers_to_primitives_with_equal_numbers(label):
    g = _graph(CASES[label])
    assert op_counts(g)[label] == 1
    low = bz.lower_logical_kernels(g)
    kinds = op_counts(low)
    assert not set(kinds) & LOGICAL_KINDS, kinds
    assert not any(n.op.composite for n in low.nodes)
    assert_equivalent(g, low, symbols={"b": 2}, rtol=1e-5, atol=1e-6)


def test_gelu_becomes_erf_arithmetic():
    low = bz.lower_logical_kernels(_graph(CASES["gelu"]))
    assert op_counts(low) == Counter({"mul": 2, "div": 1, "erf": 1, "add": 1})


def test_fused_model_lowers_to_primitives_only():
    g = bz.models.bert_encoder(layers=1, hidden=32, heads=2, batch="batch", seq="seq")
    fused, _ = bz.fuse(g, "cpu")
    assert any(n.op.fused for n in fused.nodes)
    low = bz.lower_logical_kernels(fused)
    assert not any(n.op.composite for n in low.nodes)
    assert not set(op_counts(low)) & LOGICAL_KINDS
    assert op_counts(low)["matmul"] == 6
    assert_equivalent(g, low, symbols={"batch": 2, "seq": 5}, rtol=1e-4, atol=1e-5)


def test_kinds_limits_what_is_lowered():
    g = _graph(lambda g, x: g.layer_norm(g.gelu(g.softmax(x))))
    low = bz.lower_logical_kernels(g, kinds={"gelu", "softmax"})
    kinds = op_counts(low)
    assert kinds["layer_norm"] == 1 and "gelu" not in kinds and "softmax" not in kinds
    assert_equivalent(g, low, symbols={"b": 2})
    only_ln = bz.lower_logical_kernels(g, kinds="layer_norm")
    assert op_counts(only_ln)["gelu"] == 1 and "layer_norm" not in op_counts(only_ln)


def test_unknown_or_primitive_kinds_are_a_clear_error():
    g = _graph(CASES["silu"])
    with pytest.raises(GraphError, match=r"cannot lower \['matmul', 'relu'\]"):
        bz.lower_logical_kernels(g, kinds={"matmul", "relu", "silu"})


def test_primitive_graph_comes_back_unchanged():
    g = _graph(lambda g, x: g.relu(g.exp(g.sum(x, -1))))
    assert bz.lower_logical_kernels(g) is g


def test_activation_pass_leaves_primitive_unary_ops_alone():
    g = _graph(lambda g, x: g.tanh(g.sigmoid(x)))
    res = bz.passes.lower.LowerLogicalActivations.run(g)
    assert not res.changed and res.graph is g


def test_input_graph_is_not_mutated():
    g = _graph(CASES["attention"])
    before = str(g)
    bz.lower_logical_kernels(g)
    assert str(g) == before


def test_backend_without_activation_kernels_gets_them_through_rewrite_for_backend():
    g = _graph(lambda g, x: g.add(g.gelu(x), g.silu(g.mm(x, _p(g, "w", 8, 8)))))
    target = bz.get_target("cpu").restrict(all_op_names() - {"gelu", "silu"}, name="no_acts")
    with pytest.raises(bz.LegalizeError, match="does not claim gelu"):
        bz.legalize(g, target)
    trace = Counter()
    low = bz.rewrite_for_backend(g, target, trace=trace)
    assert trace == Counter({"LowerLogicalActivations": 2})
    assert bz.legalize(low, target) is low
    assert_equivalent(g, low, symbols={"b": 2})
