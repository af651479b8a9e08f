"""Half-precision models on float32 kernels: `compute_half_in_f32(g)` runs each matmul,
convolution, attention, normalization, softmax and reduction whose values are float16 /
bfloat16 (a model cast with `.to(torch.bfloat16)`, an f16 ONNX export) on its inputs cast to
float32, casting its results back: cast(op(cast(x, f32)), half). The compiled CPU executor
has float32 kernels for these ops and would otherwise run their NumPy references.

The results keep the model's dtype at every op boundary, so the next op sees the same rounded
values; inside the op, accumulation is float32, as the references of matmul and the norms
compute it, and the fused kinds round once at their output where a reference rounds after
each of its steps (differences of about one half-precision ulp). Casting a weight is weight
preparation (computed once). Element-wise ops stay in half precision (generated regions
round as the reference does)."""
from __future__ import annotations

import time

from ..ir.dtypes import bf16, f16, f32
from ..ir.graph import Graph
from .base import PassResult

__all__ = ["compute_half_in_f32", "ComputeHalfInF32", "F32_KINDS"]

F32_KINDS = frozenset({
    "matmul", "dot_general", "fused_matmul_bias_act", "fused_swiglu", "attention",
    "fused_attention_block", "fused_transformer_layer", "layer_norm", "rms_norm",
    "fused_residual_ln", "fused_residual_rms_norm", "fused_rms_norm_reshape", "group_norm",
    "batch_norm", "softmax", "log_softmax", "conv2d", "fused_conv_bias_act",
    "conv_transpose2d", "pool2d", "global_avg_pool", "resize", "rope", "reduce"})
_HALF = (f16, bf16)


def compute_half_in_f32(g: Graph) -> tuple[Graph, int]:
    """(graph, nodes moved to float32): each node of F32_KINDS whose float inputs and outputs
    are one half type gets float32 inputs and its outputs cast back; `g` itself when none."""
    picked = [n for n in g.nodes if _half_node(g, n)]
    if not picked:
        return g, 0
    chosen = {n.id for n in picked}
    new = Graph(g.name, record_provenance=g.record_provenance)
    vmap: dict = {}
    upcast: dict = {}  # a half value's float32 cast, made once
    for node in g.nodes:
        ins = [vmap[v] for v in node.inputs]
        if node.id not in chosen:
            vmap.update(zip(node.values, new.clone_node(node, ins, g)))
            continue
        wide = []
        for v in ins:
            if new.shape_of(v).dtype in _HALF:
                if v not in upcast:
                    upcast[v] = new.cast(v, f32)
                v = upcast[v]
            wide.append(v)
        outs = new.add_node(node.op, wide, name=node.name, provenance=node.provenance)
        for old, out in zip(node.values, outs):
            half = g.shape_of(old).dtype
            vmap[old] = new.cast(out, half) if half in _HALF and \
                new.shape_of(out).dtype == f32 else out
    new.weights = dict(g.weights)
    new.set_outputs([vmap[v] for v in g.outputs])
    return new, len(picked)


def _half_node(g: Graph, node) -> bool:
    if node.op.kind not in F32_KINDS:
        return False
    floats = {g.shape_of(v).dtype for v in node.inputs if g.shape_of(v).dtype.is_float}
    floats |= {s.dtype for s in node.outputs if s.dtype.is_float}
    return len(floats) == 1 and next(iter(floats)) in _HALF


class ComputeHalfInF32:
    """The pass form of `compute_half_in_f32`."""

    name = "ComputeHalfInF32"

    def run(self, g: Graph, ctx) -> PassResult:
        t0 = time.perf_counter()
        out, count = compute_half_in_f32(g)
        return PassResult(self.name, out, count > 0, seconds=time.perf_counter() - t0)
