"""Scatter ATen ops: scatter (a tensor or a scalar source, with or without the deprecated
`reduce="add" | "multiply"`), scatter_add and scatter_reduce (sum, prod, mean, amax, amin,
`include_self`), all through `braze.frontends.scatter.scatter_along` (a one-hot compare and a
reduction; braze has no scatter op). Only the leading `index.shape` block of the source is
read, as in torch; the written values keep torch's ties (the last write wins)."""
from __future__ import annotations

from ...scatter import scatter_along
from ..context import Call, TorchContext, converter

_REDUCE = {None: "none", "add": "add", "multiply": "mul", "sum": "add", "prod": "mul",
           "mean": "mean", "amax": "max", "amin": "min"}


@converter("aten.scatter.src", "aten.scatter.value", "aten.scatter.reduce",
           "aten.scatter.value_reduce", "aten.scatter_add.default", "aten.scatter_reduce.two")
def scatter(ctx: TorchContext, c: Call):
    g = ctx.g
    x = ctx.value(c["self"])
    dt = ctx.dtype(x)
    index = ctx.value(c["index"])
    rank = ctx.rank(x)
    if ctx.rank(index) != rank:
        raise ctx.fail(f"index has rank {ctx.rank(index)} but self has rank {rank}; torch "
                       "scatters need one rank")
    dim = ctx.axis(ctx.static_int(c["dim"], "scatter dim"), rank)
    idims = ctx.dims(index)
    if "src" in c.args:
        src = ctx.value(c["src"], dt)
        sdims = ctx.dims(src)
        for ax, (i, s) in enumerate(zip(idims, sdims)):
            if i != s:
                src = g.narrow(src, ax, 0, i)
    else:
        src = g.expand(ctx.value(c["value"], dt), idims)
    reduction = c.get("reduce")
    if c.key == "aten.scatter_add.default":
        reduction = "add"
    if reduction not in _REDUCE:
        raise ctx.fail(f"scatter reduce={reduction!r} is not supported (one of "
                       f"{', '.join(k for k in _REDUCE if k)})")
    return scatter_along(g, x, index, src, dim, _REDUCE[reduction],
                         include_self=bool(c.get("include_self", True)), wrap_negative=False)
