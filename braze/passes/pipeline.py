"""The pipeline builder: one ordered list of named steps, read against a target's claims and the
user's options. `bz.fuse(g, target)` runs lowerings -> canonicalization (recognize logical ops
written in primitives, braze/passes/canonicalize/) -> fusions in dependency order -> regions ->
legalize -> cleanup, and returns the fused graph with its FusionReport.

Options are plain keyword arguments (no environment variables): `bz.fuse(g, "cpu",
transformer_layer=True, regions=False)`."""
from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

from ..errors import BrazeError
from ..ir.graph import Graph
from ..rewrite import RewriteContext
from .base import FunctionPass, Pass, PassResult, RulePass, run_passes
from .targets import ALL_FUSED, Target, get_target


@dataclass(frozen=True)
class FusionOptions:
    """Which pipeline steps run. None means "the target decides" (whole-layer fusion follows
    `target.whole_layer`; regions follow `target.keep_regions`)."""

    canonicalize: bool = True
    conv_bn_fold: bool = True
    conv_bias_act: bool = True
    conv_residual: bool = True
    shared_matmul: bool = True
    swiglu: bool = True
    attention_block: bool = True
    residual_norm: bool = True
    rms_norm_reshape: bool = True
    matmul_bias_act: bool = True
    transformer_layer: bool | None = None
    regions: bool | None = None
    legalize: bool = True
    cleanup: bool = True


def _fusion_steps() -> tuple[tuple[str, Pass], ...]:
    """(option that enables it, pass) in dependency order: larger patterns first, so a
    fusion that builds on another's result (attention block on QKV, residual norm before
    bias epilogues) sees the primitives it needs."""
    from .fusion import (
        attention_block,
        conv_bias_act,
        conv_bn,
        conv_pad,
        conv_residual,
        matmul_bias_act,
        matmul_bn,
        residual_norm,
        rms_norm_reshape,
        shared_matmul,
        swiglu,
        transformer_layer,
    )

    return (
        ("conv_bn_fold", RulePass("FoldConvBatchNorm",
                                  conv_pad.RULES + conv_bn.RULES + matmul_bn.RULES)),
        ("conv_bias_act", RulePass("FuseConvBiasAct", conv_bias_act.RULES)),
        ("conv_residual", RulePass("FuseConvResidual", conv_residual.RULES)),
        ("swiglu", RulePass("FuseSwiGLUDualMatmul", swiglu.DUAL_RULES)),
        ("attention_block", RulePass("FuseAttentionBlock", attention_block.RULES)),
        ("shared_matmul", RulePass("FuseSharedInputMatMul", shared_matmul.RULES)),
        ("swiglu", RulePass("FuseSwiGLU", swiglu.SPLIT_RULES)),
        ("rms_norm_reshape", RulePass("FuseRmsNormReshape", rms_norm_reshape.RULES)),
        ("residual_norm", RulePass("FuseResidualNorm", residual_norm.RULES)),
        ("matmul_bias_act", RulePass("FuseMatMulBiasAct", matmul_bias_act.RULES)),
        ("transformer_layer", RulePass("FuseTransformerLayer", transformer_layer.RULES)),
    )


def _enabled(opts: FusionOptions, name: str, target: Target) -> bool:
    v = getattr(opts, name)
    if v is None:
        return target.whole_layer if name == "transformer_layer" else target.keep_regions
    return v


def fusion_passes(target: str | Target = "cpu", options: FusionOptions | None = None
                  ) -> list[Pass]:
    """The ordered passes `bz.fuse` runs for `target`. The `reference` target fuses nothing."""
    t = get_target(target)
    opts = options or FusionOptions()
    passes: list[Pass] = []
    if not t.fusions:
        return passes
    if opts.canonicalize:
        from .canonicalize import canonicalize_passes

        passes += canonicalize_passes(opts)
    passes += [p for opt, p in _fusion_steps() if _enabled(opts, opt, t)]
    if _enabled(opts, "regions", t):
        from . import regions

        passes.append(regions.MARK_ELEMENTWISE_REGIONS)
        passes.append(regions.ClipRegionsPass())
    if opts.legalize:
        passes.append(LegalizePass())
    if opts.cleanup:
        from . import cleanup
        from .canonicalize.simplify import AlgebraicSimplify

        passes += [AlgebraicSimplify("CleanupSimplify"), cleanup.CSE_PASS, cleanup.DCE_PASS]
    return passes


def fusion_passes_for_supported(claims: Sequence[str], base: str | Target = "cpu",
                                options: FusionOptions | None = None) -> list[Pass]:
    """Passes for a backend that runs exactly the fused kinds in `claims` (and every
    primitive `base` claims)."""
    unknown = set(claims) - ALL_FUSED
    if unknown:
        raise BrazeError(f"unknown fused kinds {sorted(unknown)}; known: {sorted(ALL_FUSED)}")
    b = get_target(base)
    t = replace(b, name="custom", claims=b.claims - (ALL_FUSED - set(claims)),
                fusions=frozenset(claims))
    return fusion_passes(t, options)


@dataclass
class LegalizePass:
    """Lower and decompose what the target cannot run (`bz.rewrite_for_backend`, not strict:
    what cannot be rewritten stays, and `bz.dispatch_report` names it)."""

    name: str = "Legalize"

    def run(self, g: Graph, ctx: RewriteContext) -> PassResult:
        import time

        from .legalize import rewrite_for_backend

        t0 = time.perf_counter()
        out = rewrite_for_backend(g, ctx.target, strict=False)
        return PassResult(self.name, out, out is not g, seconds=time.perf_counter() - t0)


@dataclass
class Pipeline:
    """A target plus options, ready to run on graphs."""

    target: Target
    options: FusionOptions

    @property
    def passes(self) -> list[Pass]:
        return fusion_passes(self.target, self.options)

    def run(self, g: Graph, *, verify: bool = False, check_numerics: bool = False):
        """Fuse `g`; returns (graph, FusionReport)."""
        out, _, report = self._run(g, verify, check_numerics, keep_results=False)
        return out, report

    def run_traced(self, g: Graph, *, verify: bool = False, check_numerics: bool = False
                   ) -> tuple[Graph, list[PassResult], object]:
        """Fuse `g`; returns (graph, the PassResult of every pass in order, with the graph
        it produced, FusionReport). Python's cyclic GC is paused meanwhile: the passes allocate
        many small acyclic objects, and its full-heap scans would otherwise make large graphs
        fuse superlinearly (measured in bench/fusion_speed.py)."""
        return self._run(g, verify, check_numerics, keep_results=True)

    def _run(self, g: Graph, verify: bool, check_numerics: bool, keep_results: bool
             ) -> tuple[Graph, list[PassResult] | None, object]:
        from ..report import FusionReport

        ctx = RewriteContext(target=self.target, options=self.options)
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            out, results = run_passes(g, self.passes, ctx, verify=verify,
                                      check_numerics=check_numerics)
            report = FusionReport.analyze(g, out, results, target=self.target.name)
            if not keep_results:  # the passes' graphs go while the GC is off: the collection
                results = None    # that follows then scans only what survives
        finally:
            if was_enabled:
                gc.enable()
        return out, results, report


def compile_pipeline(target: str | Target = "cpu", **options) -> Pipeline:
    """A Pipeline for `target`; keyword options switch steps on and off (see FusionOptions)."""
    names = {f.name for f in fields(FusionOptions)}
    bad = set(options) - names
    if bad:
        raise BrazeError(f"unknown pipeline options {sorted(bad)}; known: {sorted(names)}")
    return Pipeline(get_target(target), FusionOptions(**options))


def fuse(g: Graph, target: str | Target = "cpu", *, verify: bool = False,
         check_numerics: bool = False, **options) -> tuple[Graph, object]:
    """Fuse `g` for `target`; returns (fused graph, FusionReport). `g` is not changed."""
    return compile_pipeline(target, **options).run(g, verify=verify,
                                                   check_numerics=check_numerics)


__all__ = ["FusionOptions", "Pipeline", "compile_pipeline", "fuse", "fusion_passes",
           "fusion_passes_for_supported", "LegalizePass", "FunctionPass"]
