"""VJP and JVP rules of the convolution family. conv2d's input / weight cotangents are the
closed-form `conv2d_backward_input` / `_weight` ops; conv_transpose2d is conv2d's adjoint, so its
input cotangent is a conv2d and its weight cotangent a `conv2d_backward_weight` with the roles
of input and output swapped; max pooling uses `maxpool2d_backward`; average pooling, global
average pooling and 2x nearest upsampling are linear and written with primitives. JVPs: conv
ops are bilinear, the pools / resize linear (max pooling routes the tangent to the same first
maximum its VJP uses)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ...ir.ops.backward_conv import transpose_output_padding
from ...ir.ops.conv import (
    Conv2d,
    ConvTranspose2d,
    GlobalAvgPool,
    Pool2d,
    PoolKind,
    ResizeNearest2x,
)
from ..emit import add_optional
from ..registry import jvp_rule, vjp_rule


def _attrs(op) -> dict:
    return dict(stride=op.stride, padding=op.padding, dilation=op.dilation, groups=op.groups)


def _bias_ct(b, ct):
    return b.sum(ct, (0, 2, 3))


@vjp_rule(Conv2d)
def conv2d_vjp(b, node, ins, outs, cts):
    ct, op = cts[0], node.op
    if ct is None:
        return [None] * len(ins)
    x, w = ins[:2]
    hw = b.shape_of(x).dims[2:]
    dx = b.conv2d_backward_input(ct, w, hw, **_attrs(op))
    dw = b.conv2d_backward_weight(ct, x, b.shape_of(w).dims[2:], **_attrs(op))
    return [dx, dw] + ([_bias_ct(b, ct)] if op.has_bias else [])


@vjp_rule(ConvTranspose2d)
def conv_transpose2d_vjp(b, node, ins, outs, cts):
    ct, op = cts[0], node.op
    if ct is None:
        return [None] * len(ins)
    x, w = ins[:2]
    dx = b.conv2d(ct, w, **_attrs(op))
    dw = b.conv2d_backward_weight(x, ct, b.shape_of(w).dims[2:], **_attrs(op))
    return [dx, dw] + ([_bias_ct(b, ct)] if op.has_bias else [])


@jvp_rule(Conv2d, ConvTranspose2d)
def conv_jvp(b, node, ins, outs, tangents):
    """Bilinear in (x, w), plus the bias tangent per channel."""
    op = replace(node.op, has_bias=False)
    x, w = ins[:2]
    tx, tw = tangents[:2]
    out = None
    if tx is not None:
        out = b.add_node(op, (tx, w))[0]
    if tw is not None:
        out = add_optional(b, out, b.add_node(op, (x, tw))[0])
    if node.op.has_bias and tangents[2] is not None:
        tb = b.reshape(tangents[2], (1, -1, 1, 1))
        out = add_optional(b, out, b.expand(tb, node.outputs[0].dims))
    return [out]


def _avg_pool_vjp(b, op: Pool2d, x, ct):
    """Spread each window's cotangent / count evenly over the window: a grouped
    conv_transpose2d with a ones kernel."""
    n, c, h, w = b.shape_of(x).dims
    ho, wo = b.shape_of(ct).dims[2:]
    (kh, kw), (sh, sw) = op.kernel, op.stride
    t, left, bot, r = op.padding
    dt = b.shape_of(x).dtype
    if op.count_include_pad:
        scaled = b.div(ct, float(kh * kw))
    else:
        ones = np.pad(np.ones((h, w)), ((t, bot), (left, r)))
        win = np.lib.stride_tricks.sliding_window_view(ones, (kh, kw))[::sh, ::sw]
        scaled = b.div(ct, b.constant(win.sum(axis=(2, 3)).astype(dt.np), dt))
    kernel = b.constant(np.ones((c, 1, kh, kw), dt.np), dt)
    out_pad = (transpose_output_padding(h, ho, kh, sh, t, bot, 1),
               transpose_output_padding(w, wo, kw, sw, left, r, 1))
    return b.conv_transpose2d(scaled, kernel, stride=op.stride, padding=op.padding,
                              output_padding=out_pad, groups=c)


@vjp_rule(Pool2d)
def pool2d_vjp(b, node, ins, outs, cts):
    ct, op = cts[0], node.op
    if ct is None or not node.outputs[0].dtype.is_float:
        return [None]
    if op.pool is PoolKind.MAX:
        return [b.maxpool2d_backward(ct, ins[0], op.kernel, op.stride, op.padding)]
    return [_avg_pool_vjp(b, op, ins[0], ct)]


def _max_pool_tangent(b, op: Pool2d, x, y, tx):
    """The tangent at each window's first maximum (the position maxpool2d_backward routes to)."""
    ho, wo = b.shape_of(y).dims[2:]
    (kh, kw), (sh, sw) = op.kernel, op.stride
    t, left, bot, r = op.padding
    pads = ((0, 0), (0, 0), (t, bot), (left, r))
    xp, tp = (b.pad(x, pads, -np.inf), b.pad(tx, pads)) if any(op.padding) else (x, tx)
    taken, out = None, None
    for i in range(kh):
        for j in range(kw):
            def window(a, i=i, j=j):
                rows = b.slice(a, 2, i, i + (ho - 1) * sh + 1, sh)
                return b.slice(rows, 3, j, j + (wo - 1) * sw + 1, sw)
            hit = b.eq(window(xp), y)
            first = hit if taken is None else b.logical_and(hit, b.logical_not(taken))
            taken = hit if taken is None else b.logical_or(taken, hit)
            out = add_optional(b, out, b.where(first, window(tp), 0.0))
    return out


@jvp_rule(Pool2d)
def pool2d_jvp(b, node, ins, outs, tangents):
    tx, op = tangents[0], node.op
    if tx is None or not node.outputs[0].dtype.is_float:
        return [None]
    if op.pool is PoolKind.MAX:
        return [_max_pool_tangent(b, op, ins[0], outs[0], tx)]
    return [b.add_node(op, (tx,))[0]]


@vjp_rule(GlobalAvgPool)
def global_avg_pool_vjp(b, node, ins, outs, cts):
    if cts[0] is None:
        return [None]
    dims = b.shape_of(ins[0]).dims
    return [b.expand(b.div(cts[0], float(dims[2] * dims[3])), dims)]


@vjp_rule(ResizeNearest2x)
def resize_nearest_2x_vjp(b, node, ins, outs, cts):
    """Each input pixel was copied to a 2x2 block: sum the block's cotangents."""
    if cts[0] is None:
        return [None]
    n, c, h, w = b.shape_of(ins[0]).dims
    return [b.sum(b.reshape(cts[0], (n, c, h, 2, w, 2)), (3, 5))]


@jvp_rule(GlobalAvgPool, ResizeNearest2x)
def linear_image_jvp(b, node, ins, outs, tangents):
    return [None if tangents[0] is None else b.add_node(node.op, (tangents[0],))[0]]
