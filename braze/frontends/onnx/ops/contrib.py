"""ONNX Runtime contrib ops (domain com.microsoft, plus SimplifiedLayerNormalization, which ORT
registers in the default domain) that ORT's optimizers and braze's own exporter write: norms
with a residual, GELU forms, fused matmul / gemm / conv epilogues. (Ops ORT runs only on GPUs,
such as BiasSoftmax and BiasAdd, are not imported.)

Each maps onto the braze kind with exactly its meaning (SkipLayerNormalization ->
fused_residual_ln, SkipSimplifiedLayerNormalization -> fused_residual_rms_norm) or onto logical
ops that the fusions recombine (BiasGelu -> add + gelu, FusedConv -> conv + activation). ORT's
attention-family ops are in contrib_attention.py. Optional training outputs (mean, inv_std_var)
are computed when a model names them."""
from __future__ import annotations

from dataclasses import replace

from ....ir.ops.elementwise import UnaryFn
from ....ir.ops.reduce import ReduceFn
from ..context import ImportContext, NodeView, converter
from .linalg import gemm, transposed_weight
from .nn import conv

MS = "com.microsoft"
QUICK_GELU_ALPHA = 1.702


def contrib(*op_types: str):
    """Register a converter for com.microsoft op types."""
    return converter(*(f"{MS}::{t}" for t in op_types))


def wants(node: NodeView, i: int) -> bool:
    """Whether the model names output `i` (an optional output it may read)."""
    return i < len(node.outputs) and node.outputs[i] != ""


# -- norms ------------------------------------------------------------------------------------
def _norm_stats(ctx: ImportContext, s, eps: float, rms: bool, axis: int = -1):
    """(mean, inv_std_var) of `s` over the trailing axes from `axis`, kept as size-1 axes:
    ORT's optional training outputs (RMS norms have no mean: None)."""
    g = ctx.g
    rank = len(ctx.dims(s))
    axes = tuple(range(axis % rank, rank))
    if rms:
        mean, centered = None, s
    else:
        mean = g.reduce(s, ReduceFn.MEAN, axes, keepdims=True)
        centered = g.sub(s, mean)
    var = g.reduce(g.mul(centered, centered), ReduceFn.MEAN, axes, keepdims=True)
    return mean, g.rsqrt(g.add(var, ctx.const_like(eps, s)))


def _skip_norm(ctx: ImportContext, node: NodeView, rms: bool):
    """SkipLayerNormalization (input, skip, gamma, beta, bias) and its RMS form (input, skip,
    gamma, bias): norm(input + skip + bias); outputs (y, mean, inv_std_var, sum)."""
    g = ctx.g
    x, skip = ctx.value(node, 0), ctx.value(node, 1)
    gamma = ctx.value(node, 2)
    beta = None if rms else ctx.opt_value(node, 3)
    bias = ctx.opt_value(node, 3 if rms else 4)
    eps = float(node.attr("epsilon", 1e-12))
    if bias is not None:
        x = g.add(x, bias)
    fused = g.fused_residual_rms_norm if rms else g.fused_residual_ln
    y, s = fused(x, skip, gamma, beta, eps=eps, expose_sum=True)
    mean = inv_std = None
    if wants(node, 1) or wants(node, 2):
        mean, inv_std = _norm_stats(ctx, s, eps, rms)
    return [y, mean, inv_std, s]


@contrib("SkipLayerNormalization")
def skip_layer_norm(ctx, node):
    return _skip_norm(ctx, node, rms=False)


@contrib("SkipSimplifiedLayerNormalization")
def skip_simplified_layer_norm(ctx, node):
    return _skip_norm(ctx, node, rms=True)


@converter("SimplifiedLayerNormalization")
def simplified_layer_norm(ctx, node):
    """RMSNorm over the axes from `axis` with a scale (ORT's default-domain contrib op)."""
    x, scale = ctx.value(node, 0), ctx.value(node, 1)
    eps, axis = float(node.attr("epsilon", 1e-5)), int(node.attr("axis", -1))
    rank = len(ctx.dims(x))
    if not -rank <= axis < rank:
        raise ctx.fail(node, f"axis {axis} is out of range for rank {rank}")
    tail = tuple(ctx.dims(x)[axis % rank:])
    if tuple(ctx.dims(scale)) != tail:
        if [d for d in ctx.dims(scale) if d != 1] != [d for d in tail if d != 1]:
            raise ctx.fail(node, f"scale {ctx.dims(scale)} does not match the normalized dims "
                                 f"{tail}")
        scale = ctx.g.reshape(scale, tail)
    y = ctx.g.rms_norm(x, scale, eps=eps, axis=axis)
    inv_std = _norm_stats(ctx, x, eps, True, axis)[1] if wants(node, 1) else None
    return [y, inv_std]


# -- activations --------------------------------------------------------------------------------
@contrib("Gelu")
def gelu(ctx, node):
    return [ctx.g.gelu(ctx.value(node, 0))]


@contrib("BiasGelu")
def bias_gelu(ctx, node):
    g = ctx.g
    return [g.gelu(g.add(ctx.value(node, 0), ctx.value(node, 1)))]


@contrib("FastGelu")
def fast_gelu(ctx, node):
    """GELU's tanh form (ORT's 0.797885 / 0.035677 constants are sqrt(2/pi) and
    0.044715 * sqrt(2/pi)), with an optional bias added first."""
    g = ctx.g
    x = ctx.value(node, 0)
    if ctx.has(node, 1):
        x = g.add(x, ctx.value(node, 1))
    return [g.activation(x, UnaryFn.GELU_APPROX)]


@contrib("QuickGelu")
def quick_gelu(ctx, node):
    """x * sigmoid(alpha * x): CLIP's quick_gelu at alpha 1.702, SiLU at 1 (ORT fuses SiLU
    into QuickGelu), primitives otherwise."""
    g = ctx.g
    x = ctx.value(node, 0)
    alpha = float(node.attr("alpha", QUICK_GELU_ALPHA))
    if alpha == 1.0:
        return [g.silu(x)]
    if abs(alpha - QUICK_GELU_ALPHA) < 1e-6:
        return [g.activation(x, UnaryFn.QUICK_GELU)]
    return [g.mul(x, g.activation(g.mul(x, ctx.const_like(alpha, x)), UnaryFn.SIGMOID))]


def fused_activation(ctx: ImportContext, node: NodeView, y, name: str | None, params):
    """Apply the activation a FusedConv / FusedGemm names (ORT's MLAS activation set)."""
    g = ctx.g
    params = list(params or [])
    if not name:
        return y
    simple = {"Relu": UnaryFn.RELU, "Tanh": UnaryFn.TANH, "Sigmoid": UnaryFn.SIGMOID}
    if name in simple:
        return g.activation(y, simple[name])
    if name == "LeakyRelu":
        return g.leaky_relu(y, params[0] if params else 0.01)
    if name == "Clip" and len(params) == 2:
        return g.clamp(y, float(params[0]), float(params[1]))
    if name == "HardSigmoid":
        alpha, beta = (params + [0.2, 0.5][len(params):])[:2]
        h = g.add(g.mul(y, ctx.const_like(alpha, y)), ctx.const_like(beta, y))
        return g.clamp(h, 0.0, 1.0)
    raise ctx.fail(node, f"activation {name!r} with parameters {params} is not supported "
                         "(Relu, Tanh, Sigmoid, LeakyRelu, Clip(min, max), HardSigmoid are)")


# -- matmul / gemm / conv -----------------------------------------------------------------------
def _swap_last(ctx: ImportContext, v):
    rank = len(ctx.dims(v))
    if rank < 2:
        raise ValueError(f"a transposed operand needs rank >= 2, got {ctx.dims(v)}")
    if rank == 2:
        return transposed_weight(ctx, v)
    perm = tuple(range(rank - 2)) + (rank - 1, rank - 2)
    return ctx.g.transpose(v, perm)


@contrib("FusedMatMul")
def fused_matmul(ctx, node):
    """alpha * (A' @ B') with A', B' optionally transposed on their last two axes."""
    if node.attr("transBatchA", 0) or node.attr("transBatchB", 0):
        raise ctx.fail(node, "FusedMatMul with transBatchA / transBatchB is not supported")
    g = ctx.g
    a, b = ctx.value(node, 0), ctx.value(node, 1)
    if node.attr("transA", 0):
        a = _swap_last(ctx, a)
    if node.attr("transB", 0):
        b = _swap_last(ctx, b)
    y = g.matmul(a, b)
    alpha = float(node.attr("alpha", 1.0))
    return [y if alpha == 1.0 else g.mul(y, ctx.const_like(alpha, y))]


@contrib("FusedGemm")
def fused_gemm(ctx, node):
    attrs = {k: v for k, v in node.attrs.items() if not k.startswith("activation")}
    y = gemm(ctx, replace(node, op_type="Gemm", attrs=attrs, domain=""))[0]
    params = [node.attrs[k] for k in ("activation_alpha", "activation_beta", "activation_gamma")
              if k in node.attrs]
    return [fused_activation(ctx, node, y, node.attr("activation"), params)]


@contrib("FusedConv")
def fused_conv(ctx, node):
    """act(conv(X, W, B) + Z): ORT adds the optional Z (a residual) before the activation."""
    g = ctx.g
    attrs = {k: v for k, v in node.attrs.items() if not k.startswith("activation")}
    y = conv(ctx, replace(node, op_type="Conv", inputs=node.inputs[:3], attrs=attrs,
                          domain=""))[0]
    if ctx.has(node, 3):
        y = g.add(y, ctx.value(node, 3))
    return [fused_activation(ctx, node, y, node.attr("activation"),
                             node.attr("activation_params"))]
