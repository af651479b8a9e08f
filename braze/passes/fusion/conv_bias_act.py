"""FuseConvBiasAct: conv2d(x, w[, b]) -> add(per-channel bias [C, 1, 1] or [1, C, 1, 1], either
operand order) -> optional activation, conv2d -> activation, or a conv with its own bias alone,
into one FusedConvBiasAct (so every biased conv ends up one fused kind). The added bias is folded
into the conv's own (a reshape / add on [C] vectors); a conv without any bias gets a zero bias
constant. Which activations may join is the target's choice. Only a vector (at most one dim
above 1) is a bias candidate: a residual add after a conv is no near miss of this fusion. An
activation also joins through the reshape (and narrow) of a 1-D conv written as a 2-D one:
act(reshape(conv)) -> reshape(fused conv with act).

The activation is a unary op, ReLU6 written as clip(y, 0, 6) (MobileNet v1 / v2's ONNX Clip;
fused as UnaryFn.RELU6), or hard-swish written in primitives the ways exporters write it:
y * relu6(y + 3) / 6 (Paddle, in either association, dividing or multiplying by 1/6) and
y * hard_sigmoid(y) with alpha 1/6, beta 1/2 (ONNX HardSwish / HardSigmoid); the constants are
checked to 1e-6 relative (Paddle writes 1/6 as 0.1666667).

An activation joins through a transpose of the conv's output too, and a reshape after it:
act(reshape(transpose(conv))), SegFormer's Mix-FFN (depthwise conv -> flatten and transpose
back to tokens -> GELU, canonicalized as transpose then reshape) -> reshape(transpose(fused
conv with act))."""
from __future__ import annotations

import numpy as np

from ...ir.ops.conv import Conv2d
from ...ir.ops.elementwise import Binary, BinaryFn, Unary, UnaryFn
from ...ir.ops.fused import FusedConvBiasAct
from ...ir.ops.io import Constant
from ...ir.ops.shape import Reshape, Transpose
from ...rewrite import Miss, MissReason, P, Rule, V, fail
from .checks import epilogue_activation_allowed, same_dtype, target_claims

_conv = P.conv2d(V("x"), V("w"), name="conv") | P.conv2d(V("x"), V("w"), V("cb"), name="conv")


def _bias_like(g, v) -> bool:
    """A vector in some layout (at most one dim above 1): the only operands a near miss can be
    reported for. A residual or any operand that varies along two axes is not a bias at all."""
    return sum(1 for d in g.shape_of(v).dims if d != 1) <= 1


_biased = P.add(_conv, V("b", where=_bias_like), name="add")   # conv(x, w) + b  (or b + conv)
_act_biased = P.of(Unary, _biased, name="act")                  # act(conv(x, w) + b)
_act_only = P.of(Unary, _conv, name="act")                      # act(conv(x, w[, cb]))
_relu6 = P.clamp(_biased | _conv, lo=0.0, hi=6.0, name="relu6")  # clip(conv + b, 0, 6)
_own_bias = P.conv2d(V("x"), V("w"), V("cb"), name="conv")      # conv(x, w, cb) alone
# act(reshape(conv)) and act(narrow(reshape(conv))): a 1-D conv imported as reshape -> conv2d
# -> reshape (ONNX Conv over [N, C, L], torch conv1d), wav2vec2's "same pad" narrow after it.
# The activation is element-wise, so it moves before the views, into the conv's epilogue.
_view = P.of(Reshape, _conv, name="view")
# act(transpose(conv)) and act(reshape(transpose(conv))): a conv's output turned back into
# tokens (SegFormer's Mix-FFN), the activation after the layout change.
_perm = P.of(Transpose, _conv, name="perm")
_act_viewed = P.of(Unary, _view | P.narrow(_view, name="cut") | P.of(Reshape, _perm, name="view")
                   | _perm, name="act")


def _scalar_const(g, v) -> bool:
    n = g.nodes[v.node]
    return isinstance(n.op, Constant) and n.op.value.size == 1


def _c(name: str) -> V:
    return V(name, where=_scalar_const)


def hard_swish_of(y):
    """Hard-swish of `y` as exporters write it (the root is captured as "hswish")."""
    relu6 = P.clamp(P.add(y, _c("three")), lo=0.0, hi=6.0)             # relu6(y + 3)
    gate = P.clamp(P.add(P.mul(y, _c("sixth")), _c("half")), lo=0.0, hi=1.0)  # hard_sigmoid(y)
    return (P.div(P.mul(y, relu6), _c("six"), name="hswish")           # y * relu6(y + 3) / 6
            | P.mul(P.mul(y, relu6), _c("sixth"), name="hswish")       # y * relu6(y + 3) * 1/6
            | P.mul(y, P.div(relu6, _c("six")), name="hswish")         # y * (relu6(y + 3) / 6)
            | P.mul(y, P.mul(relu6, _c("sixth")), name="hswish")       # y * (relu6(y + 3) / 6)
            | P.mul(y, gate, name="hswish"))                           # y * hard_sigmoid(y)


_HSWISH_CONSTANTS = {"three": 3.0, "six": 6.0, "sixth": 1.0 / 6.0, "half": 0.5}


def is_channel_bias(dims: tuple, channels: int) -> bool:
    """`dims` is [C, 1, 1] or [1, C, 1, 1]: one value per output channel of an NCHW conv."""
    return dims in ((channels, 1, 1), (1, channels, 1, 1))


def bias_is_per_channel(m, ctx) -> Miss | None:
    """The added vector holds one value per output channel (else SHAPE_MISMATCH). The hint
    proposes the [C, 1, 1] layout only for a single value or a vector of C values: one of
    another length varies along another axis and is no conv bias."""
    if "b" not in m.values:
        return None
    channels = m.shape("conv").dims[1]
    dims = m.shape("b").dims
    if is_channel_bias(dims, channels):
        return None
    sizes = [d for d in dims if d != 1]
    layout = f"[{channels}, 1, 1] or [1, {channels}, 1, 1]"
    if not sizes:
        return fail(MissReason.SHAPE_MISMATCH,
                    hint=f"a single added value fuses when written as a {layout} bias (the value "
                         "repeated once per output channel).",
                    detail=f"added operand has dims {dims}, a single value")
    if sizes[0] == channels:
        return fail(MissReason.SHAPE_MISMATCH,
                    hint=f"if it is meant as one value per output channel, write the conv bias "
                         f"as {layout} to fuse it (a {list(dims)} operand broadcasts along "
                         "another axis instead).",
                    detail=f"added operand has dims {dims}, not per-channel for "
                           f"{channels} channels")
    return fail(MissReason.SHAPE_MISMATCH,
                hint="a conv bias has one value per output channel; this operand varies along "
                     "another axis, so it stays a separate add (nothing to change if that is "
                     "intended).",
                detail=f"added operand has dims {dims}: {sizes[0]} values along an axis other "
                       f"than the {channels} channels")


def hard_swish_constants(m, ctx) -> Miss | None:
    """The constants of a hard-swish epilogue are 3, 6, 1/6 and 1/2 (to 1e-6 relative)."""
    for name, want in _HSWISH_CONSTANTS.items():
        if name not in m.values:
            continue
        got = float(np.asarray(m.graph.nodes[m.values[name].node].op.value).reshape(-1)[0])
        if abs(got - want) > 1e-6 * abs(want):
            return fail(MissReason.PATTERN_MISMATCH,
                        detail=f"an x * clamp(...) epilogue has constant {got} where hard-swish "
                               f"has {want}")
    return None


_WRITTEN_OUT = {"hswish": UnaryFn.HARD_SWISH, "relu6": UnaryFn.RELU6}


def written_out_activation_allowed(m, ctx) -> Miss | None:
    """The target applies the hard-swish or ReLU6 (clip to [0, 6]) the graph writes out in
    primitives in a conv epilogue."""
    for capture, fn in _WRITTEN_OUT.items():
        if capture in m.nodes and ctx.target is not None and \
                fn not in ctx.target.epilogue_activations:
            return fail(MissReason.UNSUPPORTED_EPILOGUE_ACTIVATION,
                        detail=f"{fn.value} is not an epilogue activation of target "
                               f"{ctx.target.name!r}")
    return None


def _channel_vector(b, m, name: str, channels: int):
    """Captured bias `name` as a [C] value: the vector itself when it is a reshape of one."""
    g = m.graph
    src = g.nodes[m.values[name].node]
    if isinstance(src.op, Reshape) and g.shape_of(src.inputs[0]).dims == (channels,):
        return m.new(src.inputs[0])
    return b.reshape(m.v(name), (channels,))


def _build(b, m):
    conv: Conv2d = m.op("conv")
    channels = m.shape("conv").dims[1]
    bias = m.v("cb") if "cb" in m.values else None
    if "b" in m.values:
        extra = _channel_vector(b, m, "b", channels)
        bias = extra if bias is None else b.add(bias, extra)
    if bias is None:
        bias = b.constant(np.zeros(channels, m.shape("conv").dtype.np))
    act = m.op("act").fn if "act" in m.nodes else None
    for capture, fn in _WRITTEN_OUT.items():
        if capture in m.nodes:
            act = fn
    op = FusedConvBiasAct(conv.stride, conv.padding, conv.dilation, conv.groups, act)
    y = b.add_node(op, (m.v("x"), m.v("w"), bias))[0]
    for view in ("perm", "view", "cut"):  # the views the activation went through, after it
        if view in m.nodes:
            y = b.add_node(m.op(view), (y,))[0]
    return y


def _explain_conv(g, node, ctx) -> Miss | None:
    """A conv left alone whose only consumer subtracts a per-channel operand from it: written
    as an add of the negated bias, it would fuse. (A multiply or divide is a scale, not a bias:
    no advice to write it as an add.)"""
    users = g.users(node.value)
    if len(users) != 1 or g.is_output(node.value):
        return None
    (u,) = users
    if isinstance(u.op, Binary) and u.op.fn is BinaryFn.SUB and u.inputs[0] == node.value:
        channels = node.outputs[0].dims[1]
        if is_channel_bias(g.shape_of(u.inputs[1]).dims, channels):
            return fail(MissReason.NON_ADD_BIAS_CONSUMER,
                        hint="write conv(x) - b as conv(x) + (-b) (negate the [C, 1, 1] bias) "
                             "so the bias fuses into the conv.",
                        detail=f"consumer {u.label} subtracts a per-channel bias")
    return None


FUSE_CONV_BIAS_ACT = Rule(
    "FuseConvBiasAct",
    _build,
    pattern=(hard_swish_of(_biased | _conv) | _relu6 | _act_biased | _biased | _act_only
             | _act_viewed | _own_bias),
    checks=(target_claims("fused_conv_bias_act"), bias_is_per_channel,
            same_dtype("conv", "b"), epilogue_activation_allowed("act"), hard_swish_constants,
            written_out_activation_allowed),
    anchor=lambda op: op.kind == "conv2d",
    explain=_explain_conv,
    produces="fused_conv_bias_act",
)
RULES = (FUSE_CONV_BIAS_ACT,)
