"""The fallback kernel: an op with no kernel runs its NumPy reference and copies the result
into its planned output buffer. `dispatch_report()` lists every node that runs this way."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ...ir.node import Node
from .registry import Dispatch, Kernel

__all__ = ["reference_kernel"]


def reference_kernel(node: Node, symbols: Mapping[str, int], why: str | None = None
                     ) -> Kernel:
    """The kernel running `node`'s reference; `why`, when given, says in its name why no
    other kernel runs it (a build limit reached, see codegen.builds)."""
    op = node.op
    n_in = len(node.inputs)
    kw = {"symbols": dict(symbols)} if getattr(op, "needs_symbols", False) else {}

    def run(*arrays):
        res = op.reference(*arrays[:n_in], **kw)
        for out, r in zip(arrays[n_in:], res if isinstance(res, tuple) else (res,),
                          strict=True):
            np.copyto(out, r, casting="unsafe")

    name = f"reference {op.label}" + (f" ({why})" if why else "")
    return Kernel(run, Dispatch.REFERENCE, name)
