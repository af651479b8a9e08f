"""AxonML-style `FusionOptimizer`: a `FusionConfig` selects which pattern families fuse,
`analyze` lists the opportunities in an op-type sequence, `optimize` adds `OptimizationStats`
from the bytes-moved cost model, and `optimize_braze` runs braze's own fusion passes on a graph
and measures the same statistics on the graphs before and after."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...ir.graph import Graph
from ...ir.ops.region import ElementwiseRegion
from ...passes.base import Pass, RulePass, run_passes
from ...passes.expand import expand_nodes
from ...passes.regions import MARK_ELEMENTWISE_REGIONS, ClipRegionsPass
from ...passes.targets import Target, get_target
from ...rewrite import RewriteContext
from .cost import graph_bytes, sequence_bytes
from .patterns import Detected, FusionPattern, OpType, _as_op_type, detect_patterns

__all__ = ["FusionConfig", "FusionOptimizer", "OptimizationStats", "optimize_graph",
           "estimate_speedup"]


@dataclass(frozen=True)
class FusionConfig:
    """Which fusions run.

    fuse_elementwise -- elementwise chains, AddRelu, MulAdd, GeluApprox (braze: regions)
    fuse_linear      -- MatMul + bias (+ Relu/Gelu) epilogues (braze: FuseMatMulBiasAct)
    fuse_conv        -- Conv + BatchNorm (+ Relu) (braze: FoldConvBatchNorm, FuseConvBiasAct)
    min_elementwise_chain -- shortest ElementwiseChain kept (braze: fewest region steps)
    aggressive       -- also fuse the reduction patterns Softmax and LayerNorm, whose kernels
                        need a whole row at once (braze: regions are not clipped to the
                        target's FusionLimits)
    """

    fuse_elementwise: bool = True
    fuse_linear: bool = True
    fuse_conv: bool = True
    min_elementwise_chain: int = 2
    aggressive: bool = False

    def __post_init__(self):
        if self.min_elementwise_chain < 1:
            raise ValueError(f"min_elementwise_chain must be >= 1, got "
                             f"{self.min_elementwise_chain}")

    @classmethod
    def all_enabled(cls) -> FusionConfig:
        """Every family on, chains from two ops, reductions fused too."""
        return cls(True, True, True, 2, True)

    @classmethod
    def conservative(cls) -> FusionConfig:
        """Linear epilogues and longer elementwise chains only: no conv folding (it changes
        rounding), chains of three or more ops, no reduction patterns."""
        return cls(True, True, False, 3, False)

    def enabled_patterns(self) -> frozenset[FusionPattern]:
        """The patterns this config lets `detect_patterns` report."""
        on = {"elementwise": self.fuse_elementwise, "linear": self.fuse_linear,
              "conv": self.fuse_conv, "reduction": self.aggressive}
        return frozenset(p for p in FusionPattern if on[p.family])


@dataclass(frozen=True)
class OptimizationStats:
    """What optimizing did: fused groups made, ops removed (a group of n ops removes n - 1),
    and the speedup estimated as unfused bytes / fused bytes (see `cost`)."""

    fusions_applied: int
    ops_eliminated: int
    estimated_speedup: float
    bytes_unfused: int = 0
    bytes_fused: int = 0


class FusionOptimizer:
    """Finds and scores fusion opportunities under a `FusionConfig` (None: all_enabled)."""

    def __init__(self, config: FusionConfig | None = None):
        self.config = config if config is not None else FusionConfig.all_enabled()

    @classmethod
    def with_config(cls, config: FusionConfig) -> FusionOptimizer:
        return cls(config)

    def analyze(self, op_types: Sequence[OpType]) -> list[Detected]:
        """Fusion opportunities in `op_types` that the config allows."""
        return detect_patterns(op_types, enabled=self.config.enabled_patterns(),
                               min_chain=self.config.min_elementwise_chain)

    def optimize(self, op_types: Sequence[OpType], shapes: Sequence | None = None,
                 itemsize: int = 4) -> tuple[list[Detected], OptimizationStats]:
        """(opportunities, stats). `shapes`: None (every tensor DEFAULT_SHAPE) or one entry per
        op, an `OpShapes` or a plain shape; `itemsize` is bytes per element."""
        ops = [_as_op_type(o) for o in op_types]
        found = self.analyze(ops)
        before = sequence_bytes(ops, (), shapes, itemsize)
        after = sequence_bytes(ops, found, shapes, itemsize)
        stats = OptimizationStats(len(found), sum(d.num_ops - 1 for d in found),
                                  _ratio(before, after), before, after)
        return found, stats

    # -- on braze graphs --------------------------------------------------------------------------
    def braze_passes(self) -> list[Pass]:
        """The braze passes this config runs, in pipeline order; region clipping reads the
        limits of the run's target (or an enclosing `with_fusion_limits`)."""
        cfg = self.config
        passes: list[Pass] = []
        if cfg.fuse_conv:
            from ...passes.fusion import conv_bias_act, conv_bn

            passes += [RulePass("FoldConvBatchNorm", conv_bn.RULES),
                       RulePass("FuseConvBiasAct", conv_bias_act.RULES)]
        if cfg.fuse_linear:
            from ...passes.fusion.matmul_bias_act import RULES

            passes.append(RulePass("FuseMatMulBiasAct", RULES))
        if cfg.fuse_elementwise:
            passes.append(MARK_ELEMENTWISE_REGIONS)
            if not cfg.aggressive:
                passes.append(ClipRegionsPass())
        return passes

    def optimize_braze(self, g: Graph, target: str | Target = "cpu",
                       symbols: Mapping[str, int] | None = None
                       ) -> tuple[Graph, OptimizationStats]:
        """Fuse `g` with braze's passes (see `braze_passes`) for `target`; returns the new graph
        and stats measured on the graphs: fused nodes added, nodes removed, and the bytes
        moved before / after (`cost.graph_bytes`; symbolic dims take `symbols`). Regions with
        fewer than `min_elementwise_chain` steps are inlined back. `g` is not changed."""
        t = get_target(target)
        out, _ = run_passes(g, self.braze_passes(), RewriteContext(target=t))
        min_steps = self.config.min_elementwise_chain
        out, _ = expand_nodes(out, lambda op: isinstance(op, ElementwiseRegion)
                              and len(op.steps) < min_steps)
        before, after = graph_bytes(g, symbols), graph_bytes(out, symbols)
        stats = OptimizationStats(
            fusions_applied=_count_fused(out) - _count_fused(g),
            ops_eliminated=_count_ops(g) - _count_ops(out),
            estimated_speedup=_ratio(before, after),
            bytes_unfused=before,
            bytes_fused=after,
        )
        return out, stats


def _count_fused(g: Graph) -> int:
    return sum(1 for n in g.nodes if n.op.fused)


def _count_ops(g: Graph) -> int:
    return sum(1 for n in g.nodes if not n.op.source)


def _ratio(before: int, after: int) -> float:
    return before / after if after else 1.0


def optimize_graph(op_types: Sequence[OpType], config: FusionConfig | None = None,
                   shapes: Sequence | None = None) -> tuple[list[Detected], OptimizationStats]:
    """`FusionOptimizer(config).optimize(op_types, shapes)`; None means all_enabled."""
    return FusionOptimizer(config).optimize(op_types, shapes)


def estimate_speedup(op_types: Sequence[OpType], patterns: Sequence[Detected] | None = None,
                     shapes: Sequence | None = None, itemsize: int = 4) -> float:
    """Unfused bytes / fused bytes for `op_types` with `patterns` fused (default: everything
    `detect_patterns` finds)."""
    ops = [_as_op_type(o) for o in op_types]
    found = detect_patterns(ops) if patterns is None else list(patterns)
    return _ratio(sequence_bytes(ops, (), shapes, itemsize),
                  sequence_bytes(ops, found, shapes, itemsize))
