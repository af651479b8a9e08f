"""AxonML-style pattern detection over a flat sequence of op types: `OpType`, `FusionPattern`
and `detect_patterns`. Each pattern is a fixed op-type signature (the elementwise chain is any
run of elementwise ops); detection is maximal munch (longest match first), non-overlapping."""
from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass

__all__ = ["OpType", "FusionPattern", "Detected", "detect_patterns", "PATTERN_SIGNATURES"]


class OpType(enum.Enum):
    """One op of a sequential graph, as the pattern detector sees it."""

    MatMul = "matmul"
    Add = "add"
    Sub = "sub"
    Mul = "mul"
    Div = "div"
    Pow = "pow"
    Max = "max"
    Relu = "relu"
    Gelu = "gelu"
    Sigmoid = "sigmoid"
    Tanh = "tanh"
    Silu = "silu"
    Exp = "exp"
    Log = "log"
    Sqrt = "sqrt"
    Neg = "neg"
    Abs = "abs"
    Square = "square"
    Sum = "sum"
    Mean = "mean"
    Conv = "conv"
    BatchNorm = "batch_norm"
    Softmax = "softmax"
    LayerNorm = "layer_norm"
    Reshape = "reshape"
    Transpose = "transpose"
    Other = "other"

    @property
    def is_elementwise(self) -> bool:
        """Output element i depends only on input elements at i (may join a chain)."""
        return self in _ELEMENTWISE

    @property
    def arity(self) -> int:
        """Tensors the op reads (the cost model's default when no shapes are given)."""
        return _ARITY.get(self, 1)


_ELEMENTWISE = frozenset({
    OpType.Add, OpType.Sub, OpType.Mul, OpType.Div, OpType.Pow, OpType.Max, OpType.Relu,
    OpType.Gelu, OpType.Sigmoid, OpType.Tanh, OpType.Silu, OpType.Exp, OpType.Log, OpType.Sqrt,
    OpType.Neg, OpType.Abs, OpType.Square,
})
_ARITY = {op: 2 for op in (OpType.MatMul, OpType.Add, OpType.Sub, OpType.Mul, OpType.Div,
                           OpType.Pow, OpType.Max, OpType.Conv)}


class FusionPattern(enum.Enum):
    """A fusion opportunity kind. `signature` is the op-type run it matches (None for the
    variable-length elementwise chain); `braze_kind` is the braze op kind it becomes."""

    MatMulBias = "matmul_bias"
    MatMulBiasRelu = "matmul_bias_relu"
    MatMulBiasGelu = "matmul_bias_gelu"
    ConvBatchNorm = "conv_batch_norm"
    ConvBatchNormRelu = "conv_batch_norm_relu"
    ElementwiseChain = "elementwise_chain"
    Softmax = "softmax"
    LayerNorm = "layer_norm"
    GeluApprox = "gelu_approx"
    AddRelu = "add_relu"
    MulAdd = "mul_add"

    @property
    def signature(self) -> tuple[OpType, ...] | None:
        return PATTERN_SIGNATURES.get(self)

    def num_ops(self) -> int:
        """Ops the pattern fuses; the chain reports its minimum length (2)."""
        sig = self.signature
        return 2 if sig is None else len(sig)

    def estimated_speedup(self) -> float:
        """AxonML's documented per-pattern speedup (a fixed table; `optimize` measures bytes)."""
        return _SPEEDUP[self]

    @property
    def family(self) -> str:
        """"linear", "conv", "elementwise" or "reduction": the FusionConfig switch that
        governs it (reduction patterns need `aggressive`)."""
        return _FAMILY[self]

    @property
    def braze_kind(self) -> str:
        """The braze op kind this pattern is fused into."""
        return _BRAZE_KIND[self]


_O = OpType
PATTERN_SIGNATURES: dict[FusionPattern, tuple[OpType, ...]] = {
    FusionPattern.MatMulBias: (_O.MatMul, _O.Add),
    FusionPattern.MatMulBiasRelu: (_O.MatMul, _O.Add, _O.Relu),
    FusionPattern.MatMulBiasGelu: (_O.MatMul, _O.Add, _O.Gelu),
    FusionPattern.ConvBatchNorm: (_O.Conv, _O.BatchNorm),
    FusionPattern.ConvBatchNormRelu: (_O.Conv, _O.BatchNorm, _O.Relu),
    # exp(x) / sum(exp(x)): the unstabilized primitive form
    FusionPattern.Softmax: (_O.Exp, _O.Sum, _O.Div),
    # (x - mean(x)) / sqrt(var): the variance reduction is folded into the Sqrt step
    FusionPattern.LayerNorm: (_O.Mean, _O.Sub, _O.Sqrt, _O.Div),
    # x^3 scaled, added to x, tanh, outer product (constant scalings and the +1 folded)
    FusionPattern.GeluApprox: (_O.Pow, _O.Mul, _O.Add, _O.Tanh, _O.Mul),
    FusionPattern.AddRelu: (_O.Add, _O.Relu),
    FusionPattern.MulAdd: (_O.Mul, _O.Add),
}
_SPEEDUP = {
    FusionPattern.MatMulBias: 1.2, FusionPattern.MatMulBiasRelu: 1.3,
    FusionPattern.MatMulBiasGelu: 1.3, FusionPattern.ConvBatchNorm: 1.3,
    FusionPattern.ConvBatchNormRelu: 1.4, FusionPattern.ElementwiseChain: 2.0,
    FusionPattern.Softmax: 1.2, FusionPattern.LayerNorm: 1.2, FusionPattern.GeluApprox: 1.2,
    FusionPattern.AddRelu: 1.8, FusionPattern.MulAdd: 1.5,
}
_FAMILY = {
    FusionPattern.MatMulBias: "linear", FusionPattern.MatMulBiasRelu: "linear",
    FusionPattern.MatMulBiasGelu: "linear", FusionPattern.ConvBatchNorm: "conv",
    FusionPattern.ConvBatchNormRelu: "conv", FusionPattern.ElementwiseChain: "elementwise",
    FusionPattern.GeluApprox: "elementwise", FusionPattern.AddRelu: "elementwise",
    FusionPattern.MulAdd: "elementwise", FusionPattern.Softmax: "reduction",
    FusionPattern.LayerNorm: "reduction",
}
_BRAZE_KIND = {
    FusionPattern.MatMulBias: "fused_matmul_bias_act",
    FusionPattern.MatMulBiasRelu: "fused_matmul_bias_act",
    FusionPattern.MatMulBiasGelu: "fused_matmul_bias_act",
    FusionPattern.ConvBatchNorm: "conv_bn_fold",
    FusionPattern.ConvBatchNormRelu: "fused_conv_bias_act",
    FusionPattern.ElementwiseChain: "elementwise_region",
    FusionPattern.GeluApprox: "gelu_approx",
    FusionPattern.AddRelu: "elementwise_region",
    FusionPattern.MulAdd: "elementwise_region",
    FusionPattern.Softmax: "softmax",
    FusionPattern.LayerNorm: "layer_norm",
}


@dataclass(frozen=True)
class Detected:
    """One detected opportunity: `pattern` covers op indices [start, end)."""

    pattern: FusionPattern
    start: int
    end: int

    @property
    def num_ops(self) -> int:
        return self.end - self.start

    @property
    def span(self) -> range:
        return range(self.start, self.end)


def detect_patterns(
    op_types: Sequence[OpType],
    *,
    enabled: Collection[FusionPattern] | None = None,
    min_chain: int = 2,
) -> list[Detected]:
    """Fusion opportunities in `op_types`, in order, non-overlapping.

    At each position the longest matching pattern wins (maximal munch); on equal length a
    fixed-signature pattern beats the generic elementwise chain. `enabled` restricts the
    patterns considered (default: all); `min_chain` is the shortest elementwise chain kept."""
    ops = [_as_op_type(o) for o in op_types]
    allowed = set(FusionPattern) if enabled is None else set(enabled)
    fixed = [(p, sig) for p, sig in PATTERN_SIGNATURES.items() if p in allowed]
    found: list[Detected] = []
    i = 0
    while i < len(ops):
        best: Detected | None = None
        for p, sig in fixed:
            n = len(sig)
            if tuple(ops[i:i + n]) == sig and (best is None or n > best.num_ops):
                best = Detected(p, i, i + n)
        if FusionPattern.ElementwiseChain in allowed:
            j = i
            while j < len(ops) and ops[j].is_elementwise:
                j += 1
            if j - i >= max(min_chain, 2) and (best is None or j - i > best.num_ops):
                best = Detected(FusionPattern.ElementwiseChain, i, j)
        if best is None:
            i += 1
        else:
            found.append(best)
            i = best.end
    return found


def _as_op_type(o) -> OpType:
    if isinstance(o, OpType):
        return o
    try:
        return OpType(o)
    except ValueError:
        try:
            return OpType[o]
        except KeyError:
            known = ", ".join(t.name for t in OpType)
            raise ValueError(f"unknown op type {o!r}; known: {known}") from None
