"""detect_patterns: each pattern's signature is found with its op indices, the longest match at a
position wins, matches never overlap, and unknown op types are refused by name."""
import pytest

from braze.compat.axonml import Detected, FusionPattern, OpType, detect_patterns

T, F = OpType, FusionPattern


def found(ops, **kw):
    return [(d.pattern, d.start, d.end) for d in detect_patterns(ops, **kw)]


def test_readme_sequence_fuses_linear_epilogue_then_elementwise_chain():
    ops = [T.MatMul, T.Add, T.Relu, T.Add, T.Mul]
    assert found(ops) == [(F.MatMulBiasRelu, 0, 3), (F.ElementwiseChain, 3, 5)]


@pytest.mark.parametrize("pattern", [p for p in FusionPattern if p.signature is not None])
def test_every_fixed_pattern_is_found_at_its_position(pattern):
    ops = [T.Reshape, *pattern.signature, T.Transpose]
    (d,) = detect_patterns(ops)
    assert (d.pattern, d.start, d.end) == (pattern, 1, 1 + pattern.num_ops())
    assert d.num_ops == pattern.num_ops()


def test_num_ops_are_signature_lengths():
    assert {p: p.num_ops() for p in FusionPattern} == {
        F.MatMulBias: 2, F.MatMulBiasRelu: 3, F.MatMulBiasGelu: 3, F.ConvBatchNorm: 2,
        F.ConvBatchNormRelu: 3, F.ElementwiseChain: 2, F.Softmax: 3, F.LayerNorm: 4,
        F.GeluApprox: 5, F.AddRelu: 2, F.MulAdd: 2,
    }


def test_longest_match_first():
    # MatMulBiasGelu (3) beats MatMulBias (2); Conv+BN+Relu (3) beats Conv+BN (2)
    assert found([T.MatMul, T.Add, T.Gelu]) == [(F.MatMulBiasGelu, 0, 3)]
    assert found([T.Conv, T.BatchNorm, T.Relu]) == [(F.ConvBatchNormRelu, 0, 3)]
    # a 3-op chain beats the 2-op AddRelu / MulAdd at the same position
    assert found([T.Add, T.Relu, T.Exp]) == [(F.ElementwiseChain, 0, 3)]
    assert found([T.Mul, T.Add, T.Tanh, T.Neg]) == [(F.ElementwiseChain, 0, 4)]


def test_named_pattern_beats_chain_of_equal_length():
    assert found([T.Add, T.Relu]) == [(F.AddRelu, 0, 2)]
    assert found([T.Mul, T.Add]) == [(F.MulAdd, 0, 2)]
    assert found([T.Pow, T.Mul, T.Add, T.Tanh, T.Mul]) == [(F.GeluApprox, 0, 5)]


def test_matches_do_not_overlap_and_stop_at_non_elementwise_ops():
    ops = [T.MatMul, T.Add, T.Add, T.Relu, T.Softmax, T.Exp, T.Log, T.Sum, T.MatMul, T.Add]
    assert found(ops) == [(F.MatMulBias, 0, 2), (F.AddRelu, 2, 4), (F.ElementwiseChain, 5, 7),
                          (F.MatMulBias, 8, 10)]
    spans = [set(d.span) for d in detect_patterns(ops)]
    assert all(not (a & b) for i, a in enumerate(spans) for b in spans[i + 1:])


def test_reductions_and_lone_ops_are_left_alone():
    assert found([T.Exp, T.Sum, T.Div]) == [(F.Softmax, 0, 3)]
    assert found([T.Mean, T.Sub, T.Sqrt, T.Div, T.Relu]) == [(F.LayerNorm, 0, 4)]
    assert found([T.Relu, T.MatMul, T.Sigmoid, T.Sum]) == []
    assert found([]) == []


def test_enabled_and_min_chain_restrict_detection():
    ops = [T.MatMul, T.Add, T.Relu, T.Exp, T.Log]
    assert found(ops, enabled={F.ElementwiseChain}) == [(F.ElementwiseChain, 1, 5)]
    assert found([T.Exp, T.Log], min_chain=3) == []


def test_op_types_may_be_given_by_value_or_name_and_unknown_ones_are_named():
    assert detect_patterns(["matmul", "Add"]) == [Detected(F.MatMulBias, 0, 2)]
    with pytest.raises(ValueError, match="unknown op type 'frobnicate'"):
        detect_patterns(["frobnicate"])


def test_patterns_name_the_braze_kind_they_become():
    assert F.MatMulBiasGelu.braze_kind == "fused_matmul_bias_act"
    assert F.ElementwiseChain.braze_kind == "elementwise_region"


def test_every_pattern_has_the_documented_estimated_speedup():
    from braze.compat.axonml import FusionPattern
    table = {"MatMulBias": 1.2, "MatMulBiasRelu": 1.3, "MatMulBiasGelu": 1.3,
             "ConvBatchNorm": 1.3, "ConvBatchNormRelu": 1.4, "ElementwiseChain": 2.0,
             "Softmax": 1.2, "LayerNorm": 1.2, "GeluApprox": 1.2, "AddRelu": 1.8, "MulAdd": 1.5}
    assert {p.name: p.estimated_speedup() for p in FusionPattern} == table
