"""`bz.quantize_dynamic`: dynamic int8 quantization of linear layers. Each matmul whose weight
is a stored 2-D float32 matrix (a param with a value, given or stored, or a constant, or such a
matrix transposed) becomes a DynamicQuantMatMul: the weight quantized once, here, to symmetric
int8 with a scale per output column (weights.py), the activation quantized per row when the
node runs. The steps:
FuseSharedInputMatMul joins the projections of one input (Q, K and V; gate and up), so one
GEMM quantizes that input once; FuseMatMulBiasAct brings each layer's bias add and activation
into its matmul; then the rule below. Every matmul left alone is a reported miss with its
reason: a weight computed at run time or without a value, not 2-D, not float32, smaller than
`min_size`, empty or holding NaN / infinity, K past the int32 sums' reach, or a kind
`op_kinds` leaves out; so is each fused node (an attention block, a SwiGLU, ...) holding
stored weights, whose matmuls the rule cannot see."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ...errors import BrazeError, GraphError
from ...ir.dtypes import DType, f32, i8
from ...ir.graph import Graph
from ...ir.ops.fused import FusedMatMulBiasAct
from ...ir.ops.fused_quant import MAX_K, DynamicQuantMatMul
from ...ir.ops.io import Constant, Param
from ...ir.ops.shape import Transpose
from ...ir.shapes import Shape
from ...rewrite import Miss, MissedFusion, MissReason, P, RewriteContext, Rule, V, fail
from ..base import FunctionPass, PassResult, RulePass, run_passes
from ..cleanup import dead_code_elimination
from ..fusion.matmul_bias_act import FUSE_MATMUL_BIAS_ACT
from ..fusion.shared_matmul import RULES as SHARED_MATMUL_RULES
from ..targets import get_target
from .weights import quantize_weight

__all__ = ["quantize_dynamic", "QuantizeOptions", "QUANTIZE_DYNAMIC_MATMUL"]

KINDS = ("matmul", "fused_matmul_bias_act")


@dataclass(frozen=True)
class QuantizeOptions:
    """What the rule reads from its context: the op kinds to quantize, the smallest weight
    (elements) and whether scales are per column."""

    kinds: frozenset[str] = frozenset(KINDS)
    min_size: int = 0
    per_channel: bool = True


def _options(ctx) -> QuantizeOptions:
    opts = getattr(ctx, "options", None)
    return opts if isinstance(opts, QuantizeOptions) else QuantizeOptions()


_linear = (P.matmul(V("x"), V("w"), name="mm")
           | P.of(FusedMatMulBiasAct, V("x"), V("w"), V("b"), name="mm", has_bias=True)
           | P.of(FusedMatMulBiasAct, V("x"), V("w"), name="mm", has_bias=False))


def _stored(g: Graph, node) -> np.ndarray | None:
    """The value of a constant or of a param holding one, or None."""
    if isinstance(node.op, Constant):
        return np.asarray(node.op.value)
    if isinstance(node.op, Param) and node.op.name in g.weights:
        return np.asarray(g.weights[node.op.name])
    return None


def _transposed_source(m):
    """The node whose stored [N, K] value the matched weight transposes (`w.T`, as tied
    embeddings and [out, in] layouts are written), or None."""
    node = m.graph.nodes[m.values["w"].node]
    if isinstance(node.op, Transpose) and node.op.perm == (1, 0):
        src = m.graph.nodes[node.inputs[0].node]
        if _stored(m.graph, src) is not None:
            return src
    return None


def _weight(m) -> np.ndarray | None:
    """The stored value of the matched weight (of a transposed stored matrix too), or None."""
    value = _stored(m.graph, m.graph.nodes[m.values["w"].node])
    if value is not None:
        return value
    src = _transposed_source(m)
    return None if src is None else _stored(m.graph, src).T


def kind_chosen(m, ctx) -> Miss | None:
    """The node's kind is one of op_kinds ("matmul" takes the fused linear too)."""
    kinds = _options(ctx).kinds
    label = m.op("mm").label
    if label in kinds or "matmul" in kinds:
        return None
    return fail(MissReason.DISABLED, hint="add its kind to op_kinds to quantize it.",
                detail=f"op_kinds {sorted(kinds)} leaves out {label}")


def stored_weight(m, ctx) -> Miss | None:
    """The weight has a value now (a param with a stored or given value, or a constant)."""
    if _weight(m) is not None:
        return None
    node = m.graph.nodes[m.values["w"].node]
    if isinstance(node.op, Param):
        return fail(MissReason.WEIGHT_NOT_CONSTANT,
                    hint="give its value: bz.quantize_dynamic(g, params={name: array}), or "
                         "store it in the graph (g.param(..., value=...)).",
                    detail=f"param {node.op.name!r} has no stored value")
    return fail(MissReason.WEIGHT_NOT_CONSTANT,
                hint="only weights known now are quantized: a product of two values computed "
                     "when the graph runs (attention's q @ k^T and p @ v, say) stays float32.",
                detail=f"the right operand is {node.label}, computed when the graph runs")


def float32_matrix(m, ctx) -> Miss | None:
    """A float32 [K, N] weight (K small enough for int32 sums) and a float32 operand."""
    w, x = m.shape("w"), m.shape("x")
    if w.rank != 2:
        return fail(MissReason.SHAPE_MISMATCH, hint="only 2-D weights (linear layers) are "
                    "quantized; a batched matmul keeps its float weights.",
                    detail=f"weight {w} is not 2-D")
    if w.dtype != f32 or x.dtype != f32:
        return fail(MissReason.DTYPE_MISMATCH, hint="only float32 matmuls are quantized.",
                    detail=f"x {x}, weight {w}")
    if isinstance(w.dims[0], int) and w.dims[0] > MAX_K:
        return fail(MissReason.SHAPE_MISMATCH, detail=f"K = {w.dims[0]} > {MAX_K}: the int8 "
                    "sums could overflow int32")
    return None


def large_enough(m, ctx) -> Miss | None:
    """The weight has at least min_size elements."""
    w = m.shape("w")
    size, least = w.numel() or 0, _options(ctx).min_size
    if size >= least:
        return None
    return fail(MissReason.BELOW_MIN_SIZE, detail=f"weight {w}: {size} < min_size {least}")


def _stored_param(b, source: Graph, name: str, value: np.ndarray, dtype: DType):
    """Param `name` of `b` holding `value`: made once, shared by the matmuls of one weight.
    A name the input graph `source` already uses gets "_" appended until it is free, so an
    unrelated param of that name is never read as the int8 weight or its scales."""
    while _names_a_node(source, name):
        name += "_"
    if _names_a_node(b, name):
        return b.node_by_name(name).value
    return b.param(name, Shape(value.shape, dtype), value=value)


def _names_a_node(g: Graph, name: str) -> bool:
    try:
        g.node_by_name(name)
    except GraphError:
        return False
    return True


def quantized_weight(m, ctx) -> Miss | None:
    """The weight's values fit int8 with a scale (none is NaN or infinite; it is not empty),
    then quantizes it (kept for the replacement: Match.memo)."""
    w = _weight(m)
    if w.size == 0:
        return fail(MissReason.SHAPE_MISMATCH, detail=f"weight {m.shape('w')} is empty")
    if not np.isfinite(w).all():
        return fail(MissReason.DTYPE_MISMATCH, hint="int8 with a finite scale cannot hold NaN or "
                    "infinity; fix the weight, or leave it float32 (this matmul stays so).",
                    detail=f"weight {m.shape('w')} holds NaN or infinite values")
    opts = _options(ctx)
    m.memo("quantized", lambda: quantize_weight(w, opts.per_channel))
    m.memo("per_channel", lambda: opts.per_channel)
    return None


def _build(b, m):
    src = _transposed_source(m)
    w_node = m.graph.nodes[m.values["w"].node] if src is None else src
    base = w_node.op.name if isinstance(w_node.op, Param) else f"const{w_node.id}"
    base += "" if src is None else ".T"
    q, scale = m.memo("quantized", lambda: None)
    tag = "" if m.memo("per_channel", lambda: True) else ".tensor"
    wq = _stored_param(b, m.graph, f"{base}.int8{tag}", q, i8)
    ws = _stored_param(b, m.graph, f"{base}.scale{tag}", scale, f32)
    op = m.op("mm")
    fused = isinstance(op, FusedMatMulBiasAct)
    has_bias = fused and op.has_bias
    ins = (m.v("x"), wq, ws) + ((m.v("b"),) if has_bias else ())
    return b.add_node(DynamicQuantMatMul(op.act if fused else None, has_bias), ins)[0]


def _stored_matrix(g: Graph, v) -> str | None:
    """The name of the stored 2-D float32 weight `v` is (a param with a value or a constant),
    or None."""
    node = g.nodes[v.node]
    shape = g.shape_of(v)
    if shape.rank != 2 or shape.dtype != f32:
        return None
    if isinstance(node.op, Param) and node.op.name in g.weights:
        return node.op.name
    return f"a constant {shape}" if isinstance(node.op, Constant) else None


@dataclass
class ReportFusedLinearLayers:
    """Reports each fused node (other than the linear layer the rule takes) that reads a
    stored 2-D float32 weight: its matmuls stay float32, unseen by the rule, as they would
    silently."""

    name: str = "ReportFusedLinearLayers"

    def run(self, g: Graph, ctx) -> PassResult:
        misses = []
        for node in g.nodes:
            if not node.op.fused or isinstance(node.op, (FusedMatMulBiasAct,
                                                         DynamicQuantMatMul)):
                continue
            weights = [w for w in (_stored_matrix(g, v) for v in node.inputs) if w]
            if weights:
                misses.append(MissedFusion(
                    pattern=QUANTIZE_DYNAMIC_MATMUL.name, node=node.name or f"%{node.id}",
                    reason=MissReason.PATTERN_MISMATCH, context=node.describe(),
                    hint="quantize before bz.fuse / bz.compile fuse the graph (or quantize "
                         "bz.unfuse_fused_for_autodiff(g)): fused nodes keep float32 weights.",
                    detail=f"weights {', '.join(weights)} are inside a {node.op.kind}",
                    node_id=node.id))
        return PassResult(self.name, g, False, misses=misses)


QUANTIZE_DYNAMIC_MATMUL = Rule(
    "QuantizeDynamicMatMul",
    _build,
    pattern=_linear,
    checks=(kind_chosen, stored_weight, float32_matrix, large_enough, quantized_weight),
    produces="dynamic_quant_matmul",
)


def quantize_dynamic(graph: Graph, *, params: Mapping[str, np.ndarray] | None = None,
                     weight_dtype: DType = i8, per_channel: bool = True,
                     op_kinds: Iterable[str] = ("matmul",), min_size: int = 16384,
                     target="cpu"):
    """(graph, FusionReport): `graph` with its linear layers' weights quantized to int8 and
    their matmuls (with bias and activation) rewritten to DynamicQuantMatMul, which quantizes
    the activation per row when it runs (the CPU target runs braze's int8 VNNI GEMM; other
    targets decompose it into quantize / dequantize). `params` gives weight values (by param
    name) that the graph does not store; the new graph stores every value it needs from them,
    so it compiles without `params`. `op_kinds`: "matmul" (every matmul, fused linear layers
    included) and / or "fused_matmul_bias_act". Weights of fewer than `min_size` elements stay
    float32. The report's misses say which matmuls were left alone and why; `graph` is not
    changed."""
    if weight_dtype != i8:
        raise BrazeError(f"quantize_dynamic: weight_dtype {weight_dtype} is not supported; "
                         "weights are quantized to symmetric int8 (bz.i8)")
    kinds = frozenset([op_kinds] if isinstance(op_kinds, str) else op_kinds)
    if not kinds or not kinds <= set(KINDS):
        raise BrazeError(f"quantize_dynamic: op_kinds {sorted(kinds)} must be some of {KINDS}")
    given = dict(params or {})
    names = {p.op.name for p in graph.params}
    unknown = sorted(set(given) - names)
    if unknown:
        raise GraphError(f"quantize_dynamic: {unknown} are not params of graph "
                         f"{graph.name!r}")
    work = graph.detached_copy()   # the given values stored: the new graph keeps them
    for name, value in given.items():
        work.set_weight(name, value)
    ctx = RewriteContext(target=get_target(target),
                         options=QuantizeOptions(kinds, int(min_size), per_channel))
    passes = [RulePass("FuseSharedInputMatMul", SHARED_MATMUL_RULES),
              RulePass("FuseMatMulBiasAct", (FUSE_MATMUL_BIAS_ACT,)),
              RulePass("QuantizeDynamicMatMul", (QUANTIZE_DYNAMIC_MATMUL,)),
              FunctionPass("dce", dead_code_elimination), ReportFusedLinearLayers()]
    out, results = run_passes(work, passes, ctx)
    from ...report import FusionReport

    return out, FusionReport.analyze(graph, out, results, target=ctx.target.name)
