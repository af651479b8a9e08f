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
(and any activation) into the matmul."""
from __future__ import annotations

import numpy as np

from ...ir.ops.io import Param
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
        allowed = ((c,), ()) if s == "cb" else ((c,),)  # a bias may be one scalar
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
RULES = (FOLD_MATMUL_BN,)
