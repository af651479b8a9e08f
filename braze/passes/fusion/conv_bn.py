"""FoldConvBatchNorm: batch_norm(conv2d(x, w[, b]), gamma, beta, mean, var) -> conv2d(x, w', b')
with scale = gamma / sqrt(var + eps), w' = w * scale[:, None, None, None] and
b' = (b - mean) * scale + beta (b = 0 without a conv bias).

When w, b, gamma, beta, mean and var all have known values (params with stored weights, or
constants), w' and b' are computed once with NumPy (in float64, then cast) into new params whose
values the new graph stores. Otherwise the same arithmetic is emitted as graph ops on [O]
vectors; later constant folding may evaluate it. Run it before FuseConvBiasAct, so the folded
conv (now with a bias) fuses with its activation."""
from __future__ import annotations

import numpy as np

from ...ir.ops.io import Constant, Param
from ...ir.ops.norm import BatchNorm
from ...rewrite import Miss, MissReason, P, Rule, V, fail
from .checks import same_dtype, target_claims

_STATS = ("gamma", "beta", "mean", "var")
_conv = P.conv2d(V("x"), V("w"), name="conv") | P.conv2d(V("x"), V("w"), V("cb"), name="conv")
_bn = P.of(BatchNorm, _conv, *(V(s) for s in _STATS), name="bn")   # bn(conv(x, w[, cb]))


def stats_are_per_channel(m, ctx) -> Miss | None:
    """The norm's vectors have one value per conv output channel, i.e. rows of w."""
    channels = m.shape("w").dims[0]
    for s in _STATS:
        if m.shape(s).dims != (channels,):
            return fail(MissReason.SHAPE_MISMATCH,
                        detail=f"batch_norm {s} has dims {m.shape(s).dims}, conv has "
                               f"{channels} output channels")
    return None


def float_conv(m, ctx) -> Miss | None:
    """Folding rescales weights; only float convs can take that."""
    if not m.shape("conv").dtype.is_float:
        return fail(MissReason.DTYPE_MISMATCH, detail=f"conv output is {m.shape('conv')}")
    return None


def _known(m, name: str) -> np.ndarray | None:
    """The stored value of captured value `name` (a param with weights, or a constant)."""
    g = m.graph
    op = g.nodes[m.values[name].node].op
    if isinstance(op, Constant):
        return op.value
    if isinstance(op, Param):
        return g.weights.get(op.name)
    return None


def fold_arrays(w, cb, gamma, beta, mean, var, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(w', b') of a conv followed by an inference batch norm, in float64."""
    scale = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    b = np.zeros_like(scale) if cb is None else cb.astype(np.float64)
    return (w.astype(np.float64) * scale[:, None, None, None],
            (b - mean.astype(np.float64)) * scale + beta.astype(np.float64))


def _stem(m) -> str:
    """Name stem for folded params: the conv weight's name without ".weight" ("conv1")."""
    w = m.graph.nodes[m.values["w"].node]
    name = w.op.name if isinstance(w.op, Param) else (m.node("conv").name or "conv")
    return name.removesuffix(".weight")


def _fresh_name(b, old, base: str) -> str:
    name, k = base, 1
    while name in old._names or name in b._names:
        name, k = f"{base}_{k}", k + 1
    return name


def _build(b, m):
    conv, eps = m.op("conv"), m.op("bn").eps
    names = ("w", "cb", *_STATS) if "cb" in m.values else ("w", *_STATS)
    known = {n: _known(m, n) for n in names}
    if all(v is not None for v in known.values()):
        w2, b2 = fold_arrays(known["w"], known.get("cb"), *(known[s] for s in _STATS), eps)
        stem = _stem(m)
        dt = m.shape("w").dtype
        w = b.param(_fresh_name(b, m.graph, f"{stem}.folded_weight"), m.shape("w"),
                    w2.astype(dt.np))
        bias = b.param(_fresh_name(b, m.graph, f"{stem}.folded_bias"), m.shape("gamma"),
                       b2.astype(dt.np))
    else:
        channels = m.shape("w").dims[0]
        scale = b.mul(m.v("gamma"), b.rsqrt(b.add(m.v("var"), eps)))
        w = b.mul(m.v("w"), b.reshape(scale, (channels, 1, 1, 1)))
        shifted = b.sub(m.v("cb"), m.v("mean")) if "cb" in m.values else b.neg(m.v("mean"))
        bias = b.add(b.mul(shifted, scale), m.v("beta"))
    return b.conv2d(m.v("x"), w, bias, conv.stride, conv.padding, conv.dilation, conv.groups)


FOLD_CONV_BN = Rule(
    "FoldConvBatchNorm",
    _build,
    pattern=_bn,
    checks=(target_claims("conv_bn_fold"), float_conv, stats_are_per_channel,
            same_dtype("w", *_STATS)),
    produces="conv_bn_fold",
)
RULES = (FOLD_CONV_BN,)
