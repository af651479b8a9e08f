"""softmax_cross_entropy and its backward as whole-array NumPy kernels: the ops' own max-shifted
references (so bit-identical to the interpreter), which check every class label. Without them
the executor would run the ops' decomposition, whose one-hot reads a label outside [0, C) (or
torch's ignore_index -100 on a loss without `ignore_index`) as no class and silently returns a
number; here such a label is an InterpretError naming the node."""
from __future__ import annotations

import numpy as np

from ...errors import InterpretError
from ...ir.ops.loss import SoftmaxCrossEntropy, SoftmaxCrossEntropyBackward
from .registry import Dispatch, Kernel, nbytes, register_kernel


@register_kernel(SoftmaxCrossEntropy, SoftmaxCrossEntropyBackward)
def softmax_cross_entropy(node, ins, outs, ctx):
    op, n_in = node.op, len(node.inputs)
    where = node.label + (f" [{node.provenance}]" if node.provenance else "")

    def run(*arrays):
        try:
            result = op.reference(*arrays[:n_in])
        except InterpretError as e:
            raise InterpretError(f"{where}: {e}") from None
        np.copyto(arrays[n_in], result, casting="unsafe")

    return Kernel(run, Dispatch.NATIVE, f"NumPy {op.kind} (labels checked)",
                  bytes=nbytes(ins) + nbytes(outs), flops=6 * (ins[0].numel() or 0))
