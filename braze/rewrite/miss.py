"""Why a fusion did not happen: `MissReason` codes and the `MissedFusion` record that rule checks,
the rewrite driver and the fusion report share."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class MissReason(enum.Enum):
    """Reasons a near match did not fuse. Each has a default hint; checks may give a sharper one."""

    MULTI_CONSUMER = "multi_consumer"
    GRAPH_OUTPUT = "graph_output"
    NON_ADD_BIAS_CONSUMER = "non_add_bias_consumer"
    BIAS_RANK_TOO_HIGH = "bias_rank_too_high"
    UNSUPPORTED_EPILOGUE_ACTIVATION = "unsupported_epilogue_activation"
    SHARED_MATMUL_COUNT = "shared_matmul_count"
    NOT_SHARED_INPUT = "not_shared_input"
    SHAPE_MISMATCH = "shape_mismatch"
    DTYPE_MISMATCH = "dtype_mismatch"
    DYNAMIC_SHAPE = "dynamic_shape"
    UNSUPPORTED_BY_TARGET = "unsupported_by_target"
    REGION_LIMIT_EXCEEDED = "region_limit_exceeded"
    WEIGHT_NOT_CONSTANT = "weight_not_constant"
    PATTERN_MISMATCH = "pattern_mismatch"
    AXIS_MISMATCH = "axis_mismatch"
    DISABLED = "disabled"
    CAPTURE_INSIDE_MATCH = "capture_inside_match"
    WOULD_CYCLE = "would_cycle"
    INVALID_REPLACEMENT = "invalid_replacement"
    SIZE_LIMIT_EXCEEDED = "size_limit_exceeded"
    BELOW_MIN_SIZE = "below_min_size"

    @property
    def default_hint(self) -> str:
        return _HINTS[self]


_HINTS = {
    MissReason.MULTI_CONSUMER: "an intermediate value is also read outside the pattern; fusing "
    "would compute it twice or drop it. Restructure so only the pattern reads it.",
    MissReason.GRAPH_OUTPUT: "an intermediate value is also a graph output; braze never fuses it "
    "away. Return the final value instead if the intermediate is not needed.",
    MissReason.NON_ADD_BIAS_CONSUMER: "the matmul result feeds a non-add op with a bias-like "
    "operand; write the bias as an add (x @ w + b) so it can fuse into the epilogue.",
    MissReason.BIAS_RANK_TOO_HIGH: "the added operand has rank > 1, so it is not a per-column "
    "bias; use a [N] bias vector (broadcast) to fuse it into the matmul epilogue.",
    MissReason.UNSUPPORTED_EPILOGUE_ACTIVATION: "this target cannot apply that activation in a "
    "fused epilogue (after a matmul or conv); use a supported one or choose a target that "
    "claims it.",
    MissReason.SHARED_MATMUL_COUNT: "fewer than two matmuls read this input with compatible "
    "weights; nothing to concatenate.",
    MissReason.NOT_SHARED_INPUT: "the two projections read different inputs; shared-input fusion "
    "needs gate and up (or Q/K/V) to read the same tensor.",
    MissReason.SHAPE_MISMATCH: "shapes are incompatible with the fused kernel.",
    MissReason.DTYPE_MISMATCH: "operands have different dtypes; cast them to one dtype first.",
    MissReason.DYNAMIC_SHAPE: "a dim the fused op needs is symbolic; bind it (static "
    "shapes) to fuse.",
    MissReason.UNSUPPORTED_BY_TARGET: "the target does not claim this fused kind; choose a target "
    "that does, or accept the unfused ops.",
    MissReason.REGION_LIMIT_EXCEEDED: "the region exceeds the target's FusionLimits and was split; "
    "raise the limits with with_fusion_limits(...) if the backend allows.",
    MissReason.WEIGHT_NOT_CONSTANT: "the weight is computed from the graph's inputs at run "
    "time; the fusion changes weights once, at compile time, so it needs params or constants "
    "(or values computed from them alone). Pass the weight as a param to fuse.",
    MissReason.PATTERN_MISMATCH: "the subgraph differs from the fused kind's pattern.",
    MissReason.AXIS_MISMATCH: "the ops act on different axes than the fused kind supports.",
    MissReason.DISABLED: "this fusion is turned off in the pipeline options.",
    MissReason.CAPTURE_INSIDE_MATCH: "the fused op would read a value the matched ops compute "
    "themselves (e.g. add(x @ w, x @ w) uses the product as its own bias); a fused op cannot "
    "take its own intermediate as an input, so these ops stay unfused.",
    MissReason.WOULD_CYCLE: "an input of the matched ops is computed from their own "
    "intermediates (directly, or through another fused node), so the fused node would have to "
    "run before itself; these ops stay unfused.",
    MissReason.INVALID_REPLACEMENT: "the fused replacement would not type-check, or would "
    "change the shape or dtype of a value it replaces, so braze kept the original ops. The "
    "rule's checks missed this case: please report it with the graph.",
    MissReason.SIZE_LIMIT_EXCEEDED: "the folded constant would be larger than the pass's size "
    "cap, so the op stays computed (once per weights update by the executor); raise the cap "
    "(ConstantFolding(max_elements=...)) to bake it in.",
    MissReason.BELOW_MIN_SIZE: "the weight is smaller than the pass's min_size: quantizing it "
    "would save little time and still add its error; lower min_size to include it.",
}


@dataclass(frozen=True)
class Miss:
    """A check's verdict: the reason (and a sharper hint) why a structural match may not fuse."""

    reason: MissReason
    hint: str | None = None
    detail: str | None = None


@dataclass(frozen=True)
class MissedFusion:
    """One fusion that did not happen: which pattern, at which node, why, and what to do."""

    pattern: str
    node: str
    reason: MissReason
    context: str
    hint: str
    detail: str | None = None
    node_id: int = field(default=-1, compare=False, repr=False)

    def __str__(self) -> str:
        d = f" ({self.detail})" if self.detail else ""
        return f"{self.pattern} at {self.context}: {self.reason.value}{d}. Hint: {self.hint}"

    def to_dict(self) -> dict:
        return {"pattern": self.pattern, "node": self.node, "reason": self.reason.value,
                "context": self.context, "hint": self.hint, "detail": self.detail}


def fail(reason: MissReason, hint: str | None = None, detail: str | None = None) -> Miss:
    """What a check returns when it rejects a match."""
    return Miss(reason, hint, detail)
