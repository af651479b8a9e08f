"""FuseConvBiasAct: conv2d(x, w[, b]) -> add(per-channel bias [C, 1, 1] or [1, C, 1, 1], either
operand order) -> optional activation, conv2d -> activation, or a conv with its own bias alone,
into one FusedConvBiasAct (so every biased conv ends up one fused kind). The added bias is folded
into the conv's own (a reshape / add on [C] vectors); a conv without any bias gets a zero bias
constant. Which activations may join is the target's choice."""
from __future__ import annotations

import numpy as np

from ...ir.ops.conv import Conv2d
from ...ir.ops.elementwise import Binary, BinaryFn, Unary
from ...ir.ops.fused import FusedConvBiasAct
from ...rewrite import Miss, MissReason, P, Rule, V, fail
from .checks import epilogue_activation_allowed, same_dtype, target_claims

_conv = P.conv2d(V("x"), V("w"), name="conv") | P.conv2d(V("x"), V("w"), V("cb"), name="conv")
_biased = P.add(_conv, V("b"), name="add")                     # conv(x, w) + b  (or b + conv)
_act_biased = P.of(Unary, _biased, name="act")                  # act(conv(x, w) + b)
_act_only = P.of(Unary, _conv, name="act")                      # act(conv(x, w[, cb]))
_own_bias = P.conv2d(V("x"), V("w"), V("cb"), name="conv")      # conv(x, w, cb) alone


def is_channel_bias(dims: tuple, channels: int) -> bool:
    """`dims` is [C, 1, 1] or [1, C, 1, 1]: one value per output channel of an NCHW conv."""
    return dims in ((channels, 1, 1), (1, channels, 1, 1))


def bias_is_per_channel(m, ctx) -> Miss | None:
    """The added operand holds one value per output channel (else SHAPE_MISMATCH)."""
    if "b" not in m.values:
        return None
    channels = m.shape("conv").dims[1]
    dims = m.shape("b").dims
    if not is_channel_bias(dims, channels):
        return fail(MissReason.SHAPE_MISMATCH,
                    hint=f"write the conv bias as [{channels}, 1, 1] or [1, {channels}, 1, 1] "
                         "(one value per output channel) to fuse it.",
                    detail=f"added operand has dims {dims}, not per-channel for "
                           f"{channels} channels")
    return None


def _build(b, m):
    conv: Conv2d = m.op("conv")
    channels = m.shape("conv").dims[1]
    bias = m.v("cb") if "cb" in m.values else None
    if "b" in m.values:
        extra = b.reshape(m.v("b"), (channels,))
        bias = extra if bias is None else b.add(bias, extra)
    if bias is None:
        bias = b.constant(np.zeros(channels, m.shape("conv").dtype.np))
    act = m.op("act").fn if "act" in m.nodes else None
    op = FusedConvBiasAct(conv.stride, conv.padding, conv.dilation, conv.groups, act)
    return b.add_node(op, (m.v("x"), m.v("w"), bias))[0]


def _explain_conv(g, node, ctx) -> Miss | None:
    """A conv left alone whose only consumer applies a per-channel operand with a non-add op."""
    users = g.users(node.value)
    if len(users) != 1 or g.is_output(node.value):
        return None
    (u,) = users
    if isinstance(u.op, Binary) and u.op.fn is not BinaryFn.ADD:
        other = u.inputs[1] if u.inputs[0] == node.value else u.inputs[0]
        if is_channel_bias(g.shape_of(other).dims, node.outputs[0].dims[1]):
            return fail(MissReason.NON_ADD_BIAS_CONSUMER,
                        detail=f"consumer {u.label} applies a {u.op.fn.value} bias")
    return None


FUSE_CONV_BIAS_ACT = Rule(
    "FuseConvBiasAct",
    _build,
    pattern=_act_biased | _biased | _act_only | _own_bias,
    checks=(target_claims("fused_conv_bias_act"), bias_is_per_channel,
            same_dtype("conv", "b"), epilogue_activation_allowed("act")),
    anchor=lambda op: op.kind == "conv2d",
    explain=_explain_conv,
    produces="fused_conv_bias_act",
)
RULES = (FUSE_CONV_BIAS_ACT,)
