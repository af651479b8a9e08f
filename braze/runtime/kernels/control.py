"""If / While kernels: each body is compiled once (`bz.compile`, fused for the CPU, with the
outer executable's precision policy and thread cap) and the kernel runs the control flow in
Python between body calls. So the compiled executor keeps the ops' own semantics (only the
taken branch runs; a loop stops as soon as its cond fails, and running past `max_iterations` is
an error naming the node) instead of unrolling them."""
from __future__ import annotations

import numpy as np

from ...errors import InterpretError
from ...ir.graph import Graph
from ...ir.ops.control import If, While
from .registry import Dispatch, Kernel, register_kernel


class _Body:
    """A body graph compiled once as `ctx` says (precision, threads); called with arrays in
    input order, returns its outputs."""

    def __init__(self, g: Graph, in_dims, ctx):
        from ..executable import compile as compile_graph

        self.names = [g.nodes[i].op.name for i in g.input_ids]
        self.in_dims = [tuple(d) for d in in_dims]  # the executor may hand scalars as [1]
        self.exe = compile_graph(g, precision=ctx.precision, threads=ctx.threads or None)

    def __call__(self, arrays) -> list[np.ndarray]:
        return self.exe({n: np.reshape(a, d) for n, a, d in zip(self.names, arrays,
                                                                 self.in_dims)})


def _write(outputs, results) -> None:
    for out, r in zip(outputs, results, strict=True):
        np.copyto(out, np.reshape(r, out.shape), casting="unsafe")


@register_kernel(If)
def if_kernel(node, ins, outs, ctx):
    dims = [s.dims for s in ins[1:]]
    then_b, else_b = (_Body(node.op.then_graph, dims, ctx),
                      _Body(node.op.else_graph, dims, ctx))
    n_in = len(ins)

    def run(*arrays):
        branch = then_b if bool(arrays[0]) else else_b
        _write(arrays[n_in:], branch(arrays[1:n_in]))

    return Kernel(run, Dispatch.NATIVE, "if: compiled branches")


@register_kernel(While)
def while_kernel(node, ins, outs, ctx):
    op: While = node.op
    dims = [s.dims for s in ins]
    cond, step = _Body(op.cond_graph, dims, ctx), _Body(op.body_graph, dims, ctx)
    n_in = len(ins)

    def run(*arrays):
        vals, runs = list(arrays[:n_in]), 0
        while bool(cond(vals)[0]):
            if op.max_iterations is not None and runs >= op.max_iterations:
                raise InterpretError(f"{node.describe()}: while loop still running after "
                                     f"max_iterations={op.max_iterations} iterations; raise "
                                     "max_iterations or check the loop condition")
            vals, runs = step(vals), runs + 1
        _write(arrays[n_in:], vals)

    return Kernel(run, Dispatch.NATIVE, "while: compiled cond and body")
