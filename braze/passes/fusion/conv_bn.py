"""Conv weight folds: what follows a convolution (conv2d or conv_transpose2d) linearly and per
output channel moves into the conv's weights and bias.

FoldConvBatchNorm: batch_norm(conv(x, w[, cb]) [+ ab], gamma, beta, mean, var) -> conv(x, w', b')
with scale = gamma / sqrt(var + eps), w' = w scaled per output channel and
b' = (cb + ab - mean) * scale + beta (cb, ab = 0 when absent; ab is a per-channel or scalar
bias add between the two, as ConvTranspose + Add + BatchNormalization exports write it).

FoldConvAffine: conv(x, w[, cb]) * s [+ t] with s, t constants (known values) that are scalars
or per-channel -> conv(x, w * s, cb * s + t). PP-OCRv4's "learnable affine blocks" write every
conv this way, and so does HardSigmoid(conv) once imported (alpha * conv + beta, then a clamp).
A bias t without a scale folds into a conv_transpose2d (which has no fused kind); after a conv2d
it is FuseConvBiasAct's.

A conv weight's output channel is axis 0 for conv2d ([O, C/g, kh, kw]) and, per group, axis 1
for conv_transpose2d ([C, O/g, kh, kw]). When every folded tensor has a known value (params with
stored weights, or constants), w' and b' are computed once with NumPy (in float64, then cast)
into new params; otherwise the batch-norm arithmetic is emitted as graph ops on [O] vectors.
Run these before FuseConvBiasAct, so the folded conv (now with a bias) fuses with its
activation."""
from __future__ import annotations

import numpy as np

from ...ir.ops.conv import Conv2d, ConvTranspose2d
from ...ir.ops.io import Constant, Param
from ...ir.ops.norm import BatchNorm
from ...rewrite import Miss, MissReason, P, Rule, V, fail
from .checks import same_dtype, target_claims

_STATS = ("gamma", "beta", "mean", "var")


def _conv(kind: str):
    return P.of(kind, V("x"), V("w"), name="conv") | P.of(kind, V("x"), V("w"), V("cb"),
                                                          name="conv")


_any_conv = _conv("conv2d") | _conv("conv_transpose2d")
_biased = P.add(_any_conv, V("ab"), name="bias_add")                 # conv(x, w) + ab
_bn = P.of(BatchNorm, _any_conv | _biased, *(V(s) for s in _STATS), name="bn")


# -- reading values -----------------------------------------------------------------------------
def stored_value(g, v) -> np.ndarray | None:
    """The value of `v` when fixed in the graph: a constant, or a param with a stored weight."""
    op = g.nodes[v.node].op
    if isinstance(op, Constant):
        return np.asarray(op.value)
    if isinstance(op, Param):
        return g.weights.get(op.name)
    return None


def _known(m, name: str) -> np.ndarray | None:
    return stored_value(m.graph, m.values[name])


def out_channels(m) -> int:
    """Output channels of the captured conv."""
    return m.node("conv").outputs[0].dims[1]


def channel_vector_dims(dims: tuple, channels: int) -> bool:
    """`dims` holds one value per channel ([C], [C, 1, 1], [1, C, 1, 1]) or one in total
    ([], [1], [1, 1, 1], [1, 1, 1, 1]), broadcasting over an NCHW conv output."""
    return dims in ((), (1,), (1, 1, 1), (1, 1, 1, 1), (channels, 1, 1), (1, channels, 1, 1))


def _as_channels(a: np.ndarray | None, channels: int) -> np.ndarray:
    """A per-channel or scalar array as a float64 [C] vector (0 for None)."""
    if a is None:
        return np.zeros(channels)
    return np.broadcast_to(np.asarray(a, np.float64).reshape(-1), (channels,)).copy()


def scale_weight(op, w: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """`w` with output channel o multiplied by scale[o] (conv2d or conv_transpose2d layout)."""
    w = w.astype(np.float64)
    if isinstance(op, Conv2d):
        return w * scale[:, None, None, None]
    c, og = w.shape[:2]
    g = op.groups
    grouped = w.reshape(g, c // g, og, *w.shape[2:]) * scale.reshape(g, 1, og, 1, 1)
    return grouped.reshape(w.shape)


def _scale_weight_ops(b, op, w, scale, w_dims):
    """Graph ops for `scale_weight` when the values are not known."""
    if isinstance(op, Conv2d):
        return b.mul(w, b.reshape(scale, (w_dims[0], 1, 1, 1)))
    c, og, kh, kw = w_dims
    g = op.groups
    grouped = b.reshape(w, (g, c // g, og, kh, kw))
    scaled = b.mul(grouped, b.reshape(scale, (g, 1, og, 1, 1)))
    return b.reshape(scaled, w_dims)


def _rebuild_conv(b, m, w, bias):
    conv = m.op("conv")
    if isinstance(conv, ConvTranspose2d):
        return b.conv_transpose2d(m.v("x"), w, bias, conv.stride, conv.padding,
                                  conv.output_padding, conv.dilation, conv.groups)
    return b.conv2d(m.v("x"), w, bias, conv.stride, conv.padding, conv.dilation, conv.groups)


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


def _folded_params(b, m, w2: np.ndarray, b2: np.ndarray):
    stem, dt = _stem(m), m.shape("w").dtype
    w = b.param(_fresh_name(b, m.graph, f"{stem}.folded_weight"), m.shape("w"),
                w2.astype(dt.np))
    bias = b.param(_fresh_name(b, m.graph, f"{stem}.folded_bias"),
                   m.shape("w").with_dims((len(b2),)), b2.astype(dt.np))
    return w, bias


# -- checks -------------------------------------------------------------------------------------
def stats_are_per_channel(m, ctx) -> Miss | None:
    """The norm's vectors have one value per conv output channel."""
    channels = out_channels(m)
    for s in _STATS:
        if m.shape(s).dims != (channels,):
            return fail(MissReason.SHAPE_MISMATCH,
                        detail=f"batch_norm {s} has dims {m.shape(s).dims}, conv has "
                               f"{channels} output channels")
    return None


def bias_add_is_per_channel(m, ctx) -> Miss | None:
    """A bias added between conv and norm holds one value per channel (or one in total)."""
    if "ab" in m.values and not channel_vector_dims(m.shape("ab").dims, out_channels(m)):
        return fail(MissReason.SHAPE_MISMATCH,
                    detail=f"the operand added before the batch_norm has dims "
                           f"{m.shape('ab').dims}, not one value per channel")
    return None


def float_conv(m, ctx) -> Miss | None:
    """Folding rescales weights; only float convs can take that."""
    if not m.shape("conv").dtype.is_float:
        return fail(MissReason.DTYPE_MISMATCH, detail=f"conv output is {m.shape('conv')}")
    return None


# -- FoldConvBatchNorm --------------------------------------------------------------------------
def fold_arrays(w, cb, gamma, beta, mean, var, eps: float, conv=None
                ) -> tuple[np.ndarray, np.ndarray]:
    """(w', b') of a conv (default conv2d layout) followed by an inference batch norm, in
    float64; `cb` is the conv's (and any added) bias or None."""
    scale = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    b = np.zeros_like(scale) if cb is None else np.asarray(cb, np.float64)
    w2 = scale_weight(conv or Conv2d(), w, scale)
    return w2, (b - mean.astype(np.float64)) * scale + beta.astype(np.float64)


def _build_bn(b, m):
    conv, eps, channels = m.op("conv"), m.op("bn").eps, out_channels(m)
    names = ("w", *_STATS) + tuple(n for n in ("cb", "ab") if n in m.values)
    known = {n: _known(m, n) for n in names}
    if all(v is not None for v in known.values()):
        bias = None
        if "cb" in known or "ab" in known:
            bias = _as_channels(known.get("cb"), channels) + _as_channels(known.get("ab"),
                                                                          channels)
        w2, b2 = fold_arrays(known["w"], bias, *(known[s] for s in _STATS), eps, conv)
        w, bias = _folded_params(b, m, w2, b2)
    else:
        scale = b.mul(m.v("gamma"), b.rsqrt(b.add(m.v("var"), eps)))
        w = _scale_weight_ops(b, conv, m.v("w"), scale, m.shape("w").dims)
        shifted = b.neg(m.v("mean"))
        if "cb" in m.values:
            shifted = b.add(shifted, m.v("cb"))
        if "ab" in m.values:
            ab = m.v("ab")
            if m.shape("ab").rank != 1:
                ab = b.reshape(ab, (-1,))
            shifted = b.add(shifted, ab)
        bias = b.add(b.mul(shifted, scale), m.v("beta"))
    return _rebuild_conv(b, m, w, bias)


FOLD_CONV_BN = Rule(
    "FoldConvBatchNorm",
    _build_bn,
    pattern=_bn,
    checks=(target_claims("conv_bn_fold"), float_conv, stats_are_per_channel,
            bias_add_is_per_channel, same_dtype("w", *_STATS)),
    produces="conv_bn_fold",
)


# -- FoldConvAffine -----------------------------------------------------------------------------
def _fixed_channel_vector(g, v) -> bool:
    """`v` is a known float scalar or per-channel vector (channels checked after matching)."""
    s = g.shape_of(v)
    return s.dtype.is_float and s.rank <= 4 and stored_value(g, v) is not None and \
        all(d == 1 for i, d in enumerate(s.dims) if i != s.rank - 3)


_scaled = P.mul(_any_conv, V("s", where=_fixed_channel_vector), name="scale")  # conv * s
_affine = (P.add(_scaled, V("t", where=_fixed_channel_vector), name="shift")  # conv * s + t
           | _scaled
           | P.add(_conv("conv_transpose2d"), V("t", where=_fixed_channel_vector),
                   name="shift"))                                              # convT + t


def affine_is_per_channel(m, ctx) -> Miss | None:
    """Scale and shift hold one value per conv output channel (or one in total)."""
    channels = out_channels(m)
    for name in ("s", "t"):
        if name in m.values and not channel_vector_dims(m.shape(name).dims, channels):
            return fail(MissReason.SHAPE_MISMATCH,
                        detail=f"{name} has dims {m.shape(name).dims}, not one value per "
                               f"channel of the conv's {channels}")
    return None


def _build_affine(b, m):
    channels = out_channels(m)
    scale = _as_channels(_known(m, "s"), channels) if "s" in m.values else None
    shift = _as_channels(_known(m, "t"), channels) if "t" in m.values else np.zeros(channels)
    w, cb = _known(m, "w"), (_known(m, "cb") if "cb" in m.values else None)
    ones = np.ones(channels)
    if w is not None and ("cb" not in m.values or cb is not None):
        s = ones if scale is None else scale
        b2 = _as_channels(cb, channels) * s + shift
        w_new, bias = _folded_params(b, m, scale_weight(m.op("conv"), w, s), b2)
        return _rebuild_conv(b, m, w_new, bias)
    # a weight or conv bias computed at run time: the same arithmetic as graph ops
    dt = m.shape("conv").dtype.np
    w_new = m.v("w")
    if scale is not None:
        w_new = _scale_weight_ops(b, m.op("conv"), w_new, b.constant(scale.astype(dt)),
                                  m.shape("w").dims)
    bias = b.constant(shift.astype(dt))
    if "cb" in m.values:
        cb_v = m.v("cb") if scale is None else b.mul(m.v("cb"), b.constant(scale.astype(dt)))
        bias = b.add(cb_v, bias)
    return _rebuild_conv(b, m, w_new, bias)


FOLD_CONV_AFFINE = Rule(
    "FoldConvAffine",
    _build_affine,
    pattern=_affine,
    checks=(target_claims("conv_bn_fold"), float_conv, affine_is_per_channel,
            same_dtype("conv", "s", "t")),
    produces="conv_bn_fold",
)
RULES = (FOLD_CONV_BN, FOLD_CONV_AFFINE)
