"""Targets as data: a backend is its claims. `claims` names every op it runs natively, by op
label (`matmul`, `gelu`, `add`, `reduce_sum`, `max_pool2d`, `fused_attention_block`, ...; an op
kind with several labels, such as `unary`, stands for all of them when a claim set is built);
`fusions` names the fused kinds its pipeline builds; `constraints` name extra demands on claimed
ops (`reduce_last_axis_only`, `trailing_broadcast_only`) that legalization must satisfy. The
epilogue activations, region limits and pipeline switches complete it. One pipeline builder and
one legalizer read these; passes never special-case a backend.

`reference` claims everything and fuses nothing; `get_target("cpu").restrict({...})`, or a set of
op names passed wherever a target is taken, describes a smaller backend."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import cache

from ..errors import BrazeError
from ..ir.ops.elementwise import UnaryFn
from .constraints import CONSTRAINTS
from .limits import FusionLimits

ALL_FUSED = frozenset({
    "fused_matmul_bias_act", "shared_matmul", "fused_swiglu", "fused_residual_ln",
    "fused_residual_rms_norm", "fused_rms_norm_reshape", "fused_attention_block",
    "fused_transformer_layer", "fused_conv_bias_act", "conv_bn_fold", "elementwise_region",
})

@cache
def _labels_by_kind() -> dict[str, tuple[str, ...]]:
    from ..ir.op import OP_REGISTRY, op_class

    op_class("matmul")  # registers every kind
    return {kind: cls.labels() for kind, cls in OP_REGISTRY.items()}


def all_op_names() -> frozenset[str]:
    """Every op label of every registered kind (what the reference interpreter runs)."""
    return frozenset(lab for labs in _labels_by_kind().values() for lab in labs)


def expand_claims(names: Iterable[str]) -> frozenset[str]:
    """Claim names with each multi-label kind (`unary`, `binary`, `compare`, `reduce`, `pool2d`)
    replaced by its labels. Unknown names are a BrazeError listing the known ones."""
    by_kind = _labels_by_kind()
    known = all_op_names()
    out: set[str] = set()
    bad = []
    for n in names:
        if n in by_kind and by_kind[n] != (n,):
            out.update(by_kind[n])
        elif n in known:
            out.add(n)
        else:
            bad.append(n)
    if bad:
        raise BrazeError(f"unknown op names in target claims: {sorted(bad)}; claims are op "
                         f"labels such as 'matmul', 'gelu', 'add', 'reduce_sum' or kinds such "
                         f"as 'unary' (see braze.passes.targets.all_op_names())")
    return frozenset(out)


@dataclass(frozen=True)
class Target:
    """A backend described as data (see the module docstring). `claims=None` claims every op."""

    name: str
    claims: frozenset[str] | None
    epilogue_activations: frozenset[UnaryFn]
    limits: FusionLimits = field(default_factory=FusionLimits)
    keep_regions: bool = True
    whole_layer: bool = False
    fusions: frozenset[str] = ALL_FUSED
    constraints: frozenset[str] = frozenset()

    def __post_init__(self):
        claims = all_op_names() if self.claims is None else expand_claims(self.claims)
        object.__setattr__(self, "claims", claims)
        bad = set(self.constraints) - set(CONSTRAINTS)
        if bad:
            raise BrazeError(f"unknown target constraints {sorted(bad)}; known: "
                             f"{sorted(CONSTRAINTS)}")

    def claims_kind(self, name: str) -> bool:
        """Whether the backend runs ops labelled `name` natively."""
        return name in self.claims

    def claims_op(self, op) -> bool:
        """Whether the backend runs `op` natively (by its label)."""
        return op.label in self.claims

    def wants_fusion(self, kind: str) -> bool:
        """Whether this target's pipeline builds fused `kind`. A fusion that produces an op of
        its own (fused_matmul_bias_act, ...) also needs the target to claim that op; one that
        rewrites into ordinary ops (shared_matmul, conv_bn_fold) only needs to be enabled."""
        if kind not in self.fusions:
            return False
        return kind in self.claims or kind not in all_op_names()

    def restrict(self, claims: Iterable[str], name: str | None = None) -> Target:
        """This target running only the ops in `claims` (and what it already claimed)."""
        keep = expand_claims(claims) & self.claims
        return replace(self, name=name or f"{self.name}[restricted]", claims=keep)

    def with_options(self, **changes) -> Target:
        return replace(self, **changes)


_ALL_UNARY = frozenset(UnaryFn)
# kinds only braze's CPU executor runs natively (its int8 VNNI GEMM); other targets decompose
# them (dynamic_quant_matmul into quantize / dequantize and a float matmul)
CPU_ONLY = frozenset({"dynamic_quant_matmul"})
_ORT_FUSED = frozenset({"fused_matmul_bias_act", "shared_matmul", "fused_residual_ln",
                        "fused_residual_rms_norm", "fused_attention_block", "conv_bn_fold",
                        "fused_conv_bias_act"})

TARGETS: dict[str, Target] = {
    "reference": Target("reference", None, frozenset(), FusionLimits(), keep_regions=False,
                        fusions=frozenset()),
    "cpu": Target("cpu", None, _ALL_UNARY, FusionLimits(max_steps=256, max_inputs=64)),
    "gpu": Target("gpu", all_op_names() - CPU_ONLY, _ALL_UNARY,
                  FusionLimits(max_steps=32, max_inputs=16)),
    "onnxruntime": Target(
        "onnxruntime",
        all_op_names() - (ALL_FUSED - _ORT_FUSED) - CPU_ONLY,
        frozenset({UnaryFn.GELU, UnaryFn.GELU_APPROX, UnaryFn.RELU, UnaryFn.SIGMOID,
                   UnaryFn.TANH, UnaryFn.SILU}),
        FusionLimits(),
        keep_regions=False,
        fusions=_ORT_FUSED,
    ),
}


def get_target(target: str | Target | Iterable[str]) -> Target:
    """The Target named `target`, `target` itself, or, for a set of op names, the reference
    target restricted to them (a backend that runs exactly those ops, fusing the fused kinds
    among them)."""
    if isinstance(target, Target):
        return target
    if isinstance(target, str):
        try:
            return TARGETS[target]
        except KeyError:
            raise BrazeError(f"unknown target {target!r}; known: {', '.join(TARGETS)}; or pass "
                             f"a set of op names") from None
    names = expand_claims(target)
    base = TARGETS["cpu"]
    return replace(base, name="custom", claims=names, fusions=names & ALL_FUSED)
