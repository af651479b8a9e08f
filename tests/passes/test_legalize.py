"""Legalization and dispatch: targets claim every op label; bz.legalize names every node a target
cannot run; bz.rewrite_for_backend lowers and unfuses until the graph is legal (and leaves a legal
graph alone); bz.dispatch_report says how each node would run."""
from collections import Counter

import numpy as np
import pytest

import braze as bz
from braze.errors import BrazeError
from braze.ir.ops.elementwise import Unary, UnaryFn
from braze.models.registry import bert_tiny
from braze.passes.legalize import LegalizeError, illegal_labels
from braze.passes.lower import Lowering, register_lowering
from braze.passes.targets import all_op_names
from braze.testing import assert_equivalent

PRIMITIVES = {"matmul", "binary", "unary", "compare", "reduce", "where", "cast", "reshape",
              "transpose", "narrow", "concat", "expand", "gather", "softmax", "constant"}


def _named_square(g, x, name):
    return g.add_node(Unary(UnaryFn.SQUARE), (x,), name=name)[0]


def _square(new, node, ins, old):
    return new.mul(ins[0], ins[0])


# Only nodes named "sq_by_lowering" use it, so no other test sees this lowering.
register_lowering(Lowering("SquareAsMul", frozenset({"unary"}), _square,
                           when=lambda n, g: n.name == "sq_by_lowering"))
register_lowering(Lowering("SquareForever", frozenset({"unary"}),
                           lambda new, node, ins, old: new.add_node(node.op, (ins[0],),
                                                                     name=node.name)[0],
                           when=lambda n, g: n.name == "sq_forever"))


def _mlp(act="gelu"):
    g = bz.Graph("mlp")
    x = g.input("x", bz.Shape(("b", 6)))
    h = g.linear_fused(x, g.param("w1", bz.Shape((6, 8))), g.param("b1", bz.Shape((8,))), act)
    y = g.layer_norm(g.mm(h, g.param("w2", bz.Shape((8, 4)))), g.param("gamma", bz.Shape((4,))),
                     g.param("beta", bz.Shape((4,))))
    g.set_outputs([y])
    return g


def test_reference_and_cpu_targets_claim_every_op_label():
    every = all_op_names()
    assert {"matmul", "add", "gelu", "reduce_sum", "max_pool2d", "layer_norm"} <= every
    for name in ("reference", "cpu"):
        assert bz.get_target(name).claims == every
    # the int8 linear layer runs on the CPU executor's VNNI GEMM; elsewhere it decomposes
    assert bz.get_target("gpu").claims == every - {"dynamic_quant_matmul"}
    ort = bz.get_target("onnxruntime")
    assert "fused_matmul_bias_act" in ort.claims and "fused_swiglu" not in ort.claims
    assert "dynamic_quant_matmul" not in ort.claims


def test_restrict_keeps_only_the_named_labels_and_expands_kinds():
    t = bz.get_target("cpu").restrict({"matmul", "unary"}, name="tiny")
    assert t.name == "tiny"
    assert "matmul" in t.claims and {"gelu", "exp", "relu"} <= t.claims
    assert "add" not in t.claims and "fused_matmul_bias_act" not in t.claims
    assert not t.wants_fusion("fused_matmul_bias_act")


def test_unknown_claim_names_are_an_error_listing_them():
    with pytest.raises(BrazeError, match=r"unknown op names in target claims: \['matmull'\]"):
        bz.get_target({"matmull", "add"})


def test_a_set_of_labels_is_a_target_that_fuses_only_what_it_claims():
    t = bz.get_target({"matmul", "add", "fused_matmul_bias_act"})
    assert t.name == "custom"
    assert t.wants_fusion("fused_matmul_bias_act") and not t.wants_fusion("fused_swiglu")


def test_legalize_returns_a_legal_graph_itself():
    g = _mlp()
    assert bz.legalize(g, "cpu") is g
    assert illegal_labels(g, "cpu") == []


def test_legalize_lists_every_illegal_node_with_kind_provenance_and_hint():
    g = _mlp()
    with pytest.raises(LegalizeError) as e:
        bz.legalize(g, {"matmul", "add"})
    msg = str(e.value)
    assert "2 node(s) target 'custom' cannot run" in msg
    for label in ("fused_matmul_bias_act", "layer_norm"):
        assert f"{label} (test_legalize.py:" in msg      # kind and provenance (the call site)
        assert f"does not claim {label}" in msg
    assert "bz.rewrite_for_backend" in msg and "bz.dispatch_report" in msg
    assert [label for _, label, _ in e.value.nodes] == ["fused_matmul_bias_act", "layer_norm"]


def test_rewrite_for_backend_unfuses_and_decomposes_until_legal():
    g = _mlp()
    target = bz.get_target("cpu").restrict(PRIMITIVES, name="primitives")
    trace = Counter()
    low = bz.rewrite_for_backend(g, target, trace=trace)
    assert illegal_labels(low, target) == []
    kinds = set(low.op_counts())
    assert "fused_matmul_bias_act" not in kinds and "layer_norm" not in kinds
    assert {"matmul", "add", "reduce_mean"} <= kinds
    assert trace["decompose"] >= 2
    assert_equivalent(g, low, symbols={"b": 3})
    assert g.count("layer_norm") == 1                    # the input graph is unchanged


def test_rewrite_for_backend_is_idempotent_on_a_legal_graph():
    g = _mlp()
    assert bz.rewrite_for_backend(g, "cpu") is g
    target = bz.get_target("cpu").restrict(PRIMITIVES)
    once = bz.rewrite_for_backend(g, target)
    assert bz.rewrite_for_backend(once, target) is once


def test_fused_transformer_lowers_to_primitives_with_the_same_numbers():
    g = bert_tiny()
    fused, _ = bz.fuse(g, "cpu")
    target = bz.get_target("cpu").restrict(PRIMITIVES | {"pow", "sqrt", "erf", "tanh"})
    low = bz.rewrite_for_backend(fused, target)
    assert not any(n.op.fused for n in low.nodes)
    assert_equivalent(g, low, seeds=(1,), rtol=1e-4, atol=1e-5)


def test_a_registered_lowering_wins_over_decomposition():
    g = bz.Graph("sq")
    x = g.input("x", bz.Shape((3, 5)))
    g.set_outputs([_named_square(g, x, "sq_by_lowering")])
    target = bz.get_target("cpu").restrict({"mul", "add"})
    trace = Counter()
    low = bz.rewrite_for_backend(g, target, strict=False, trace=trace)
    assert trace["SquareAsMul"] == 1
    assert low.count("mul") == 1 and low.count("square") == 0
    assert_equivalent(g, low)


def test_strict_rewrite_names_the_node_nothing_can_lower():
    g = _mlp()
    with pytest.raises(LegalizeError, match=r"matmul.*does not claim matmul"):
        bz.rewrite_for_backend(g, {"add", "mul", "unary", "reduce", "binary"})
    partial = bz.rewrite_for_backend(g, {"add", "mul", "unary", "reduce", "binary"},
                                     strict=False)
    assert illegal_labels(partial, {"add", "mul", "unary", "reduce", "binary"}) == ["matmul"]


def test_a_lowering_that_never_converges_is_stopped_with_an_error():
    g = bz.Graph("loop")
    x = g.input("x", bz.Shape((4,)))
    g.set_outputs([_named_square(g, x, "sq_forever")])
    with pytest.raises(LegalizeError, match="did not converge in 5 rounds"):
        bz.rewrite_for_backend(g, {"add"}, max_rounds=5)


def test_dispatch_report_says_native_decomposition_rewrite_and_missing():
    g = bz.Graph("mixed")
    x = g.input("x", bz.Shape((2, 6)))
    w = g.param("w", bz.Shape((6, 6)))
    h = g.mm(x, w)                                                     # native
    n = g.layer_norm(h, g.param("gamma", bz.Shape((6,))), g.param("beta", bz.Shape((6,))))
    sq = _named_square(g, n, "sq_by_lowering")                         # rewrite
    y = g.reduce(sq, "max", axes=(1,))                                 # missing
    g.set_outputs([y])
    target = bz.get_target("cpu").restrict(
        {"matmul", "add", "sub", "mul", "div", "sqrt", "reduce_mean", "reciprocal", "rsqrt",
         "pow"}, name="small")
    rep = bz.dispatch_report(g, target)
    by_label = {label: st for label, (st, _, _) in rep.per_label().items()}
    assert by_label["matmul"] == "native"
    assert by_label["layer_norm"] == "decomposition"
    assert by_label["square"] == "rewrite"
    assert by_label["reduce_max"] == "missing"
    assert not rep.legal
    (miss,) = rep.missing
    assert miss.label == "reduce_max" and "does not claim reduce_max" in miss.reason
    text = str(rep)
    assert "dispatch of 'mixed' for target 'small'" in text
    assert "missing: %" in text and "reduce_max" in text and "test_legalize.py" in text
    (ln,) = [d for d in rep.nodes if d.label == "layer_norm"]
    assert ln.via == ("decompose",) and dict(ln.becomes).get("reduce_mean", 0) >= 1
    assert rep.counts()["native"] >= 1


def test_dispatch_report_of_a_legal_graph_is_all_native():
    rep = bz.dispatch_report(_mlp(), "cpu")
    assert rep.legal and set(rep.counts()) == {"native", "decomposition", "rewrite", "missing"}
    assert rep.counts()["native"] == len(rep.nodes) > 0


def test_the_pipeline_legalizes_for_a_restricted_target():
    g = _mlp()
    target = bz.get_target("cpu").restrict(PRIMITIVES, name="primitives")
    fused, report = bz.fuse(g, target)
    assert illegal_labels(fused, target) == []
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    params = bz.init_params(g, 0)
    np.testing.assert_allclose(bz.interpret(fused, {"x": x}, params)[0],
                               bz.interpret(g, {"x": x}, params)[0], rtol=1e-5, atol=1e-5)


def test_a_region_is_legal_only_when_the_target_claims_its_member_ops():
    g = bz.Graph("region")
    x = g.input("x", bz.Shape((3, 8)))
    g.set_outputs([g.tanh(g.gelu(g.mul(x, 2.0)))])
    fused, _ = bz.fuse(g, "cpu")
    assert fused.count("elementwise_region") == 1
    no_gelu = bz.get_target("cpu").restrict(all_op_names() - {"gelu"}, name="no_gelu")
    (node, why), = [(n, w) for n, w in bz.passes.legalize.illegal_nodes(fused, no_gelu)]
    assert node.op.kind == "elementwise_region" and "body holds gelu" in why
    rep = bz.dispatch_report(fused, no_gelu)      # unfused, then gelu lowers to primitives
    (region,) = [d for d in rep.nodes if d.label == "elementwise_region"]
    assert region.status == "rewrite" and "decompose" in region.via and rep.legal
    low = bz.rewrite_for_backend(fused, no_gelu)
    assert low.count("elementwise_region") == 0 and low.count("gelu") == 0
    assert_equivalent(g, low, rtol=1e-4, atol=1e-5)
