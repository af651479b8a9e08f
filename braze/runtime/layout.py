"""Channels-last activations: which 4-d values the executor stores NHWC instead of NCHW.

braze's fastest convs work on NHWC (the bf16 implicit GEMMs, braze's NHWC f32 conv). With
every value NCHW, each such conv copies its input into NHWC and transposes its output back:
two passes over memory per conv, which in ResNet-50 cost about as much as the NHWC tiles
saved. So a conv's output is kept NHWC where

- its producer is a conv, max pool or per-channel scale whose kernel takes NHWC
  (kernels.conv and kernels.nhwc_ops: channels_last_input),
- it is no graph output, and
- every step reading it is such a step (or a global average pool) reading it as its
  activation, or a conv reading it as its residual; under the bf16 policy a conv reads its input
  through the policy's rounding casts, which its kernel does itself (KernelContext.rounded):
  those casts then have no other readers. The rounding cast(v, bf16) is kept NHWC with v:
  where the conv producing v writes that rounding itself (the bf16 hand-off, program.py), the
  bf16 values are what the next convs read.

Everything else stays NCHW: the graph's semantics and every other kernel see NCHW only, and a
conv reading an NCHW value or writing one (a graph output, a value a pooling step reads)
converts at that edge as it always did. The program checks that every step touching an NHWC
value runs a kernel that says it takes that layout (`Kernel.channels_last`) and is rebuilt all
NCHW otherwise. `BRAZE_CHANNELS_LAST=0` keeps every value NCHW."""
from __future__ import annotations

import os
from collections.abc import Callable

from ..ir.dtypes import bf16, f32
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.op import Value
from ..ir.ops.elementwise import Cast
from ..ir.ops.fused_simple import FusedConvBiasAct
from .kernels import KernelContext, has_empty, nhwc_ops
from .kernels.conv import channels_last_input

__all__ = ["plan_channels_last", "enabled"]


def enabled() -> bool:
    """Whether the executor keeps conv activations NHWC (not `BRAZE_CHANNELS_LAST=0`)."""
    return os.environ.get("BRAZE_CHANNELS_LAST", "1") != "0"


def plan_channels_last(g: Graph, static: list[bool], types: Callable[[Node], tuple],
                       ctx: KernelContext) -> frozenset[Value]:
    """The values of `g` to store NHWC (see the module docstring); `types(node)` gives a
    node's concrete (input, output) Shapes."""
    if not enabled():
        return frozenset()
    reads: dict[int, Value] = {}  # node id -> the activation its kernel reads NHWC
    for n in g.nodes:
        if static[n.id]:
            continue
        takes = _TAKES.get(n.op.kind)
        if takes is None or has_empty(*types(n)):
            continue  # an empty tensor runs the reference (kernels.has_empty), NCHW
        v = takes(n, *types(n), ctx)
        if v is not None:
            reads[n.id] = v
    keep = set()
    for nid in reads:
        v = g.nodes[nid].value
        if g.nodes[nid].op.kind == "global_avg_pool":  # [N, C, 1, 1]: the same either way
            continue
        if not g.is_output(v) and all(_reads_nhwc(g, u, v, reads) for u in g.users(v)):
            keep.add(v)
            keep.update(u.value for u in g.users(v) if u.id not in reads)  # rounding casts
    return frozenset(keep)


_TAKES = {"conv2d": channels_last_input, "fused_conv_bias_act": channels_last_input,
          "pool2d": nhwc_ops.channels_last_input, "binary": nhwc_ops.channels_last_input,
          "global_avg_pool": nhwc_ops.channels_last_input}


def _reads_nhwc(g: Graph, user: Node, v: Value, reads: dict[int, Value]) -> bool:
    """Whether the step of `user` reads `v` NHWC: a node of `reads` taking v as its input
    (read directly) or a conv's residual, or the bf16 rounding of a conv's input that the
    conv's kernel does itself."""
    if user.id in reads:
        ok = {3} if isinstance(user.op, FusedConvBiasAct) and user.op.residual else set()
        if reads[user.id] == v:  # positions where the node reads its activation directly
            ok.update(i for i, x in enumerate(user.inputs) if x == v)
        return all(i in ok for i, x in enumerate(user.inputs) if x == v)
    return _rounding_for_convs(g, user, v, reads)


def _rounding_for_convs(g: Graph, cast: Node, v: Value, reads: dict[int, Value]) -> bool:
    """`cast` is cast(v, bf16) whose every reader is cast(., f32) read only as the input of
    convs whose kernels read v and round it themselves (nothing then runs the casts)."""
    if not isinstance(cast.op, Cast) or cast.op.dtype != bf16:
        return False
    for back in g.users(cast.value):
        if not isinstance(back.op, Cast) or back.op.dtype != f32 or g.is_output(back.value):
            return False
        for conv in g.users(back.value):
            if reads.get(conv.id) != v or \
                    any(i != 0 for i, x in enumerate(conv.inputs) if x == back.value):
                return False
    return not g.is_output(cast.value)
