"""FoldMatMulBatchNorm: an inference batch norm after a linear layer moves into the layer's
weight and bias, as FoldConvBatchNorm does for convolutions.

    batch_norm(matmul(x, w) [+ cb], gamma, beta, mean, var)            x: [N, in], w: [in, C]
    batch_norm(reshape(matmul(x, w) [+ cb]) -> [N, C], ...)            x: [..., in] (LeViT's
                                                                        Linear + BatchNorm1d
                                                                        over flattened tokens)
    -> [reshape](matmul(x, w') + b')

with scale = gamma / sqrt(var + eps), w' = w * scale (per output column) and
b' = (cb - mean) * scale + beta. The batch norm normalizes axis 1 of its [N, C] input, which is
the matmul's last (output) axis; a reshape in between may only merge leading axes. With stored
values w' and b' are computed once with NumPy (float64, then cast) into new params; otherwise
the arithmetic is emitted as graph ops on [C] vectors. FuseMatMulBiasAct then fuses the bias
(and any activation) into the matmul.

FoldMatMulScale: a known per-column (or scalar) scale after a linear layer, ConvNeXt's and
DINOv2's LayerScale (`gamma * (x @ w + cb)`), moves into the weight and bias the same way:
matmul(x, w) [+ cb] times s -> matmul(x, w * s) [+ cb * s]. The scale must be fixed in the
graph (a constant, a param, or computed from them alone) and vary along the output (last)
axis only, and w must be a weight (not computed from the graph's inputs, where the scale
would become per-call work on a larger operand). Stored values fold with NumPy into new
params; otherwise the products are graph ops on weights alone (weight preparation, hoisted
out of the run), as FoldMatMulBatchNorm's are."""
from __future__ import annotations

import numpy as np

from ...ir.ops.io import Input, Param
from ...ir.ops.norm import BatchNorm
from ...rewrite import Miss, MissReason, P, Rule, V, fail
from .checks import same_dtype, target_claims
from .conv_bn import _fresh_name, stored_value

_STATS = ("gamma", "beta", "mean", "var")

_mm = P.of("matmul", V("x"), V("w"), name="mm")
_linear = _mm | P.add(_mm, V("cb"), name="bias_add")
_bn = P.of(BatchNorm, _linear | P.of("reshape", _linear, name="flat"), *(V(s) for s in _STATS),
           name="bn")


def _channels(m) -> int | str:
    return m.shape("mm").dims[-1]


def column_weight(m, ctx) -> Miss | None:
    """A 2-D float weight [in, C] whose output columns are the batch norm's channels."""
    w = m.shape("w")
    if w.rank != 2 or not w.dtype.is_float:
        return fail(MissReason.SHAPE_MISMATCH,
                    detail=f"the matmul's weight is {w}; folding needs a 2-D float [in, out]")
    return None


def channels_are_the_output_axis(m, ctx) -> Miss | None:
    """The batch norm's channel axis (1 of its [N, C] input) is the matmul's output axis."""
    normed = m.shape("flat") if "flat" in m.nodes else m.shape("mm")
    c = _channels(m)
    if normed.rank != 2 or normed.dims[1] != c:
        return fail(MissReason.SHAPE_MISMATCH,
                    detail=f"batch_norm input {normed.dims} does not normalize the matmul's "
                           f"output axis ({c} channels last)")
    for s in _STATS + (("cb",) if "cb" in m.values else ()):
        allowed = ((c,), (1,), ()) if s == "cb" else ((c,),)  # a bias may be one value
        if m.shape(s).dims not in allowed:
            return fail(MissReason.SHAPE_MISMATCH,
                        detail=f"{s} has dims {m.shape(s).dims}, not one value per output "
                               f"column ({c})")
    return None


def _known(m, name: str):
    return stored_value(m.graph, m.values[name])


def _build(b, m):
    eps, c = m.op("bn").eps, _channels(m)
    names = ("w", *_STATS) + (("cb",) if "cb" in m.values else ())
    known = {n: _known(m, n) for n in names}
    dt = m.shape("w").dtype
    if all(v is not None for v in known.values()):
        scale = known["gamma"].astype(np.float64) / np.sqrt(known["var"].astype(np.float64)
                                                            + eps)
        cb = np.broadcast_to(np.asarray(known.get("cb", 0.0), np.float64), scale.shape)
        w2 = known["w"].astype(np.float64) * scale[None, :]
        b2 = (cb - known["mean"]) * scale + known["beta"]
        w_op = m.graph.nodes[m.values["w"].node].op
        stem = w_op.name if isinstance(w_op, Param) else "linear"
        w = b.param(_fresh_name(b, m.graph, f"{stem}.folded_bn_weight"), m.shape("w"),
                    w2.astype(dt.np))
        bias = b.param(_fresh_name(b, m.graph, f"{stem}.folded_bn_bias"),
                       m.shape("w").with_dims((c,)), b2.astype(dt.np))
    else:
        scale = b.mul(m.v("gamma"), b.rsqrt(b.add(m.v("var"), eps)))
        w = b.mul(m.v("w"), b.reshape(scale, (1, c)))
        shifted = b.neg(m.v("mean"))
        if "cb" in m.values:
            shifted = b.add(shifted, m.v("cb"))
        bias = b.add(b.mul(shifted, scale), m.v("beta"))
    out = b.add(b.matmul(m.v("x"), w), bias)
    return b.reshape(out, m.shape("flat").dims) if "flat" in m.nodes else out


FOLD_MATMUL_BN = Rule(
    "FoldMatMulBatchNorm",
    _build,
    pattern=_bn,
    checks=(target_claims("conv_bn_fold"), column_weight, channels_are_the_output_axis,
            same_dtype("w", *_STATS)),
    produces="conv_bn_fold",
)


# -- FoldMatMulScale ----------------------------------------------------------------------------
def _fixed_float(g, v) -> bool:
    """A float value fixed in the graph: stored, or computed from params and constants alone
    (its axes are checked after matching)."""
    return g.shape_of(v).dtype.is_float and (stored_value(g, v) is not None or
                                             _from_weights(g, v))


_scaled = P.mul(_linear, V("s", where=_fixed_float), name="scale")


def scale_is_per_column(m, ctx) -> Miss | None:
    """The scale holds one value per output column (or one in total) and adds no axes; a
    bias is a [C] vector or a single value ([1] or a scalar)."""
    c = _channels(m)
    dims = m.shape("s").dims
    if any(d != 1 for d in dims[:-1]):
        return fail(MissReason.SHAPE_MISMATCH,
                    detail=f"the scale has dims {dims}: it varies along an axis other than "
                           "the output columns")
    if dims and dims[-1] not in (1, c):
        return fail(MissReason.SHAPE_MISMATCH,
                    detail=f"the scale has dims {dims}, not one value per output column ({c})")
    if m.shape("s").rank > m.shape("mm").rank:
        return fail(MissReason.SHAPE_MISMATCH,
                    detail=f"the scale {dims} has more axes than the linear output "
                           f"{m.shape('mm').dims}: it would broadcast the result")
    if "cb" in m.values and m.shape("cb").dims not in ((c,), (1,), ()):
        return fail(MissReason.SHAPE_MISMATCH,
                    detail=f"the bias has dims {m.shape('cb').dims}, not [{c}]")
    return None


def _from_weights(g, v, depth: int = 6) -> bool:
    """`v` is computed from params and constants alone (no graph input within `depth` ops):
    scaling it is weight preparation, hoisted out of the run."""
    node = g.nodes[v.node]
    if node.op.source:
        return not isinstance(node.op, Input)
    return depth > 0 and all(_from_weights(g, u, depth - 1) for u in node.inputs)


def weight_is_prepared_once(m, ctx) -> Miss | None:
    """The matmul's right operand is a weight (stored, or computed from params alone): a
    product with an activation would move the scale onto per-call work."""
    if _known(m, "w") is None and not _from_weights(m.graph, m.values["w"]):
        return fail(MissReason.WEIGHT_NOT_CONSTANT,
                    hint="the scale folds into the matmul's weight only when that weight is a "
                         "param or constant (or computed from them alone); declare w with "
                         "g.param to fold it, or keep the multiply (a product of two "
                         "activations, such as q @ k^T, has no weight to fold into).",
                    detail="the matmul's right operand is computed from the graph's inputs; "
                           "the scale stays on the product")
    return None


def _build_scale(b, m):
    if _known(m, "s") is None:
        return _build_scale_ops(b, m)
    c = _channels(m)
    s = np.broadcast_to(np.asarray(_known(m, "s"), np.float64).reshape(-1), (c,))
    dt = m.shape("w").dtype
    w_known = _known(m, "w")
    w_op = m.graph.nodes[m.values["w"].node].op
    stem = w_op.name if isinstance(w_op, Param) else "linear"
    if w_known is not None:
        w = b.param(_fresh_name(b, m.graph, f"{stem}.folded_scale_weight"), m.shape("w"),
                    (w_known.astype(np.float64) * s[None, :]).astype(dt.np))
    else:  # a weight computed from params: scaled by graph ops (hoisted as weight prep)
        w = b.mul(m.v("w"), b.constant(s.reshape(1, c).astype(dt.np)))
    out = b.matmul(m.v("x"), w)
    if "cb" not in m.values:
        return out
    cb_known = _known(m, "cb")
    if cb_known is not None:
        cb = np.broadcast_to(np.asarray(cb_known, np.float64), (c,)) * s
        bias = b.param(_fresh_name(b, m.graph, f"{stem}.folded_scale_bias"),
                       m.shape("w").with_dims((c,)), cb.astype(dt.np))
    else:
        bias = b.mul(m.v("cb"), b.constant(s.astype(dt.np)))
    return b.add(out, bias)


def _build_scale_ops(b, m):
    """A scale without a stored value (a param fed at run time): w * s and cb * s as graph ops
    on weights alone, which the executor computes once as weight preparation."""
    dims = m.shape("s").dims
    cols = dims[-1] if dims else 1
    out = b.matmul(m.v("x"), b.mul(m.v("w"), b.reshape(m.v("s"), (1, cols))))
    if "cb" not in m.values:
        return out
    return b.add(out, b.mul(m.v("cb"), b.reshape(m.v("s"), (cols,))))


FOLD_MATMUL_SCALE = Rule(
    "FoldMatMulScale",
    _build_scale,
    pattern=_scaled,
    # the weight test first: a product of two activations (attention's q @ k^T times its
    # scale) has no weight to fold into, and its miss says so, not that a "weight" is not 2-D
    checks=(target_claims("conv_bn_fold"), weight_is_prepared_once, column_weight,
            scale_is_per_column, same_dtype("mm", "s")),
    produces="conv_bn_fold",
)
RULES = (FOLD_MATMUL_BN, FOLD_MATMUL_SCALE)
