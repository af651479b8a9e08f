"""Tensor-creating ATen ops: arange (a braze `range` whose length may be symbolic), full / zeros /
ones / empty and their `_like` and `new_` forms (a scalar constant expanded to the dims, so a
mask of ones over ("batch", "seq") costs nothing), scalar_tensor and fill. `empty` has no defined
values in torch; braze fills it with zeros."""
from __future__ import annotations

import numpy as np

from ....ir.symbolic import SymDim
from ..context import Call, TorchContext, converter
from .shape import dims_arg


def filled(ctx: TorchContext, value, dims: tuple):
    """`value` (a number or a size) broadcast to `dims`, in the node's dtype."""
    dt = ctx.out_dtype()
    if isinstance(value, SymDim) and value.is_const:
        value = value.const
    if isinstance(value, (bool, int, float)) and not isinstance(value, SymDim):
        scalar = ctx.g.constant(np.asarray(value).astype(dt.np), dt)
    else:
        scalar = ctx.value(value, dt)
    return scalar if dims == () else ctx.g.expand(scalar, dims)


@converter("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def arange(ctx, c: Call):
    start = c.args.get("start", 0) if c.key != "aten.arange.default" else 0
    step = c.args.get("step", 1) if c.key == "aten.arange.start_step" else 1
    dt = ctx.out_dtype()
    (length,) = ctx.out_dims()
    if isinstance(step, SymDim):
        step = ctx.static_int(step, "arange step")
    start_s = start if isinstance(start, SymDim) else None
    if start_s is not None and start_s.is_const:
        start, start_s = start_s.const, None
    r = ctx.g.arange(length, 0 if start_s is not None else start, step, dt)
    if start_s is not None:
        r = ctx.g.add(r, ctx.value(start_s, dt))
    return r


@converter("aten.full.default", "aten.full.names")
def full(ctx, c):
    return filled(ctx, c["fill_value"], ctx.out_dims())


@converter("aten.zeros.default", "aten.empty.memory_format", "aten.empty.default",
           "aten.zeros_like.default", "aten.empty_like.default", "aten.new_zeros.default",
           "aten.new_empty.default", "aten.empty_strided.default",
           "aten.new_empty_strided.default")
def zeros(ctx, c):
    return filled(ctx, 0, ctx.out_dims())


@converter("aten.ones.default", "aten.ones_like.default", "aten.new_ones.default")
def ones(ctx, c):
    return filled(ctx, 1, ctx.out_dims())


@converter("aten.full_like.default", "aten.new_full.default", "aten.fill.Scalar",
           "aten.fill.Tensor")
def full_like(ctx, c):
    value = c.args.get("fill_value", c.args.get("value"))
    if ctx.is_tensor(value):
        v = ctx.value(value, ctx.out_dtype())
        if ctx.rank(v):
            v = ctx.g.reshape(v, ())
        dims = ctx.out_dims()
        return v if dims == () else ctx.g.expand(v, dims)
    return filled(ctx, value, ctx.out_dims())


@converter("aten.scalar_tensor.default")
def scalar_tensor(ctx, c):
    return filled(ctx, c["s"], ())


@converter("aten.zeros.names", "aten.ones.names")
def named(ctx, c):
    raise ctx.fail("named tensors are not supported")


@converter("aten.linspace.default")
def linspace(ctx, c):
    steps = ctx.static_int(c["steps"], "linspace steps")
    start, end = float(c["start"]), float(c["end"])
    vals = np.linspace(start, end, steps)
    return ctx.g.constant(vals.astype(ctx.out_dtype().np), ctx.out_dtype())


__all__ = ["filled", "dims_arg"]
