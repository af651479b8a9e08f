"""softmax_cross_entropy and its backward as whole-array NumPy kernels that check every class
label first (the ops' `counted_rows`): the ops' decomposition, which the executor would run
otherwise, reads a label outside [0, C) (or torch's ignore_index -100 on a loss without
`ignore_index`) as no class and silently returns a number; here it is an InterpretError naming
the node. Neither builds a one-hot: the loss is logsumexp(y) - y[label] per row (probability
labels: sum(t) logsumexp(y) - sum(t y)), the backward writes softmax(y) * scale into its output
and subtracts the scale at each row's label. Both compute in float32 for f16 / bf16 logits, as
the references do, and max-shift the logits."""
from __future__ import annotations

import numpy as np

from ...errors import InterpretError
from ...ir.ops.loss import LossReduction, SoftmaxCrossEntropy, SoftmaxCrossEntropyBackward
from ...ir.ops.reduce import compute_dtype
from .registry import Dispatch, Kernel, nbytes, register_kernel


def _where(node) -> str:
    return node.label + (f" [{node.provenance}]" if node.provenance else "")


def _rows(node, logits, labels):
    """(logits as compute-dtype rows [N, C], labels as [N] (ignored rows read class 0) or rows
    [N, C] of probabilities, rows kept [N] or None, the row count)."""
    op = node.op
    c = logits.shape[-1]
    try:
        kept, count = op.counted_rows(labels, c)
    except InterpretError as e:
        raise InterpretError(f"{_where(node)}: {e}") from None
    y = logits.reshape(-1, c).astype(compute_dtype(logits), copy=False)
    if op.soft_labels:
        return y, labels.reshape(-1, c).astype(y.dtype, copy=False), None, count
    lab = labels.reshape(-1)
    if kept is not None:
        kept = kept.reshape(-1)
        lab = np.where(kept, lab, 0)
    return y, lab, kept, count


def _exp_shifted(y, out):
    """out = exp(y - rowmax(y)); returns (rowmax [N], rowsum of out [N])."""
    m = y.max(axis=-1, keepdims=True)
    np.subtract(y, m, out=out)
    np.exp(out, out=out)
    return m[:, 0], out.sum(axis=-1)


@register_kernel(SoftmaxCrossEntropy)
def softmax_cross_entropy(node, ins, outs, ctx):
    op = node.op
    rows_shape = (int(np.prod(ins[0].dims[:-1], dtype=np.int64)), int(ins[0].dims[-1]))
    work = np.dtype(compute_dtype(np.empty(0, ins[0].dtype.np)))

    def run(logits, labels, out, scratch):
        y, lab, kept, count = _rows(node, logits, labels)
        m, s = _exp_shifted(y, scratch)
        lse = np.log(s) + m
        if op.soft_labels:
            per = lse * lab.sum(axis=-1) - np.einsum("ij,ij->i", lab, y)
        else:
            per = lse - y[np.arange(y.shape[0]), lab]
            if kept is not None:
                per = np.where(kept, per, 0)
        if op.reduction is LossReduction.NONE:
            np.copyto(out, per.reshape(out.shape), casting="unsafe")
            return
        total = per.sum()
        if op.reduction is LossReduction.MEAN:
            with np.errstate(invalid="ignore"):  # every row ignored: NaN, as torch
                total = total / y.dtype.type(count)
        np.copyto(out, total, casting="unsafe")

    return Kernel(run, Dispatch.NATIVE, f"NumPy {op.kind} (labels checked)",
                  scratch=((rows_shape, work),), bytes=nbytes(ins) + nbytes(outs),
                  flops=5 * (ins[0].numel() or 0))


@register_kernel(SoftmaxCrossEntropyBackward)
def softmax_cross_entropy_backward(node, ins, outs, ctx):
    op = node.op
    c = int(ins[0].dims[-1])
    rows_shape = (int(np.prod(ins[0].dims[:-1], dtype=np.int64)), c)
    work = np.dtype(compute_dtype(np.empty(0, ins[0].dtype.np)))
    in_place = work == np.dtype(outs[0].dtype.np)

    def run(logits, labels, d_loss, out, *scratch):
        y, lab, kept, count = _rows(node, logits, labels)
        grad = out.reshape(-1, c) if in_place else scratch[0]
        _, s = _exp_shifted(y, grad)
        scale = np.asarray(d_loss, dtype=y.dtype).reshape(-1)
        if op.reduction is LossReduction.MEAN:
            with np.errstate(invalid="ignore", divide="ignore"):
                scale = scale / y.dtype.type(count)
        scale = np.broadcast_to(scale, s.shape)
        if kept is not None:
            scale = scale * kept
        grad *= (scale / s)[:, None]
        if op.soft_labels:
            grad -= lab * scale[:, None]
        else:
            grad[np.arange(grad.shape[0]), lab] -= scale
        if not in_place:
            np.copyto(out, grad.reshape(out.shape), casting="unsafe")

    return Kernel(run, Dispatch.NATIVE, f"NumPy {op.kind} (labels checked)",
                  scratch=() if in_place else ((rows_shape, work),),
                  bytes=nbytes(ins) + nbytes(outs), flops=5 * (ins[0].numel() or 0))
