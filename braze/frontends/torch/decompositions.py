"""The decomposition table braze imports torch.export programs with: torch's default table
(everything down to core ATen) minus the high-level ops braze represents natively, so linear,
attention, norms, activations, convolutions, pooling and resizing reach braze whole instead of as
the dozens of primitives fusion would have to find again. `aten.detach` is kept too (torch's
table turns it into an `alias`, losing the stop-gradient), and `detach_no_grad_regions` marks the
results of `torch.no_grad()` regions before the decompositions inline them without a trace."""
from __future__ import annotations

__all__ = ["KEPT_OPS", "decomposition_table", "detach_no_grad_regions"]

KEPT_OPS: tuple[str, ...] = (
    # matrix products
    "aten.linear.default", "aten.matmul.default", "aten.mm.default", "aten.bmm.default",
    "aten.addmm.default",
    # attention
    "aten.scaled_dot_product_attention.default",
    # normalization
    "aten.layer_norm.default", "aten.rms_norm.default", "aten.group_norm.default",
    "aten.batch_norm.default",
    # activations and softmax
    "aten.gelu.default", "aten.silu.default", "aten.hardswish.default",
    "aten.leaky_relu.default", "aten.hardtanh.default", "aten.softmax.int",
    "aten._softmax.default", "aten.log_softmax.int", "aten._log_softmax.default",
    "aten.logsumexp.default",
    # embedding, indexing, masks
    "aten.embedding.default", "aten.triu.default", "aten.tril.default",
    # stop-gradient
    "aten.detach.default",
    # convolution, pooling, resizing
    "aten.conv1d.default", "aten.conv2d.default", "aten.conv1d.padding",
    "aten.conv2d.padding", "aten.convolution.default", "aten.conv_transpose1d.default",
    "aten.conv_transpose2d.input", "aten.max_pool2d.default", "aten.max_pool1d.default",
    "aten.avg_pool2d.default", "aten.avg_pool1d.default", "aten.adaptive_avg_pool2d.default",
    "aten.adaptive_avg_pool1d.default", "aten.upsample_nearest2d.vec",
    "aten.upsample_nearest2d.default", "aten._upsample_nearest_exact2d.vec",
    "aten._upsample_nearest_exact2d.default", "aten.upsample_nearest1d.vec",
    "aten.upsample_nearest1d.default", "aten._upsample_nearest_exact1d.vec",
    "aten._upsample_nearest_exact1d.default", "aten.upsample_bilinear2d.vec",
    "aten.upsample_bilinear2d.default", "aten.upsample_bicubic2d.vec",
    "aten.upsample_bicubic2d.default",
    # fake quantization (quantization-aware training)
    "aten.fake_quantize_per_tensor_affine.default",
    "aten.fake_quantize_per_tensor_affine.tensor_qparams",
    "aten.fake_quantize_per_channel_affine.default",
)


def _overload(name: str):
    import torch

    _, op, overload = name.split(".")
    return getattr(getattr(torch.ops.aten, op), overload)


def decomposition_table():
    """torch.export's default decompositions without braze's native ops (`KEPT_OPS`)."""
    import torch

    table = torch.export.default_decompositions()
    for name in KEPT_OPS:
        try:
            table.pop(_overload(name), None)
        except AttributeError:  # an op this torch version does not have
            continue
    return table


def detach_no_grad_regions(ep):
    """`ep`, or a copy of it whose `torch.no_grad()` regions (`wrap_with_set_grad_enabled(False,
    ...)` calls, which torch's decompositions inline without a trace) have their results
    detached, so the gradient stops there as in torch. `ep` is not changed."""
    import copy

    import torch

    hop = getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None)

    def regions(program):
        return [n for n in program.graph.nodes
                if n.op == "call_function" and n.target is hop and n.args[0] is False]

    if hop is None or not regions(ep):
        return ep
    ep = copy.deepcopy(ep)
    graph = ep.graph
    for region in regions(ep):
        for out in list(region.users):
            with graph.inserting_after(out):
                detached = graph.call_function(torch.ops.aten.detach.default, (out,))
            detached.meta = dict(out.meta)
            out.replace_all_uses_with(detached,
                                      delete_user_cb=lambda n, new=detached: n is not new)
    ep.graph_module.recompile()
    return ep
