"""Mixed precision: `AutoMixedPrecision(policy)` rounds the operands of the ops a policy lowers
(matmuls and their fused kinds, convolutions of at least MIN_CONV_MACS multiply-adds per
output: smaller ones, depthwise among them, are memory-bound) to bf16 (or f16), keeping
accumulation and every other op - norms, softmax, residual sums, reductions - in float32,
which is what a bf16 GEMM with f32 accumulation computes (products of bf16 values are exact
in f32).

Rounding is written as cast(cast(x, bf16), f32): the reference interpreter gives the policy's
numbers exactly, and on weights it is weight preparation (computed once). A backend with a bf16
GEMM runs those matmuls on the rounded operands directly. A fused attention block's output
projection is a matmul too: the policy sets the block's `round_attention`, which rounds the
attention result (an operand inside the block) the same way. Attention's own matmuls (q @ k^T
and p @ v) run on rounded q, k, v and probabilities, softmax in f32 (`attention_core`): the
attention op's `round_operands`, a block's `round_core`. A patch-embedding conv (kernel =
stride, no padding: ViT's) becomes the matmul it is (patches @ the weight as a matrix), so it
runs the bf16 GEMM too."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from ..ir.dtypes import DType, bf16, f16, f32
from ..ir.graph import Graph
from ..ir.op import Value
from ..ir.ops.attention import Attention
from ..ir.ops.conv import Conv2d, ConvTranspose2d
from ..ir.ops.fused import (
    FusedAttentionBlock,
    FusedConvBiasAct,
    FusedMatMulBiasAct,
    FusedTransformerLayer,
)
from ..ir.ops.linalg import DotGeneral, MatMul
from .base import PassResult
from .expand import expand_nodes

__all__ = ["PrecisionPolicy", "AutoMixedPrecision", "apply_precision", "POLICIES"]

_LOWERED = (MatMul, DotGeneral, FusedMatMulBiasAct, Conv2d, ConvTranspose2d, FusedConvBiasAct,
            FusedAttentionBlock)


MIN_CONV_MACS = 32
"""Convs with fewer multiply-adds per output value (kh kw C / groups) keep f32 operands under a
policy by default: they are memory-bound (a depthwise conv does kh kw), so bf16 operands save
them nothing, and rounding them cost two cast passes each (MobileNetV2's bf16 call had taken
1.4-1.8x its f32 time). Measured on the AVX512-BF16 engine (runtime/kernels/conv_dp.py, Zen 4):
1x1 convs of 64-160 input channels run in 0.55-0.75x their f32 time (MobileNetV2 4.19 -> 3.80
ms, ResNet-50 24.4 -> 22.4, RegNet-Y 35.4 -> 33.3 against a floor of 256); with the bf16
hand-off between convs, those of 32 pay too (one thread, CPU time, against a floor of 64:
RegNet-Y 42.6 -> 41.8 ms, its 32 -> 128 1x1 at 112 x 112 had run f32 at 72 GFLOP/s; the OCR
det 13.9 -> 13.4, cls 0.95 -> 0.90, MobileNetV2 6.49 -> 6.42), while a floor of 16 made the
OCR models slower (det 14.6, rec 12.7 against 12.1). The AMX conv keeps its own floor
(conv_amx.AMX_MIN_MACS)."""


@dataclass(frozen=True)
class PrecisionPolicy:
    """Which ops compute on low-precision operands, and in what dtype. Inputs of those ops in
    `roles` (by position; None: every float operand) are rounded; everything else stays f32."""

    name: str
    compute: DType = bf16
    ops: tuple[type, ...] = _LOWERED
    skip_roles: frozenset[str] = field(default_factory=lambda: frozenset(
        {"b", "residual", "b_qkv", "b_q", "b_kv", "b_qk", "b_v", "b_o", "cos", "sin", "mask",
         "past_k", "past_v"}))
    # biases (the attention block's per input projection too), a conv's residual, tables and
    # an attention block's KV cache (returned in its present keys / values; the core rounds
    # what it reads) stay f32
    unfuse: tuple[type, ...] = (FusedTransformerLayer,)
    # composite kinds holding lowered ops: decomposed first, so their matmuls are rounded too
    attention_core: bool = True
    # attention's own matmuls (q @ k^T, p @ v) on rounded q, k, v and probabilities
    min_conv_macs: int = MIN_CONV_MACS
    # convs with fewer multiply-adds per output keep f32 operands (0: every conv is rounded)

    def lowers(self, op) -> bool:
        return isinstance(op, self.ops)


POLICIES = {"bf16": PrecisionPolicy("bf16", bf16),
            "f16": PrecisionPolicy("f16", f16, attention_core=False)}
# f16: no f16 attention kernel (the core would fall back to the NumPy reference)


def apply_precision(g: Graph, policy: PrecisionPolicy | str) -> tuple[Graph, int]:
    """A new graph with the policy's rounding inserted; returns (graph, ops lowered)."""
    if isinstance(policy, str):
        try:
            policy = POLICIES[policy]
        except KeyError:
            from ..errors import BrazeError

            raise BrazeError(f"unknown precision {policy!r}; known: {sorted(POLICIES)}") \
                from None
    if any(isinstance(n.op, policy.unfuse) for n in g.nodes):
        g, _ = expand_nodes(g, lambda op: isinstance(op, policy.unfuse))
    new = Graph(g.name, record_provenance=False)
    vmap: dict[Value, Value] = {}
    rounded: dict[Value, Value] = {}
    count = 0
    for node in g.nodes:
        ins = [vmap[v] for v in node.inputs]
        if isinstance(node.op, Attention) and policy.attention_core \
                and node.outputs[0].dtype == f32:
            op = dataclasses.replace(node.op, round_operands=policy.compute)
            vmap.update(zip(node.values, new.add_node(op, ins, name=node.name,
                                                      provenance=node.provenance)))
            count += 1
            continue
        if policy.lowers(node.op) and node.outputs[0].dtype == f32 and \
                policy.lowers(FusedMatMulBiasAct()) and patch_size(g, node) is not None:
            vmap[node.values[0]] = _patch_matmul(new, node, ins, policy, rounded)
            count += 1
            continue
        if policy.lowers(node.op) and node.outputs[0].dtype == f32 and \
                not _small_conv(g, node, policy):
            names = _roles(node.op, len(ins))
            for i, (v, role) in enumerate(zip(ins, names)):
                if role not in policy.skip_roles:
                    ins[i] = _rounded(new, v, policy, rounded)
            count += 1
            op = _round_inside(node.op, policy)
            if op is not node.op:
                outs = new.add_node(op, ins, name=node.name, provenance=node.provenance)
                vmap.update(zip(node.values, outs))
                continue
        outs = new.clone_node(node, ins, g)
        vmap.update(zip(node.values, outs))
    new.weights = dict(g.weights)
    new.set_outputs([vmap[v] for v in g.outputs])
    return new, count


def _small_conv(g: Graph, node, policy: PrecisionPolicy) -> bool:
    """A conv of fewer than policy.min_conv_macs multiply-adds per output (MIN_CONV_MACS)."""
    if not isinstance(node.op, (Conv2d, FusedConvBiasAct)):
        return False
    _, cg, kh, kw = g.shape_of(node.inputs[1]).dims
    return kh * kw * cg < policy.min_conv_macs


def _rounded(new: Graph, v: Value, policy: PrecisionPolicy, rounded: dict) -> Value:
    """`v` rounded to the policy's dtype and back (once per value), or `v` when not f32."""
    if new.shape_of(v).dtype != f32:
        return v
    if v not in rounded:
        rounded[v] = new.cast(new.cast(v, policy.compute), f32)
    return rounded[v]


def patch_size(g: Graph, node) -> tuple[int, int] | None:
    """(ph, pw) when `node` is a patch-embedding conv: a conv2d / fused_conv_bias_act (no
    residual) of one group whose kernel, larger than 1x1, equals its stride, with no padding
    or dilation, over a static H and W that the patches tile exactly: a matmul of each
    patch's values by the weight, nothing overlapping or left over (ViT's, Swin's,
    ConvNeXt's stem)."""
    op = node.op
    if not isinstance(op, (Conv2d, FusedConvBiasAct)) or getattr(op, "residual", False):
        return None
    if op.groups != 1 or any(op.padding) or tuple(op.dilation) != (1, 1):
        return None
    kh, kw = g.shape_of(node.inputs[1]).dims[2:]
    h, w = g.shape_of(node.inputs[0]).dims[2:]
    if (kh, kw) != tuple(op.stride) or kh * kw == 1 or not all(
            isinstance(d, int) for d in (h, w)) or h % kh or w % kw:
        return None
    return kh, kw


def _patch_matmul(new: Graph, node, ins: list, policy: PrecisionPolicy, rounded: dict
                  ) -> Value:
    """A patch-embedding conv (see patch_size) as patches [B, Hp * Wp, C * ph * pw] @ the
    weight as [C * ph * pw, O] (+ bias, activation) on rounded operands, the result back in
    NCHW: the bf16 GEMM runs it (braze's convs are f32 only). The weight's reshape /
    transpose read only params: weight preparation."""
    ph, pw = node.op.stride  # = the kernel (patch_size)
    x, w = ins[0], ins[1]
    n, c, h, wd = new.shape_of(x).dims
    o = new.shape_of(w).dims[0]
    hp, wp = h // ph, wd // pw
    patches = new.reshape(new.transpose(new.reshape(x, (n, c, hp, ph, wp, pw)),
                                        (0, 2, 4, 1, 3, 5)), (n, hp * wp, c * ph * pw))
    w2 = new.transpose(new.reshape(w, (o, c * ph * pw)), (1, 0))
    act = node.op.act if isinstance(node.op, FusedConvBiasAct) else None
    bias = ins[2] if len(ins) > 2 else None
    y = new.linear_fused(_rounded(new, patches, policy, rounded),
                         _rounded(new, w2, policy, rounded), bias, act)
    return new.transpose(new.reshape(y, (n, hp, wp, o)), (0, 3, 1, 2))


def _round_inside(op, policy: PrecisionPolicy):
    """`op` with its inner matmul operands rounded by the policy (an attention block's
    attention result, read by the output projection, and its attention core's operands), or
    `op` itself."""
    if not isinstance(op, FusedAttentionBlock):
        return op
    if "w_o" not in policy.skip_roles:
        op = dataclasses.replace(op, round_attention=policy.compute)
    if policy.attention_core:
        op = dataclasses.replace(op, round_core=policy.compute)
    return op


def _roles(op, n: int) -> tuple:
    roles = getattr(op, "input_roles", None)
    if roles is not None:
        return roles()
    if isinstance(op, (Conv2d, ConvTranspose2d)):
        return ("x", "w", "b")[:n]
    return (None,) * n


@dataclass
class AutoMixedPrecision:
    """The pass form of `apply_precision`."""

    policy: PrecisionPolicy | str = "bf16"
    name: str = "AutoMixedPrecision"

    def run(self, g: Graph, ctx) -> PassResult:
        t0 = time.perf_counter()
        out, count = apply_precision(g, self.policy)
        return PassResult(self.name, out, count > 0, seconds=time.perf_counter() - t0)
