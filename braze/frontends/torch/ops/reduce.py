"""Reductions and scans: sum / mean / prod / amax / amin / max / min (with indices), var / std
(any correction, integral or not), vector norms (linalg_vector_norm: any ord), any / all,
argmax / argmin, cumsum, softmax / log_softmax, logsumexp, topk and sort. Integer and bool sums
take torch's result dtype first."""
from __future__ import annotations

import numpy as np

from ....ir.dtypes import bool_
from ....ir.ops.reduce import ReduceFn
from ....ir.symbolic import SymDim
from ...norms import root_of_sum
from ..context import Call, TorchContext, converter


def _axes(ctx: TorchContext, dims, rank: int) -> tuple[int, ...]:
    """A reduction's `dim` argument (None or [] meaning every axis) as sorted axes."""
    if dims is None:
        return tuple(range(rank))
    if isinstance(dims, (int, SymDim)):
        dims = [dims]
    if not dims:
        return tuple(range(rank))
    return tuple(sorted({ctx.axis(a, rank) for a in ctx.static_ints(dims, "dim")}))


def _reduce(ctx, c: Call, fn: ReduceFn, dims_key: str = "dim"):
    x = ctx.value(c["self"], ctx.out_dtype(0))
    axes = _axes(ctx, c.args.get(dims_key), ctx.rank(x))
    if not axes:  # a scalar input
        return x
    return ctx.g.reduce(x, fn, axes, bool(c.get("keepdim", False)))


@converter("aten.sum.dim_IntList", "aten.sum.default")
def sum_(ctx, c):
    return _reduce(ctx, c, ReduceFn.SUM)


@converter("aten.mean.dim", "aten.mean.default")
def mean(ctx, c):
    return _reduce(ctx, c, ReduceFn.MEAN)


@converter("aten.prod.dim_int", "aten.prod.default")
def prod(ctx, c):
    return _reduce(ctx, c, ReduceFn.PROD)


@converter("aten.amax.default", "aten.max.default")
def amax(ctx, c):
    return _reduce(ctx, c, ReduceFn.MAX)


@converter("aten.amin.default", "aten.min.default")
def amin(ctx, c):
    return _reduce(ctx, c, ReduceFn.MIN)


@converter("aten.any.dim", "aten.any.dims", "aten.any.default", "aten.all.dim",
           "aten.all.dims", "aten.all.default")
def any_all(ctx, c):
    x = ctx.value(c["self"], bool_)
    axes = _axes(ctx, c.args.get("dim"), ctx.rank(x))
    if not axes:
        return ctx.cast(x, ctx.out_dtype())
    fn = ReduceFn.MAX if ".any." in c.key else ReduceFn.MIN
    y = ctx.g.reduce(x, fn, axes, bool(c.get("keepdim", False)))
    return ctx.cast(y, ctx.out_dtype())


def _arg(ctx, x, axis, keepdim: bool, largest: bool):
    if not largest:
        x = ctx.g.logical_not(x) if ctx.dtype(x) == bool_ else ctx.g.neg(x)
    return ctx.g.argmax(x, axis, keepdim)


@converter("aten.argmax.default", "aten.argmin.default")
def argmax(ctx, c):
    x = ctx.value(c["self"])
    dim = c.args.get("dim")
    keep = bool(c.get("keepdim", False))
    if dim is None:
        x, axis, keep = ctx.g.reshape(x, (-1,)), 0, False
        y = _arg(ctx, x, axis, False, c.key == "aten.argmax.default")
        return ctx.g.reshape(y, ctx.out_dims()) if ctx.out_dims() != () else y
    axis = ctx.axis(ctx.static_int(dim, "dim"), ctx.rank(x))
    return _arg(ctx, x, axis, keep, c.key == "aten.argmax.default")


@converter("aten.max.dim", "aten.min.dim")
def max_dim(ctx, c):
    x = ctx.value(c["self"])
    axis = ctx.axis(ctx.static_int(c["dim"], "dim"), ctx.rank(x))
    keep = bool(c.get("keepdim", False))
    fn = ReduceFn.MAX if c.key == "aten.max.dim" else ReduceFn.MIN
    return (ctx.g.reduce(x, fn, (axis,), keep), _arg(ctx, x, axis, keep, fn is ReduceFn.MAX))


def _count(ctx, x, axes) -> SymDim:
    n = SymDim.of(1)
    for a in axes:
        n = n * SymDim.of(ctx.dims(x)[a])
    return n


def _correction(c: Call) -> float:
    """torch's `correction` (an int or a float: torch.export writes 1.0), or the legacy
    `unbiased` flag (True means 1)."""
    corr = c.args.get("correction")
    if corr is None:
        return 1.0 if c.args.get("unbiased", True) else 0.0
    if isinstance(corr, SymDim):
        corr = corr.const if corr.is_const else corr
    if isinstance(corr, SymDim) or isinstance(corr, bool):
        raise TypeError(f"correction {corr!r} must be a number")
    return float(corr)


def _bessel(ctx, x, axes, corr: float):
    """n / (n - corr) for the `n` elements reduced over: a constant for static sizes, else
    computed from the sizes at run time."""
    n = _count(ctx, x, axes)
    dt = ctx.dtype(x)
    if n.is_const:
        with np.errstate(divide="ignore", invalid="ignore"):
            factor = np.float64(n.const) / np.float64(max(n.const - corr, 0.0))
        return ctx.value(float(factor), dt)
    if corr.is_integer():
        return ctx.g.div(ctx.value(n, dt), ctx.value(n - int(corr), dt))
    nv = ctx.value(n, dt)
    return ctx.g.div(nv, ctx.g.sub(nv, ctx.value(corr, dt)))


def _var(ctx, c: Call):
    """(variance, mean) over the reduced axes with torch's `correction` (default 1; any real
    number: the sum of squares is divided by n - correction)."""
    g = ctx.g
    x = ctx.value(c["self"], ctx.out_dtype(0))
    axes = _axes(ctx, c.args.get("dim"), ctx.rank(x))
    keep = bool(c.get("keepdim", False))
    corr = _correction(c)
    m = g.reduce(x, ReduceFn.MEAN, axes, True)
    d = g.sub(x, m)
    var = g.reduce(g.mul(d, d), ReduceFn.MEAN, axes, keep)
    if corr:
        var = g.mul(var, _bessel(ctx, x, axes, corr))
    mean = m if keep else g.reduce(x, ReduceFn.MEAN, axes, False)
    return var, mean


@converter("aten.var.correction", "aten.var.dim", "aten.var.default")
def var(ctx, c):
    return _var(ctx, c)[0]


@converter("aten.std.correction", "aten.std.dim", "aten.std.default")
def std(ctx, c):
    return ctx.g.sqrt(_var(ctx, c)[0])


@converter("aten.var_mean.correction", "aten.var_mean.dim")
def var_mean(ctx, c):
    return _var(ctx, c)


@converter("aten.std_mean.correction", "aten.std_mean.dim")
def std_mean(ctx, c):
    v, m = _var(ctx, c)
    return ctx.g.sqrt(v), m


@converter("aten.linalg_vector_norm.default")
def vector_norm(ctx, c):
    """The `ord`-norm over `dim` (None or []: every axis), computed in `dtype` when given (the
    output dtype torch recorded): max / min |x| for +-inf, the count of non-zeros for 0,
    sqrt(sum(x*x)) for 2, sum |x| for 1, else sum(|x|^p)^(1/p); a zero vector's norm has
    torch's zero gradient (`root_of_sum`)."""
    g = ctx.g
    if ctx.dtype(c["self"]).kind == "complex":
        raise ctx.fail("vector norms of complex tensors are not supported")
    dt = ctx.out_dtype()
    x = ctx.value(c["self"], dt)
    p = float(c.get("ord", 2.0))
    axes = _axes(ctx, c.args.get("dim"), ctx.rank(x))
    keep = bool(c.get("keepdim", False))

    def total(v, fn: ReduceFn = ReduceFn.SUM):
        return g.reduce(v, fn, axes, keep) if axes else v

    if p == 2:
        return root_of_sum(g, total(g.mul(x, x)), g.sqrt)
    if p == 0:
        return total(ctx.cast(g.ne(x, ctx.value(0.0, dt)), dt))
    a = g.abs(x)
    if p == 1:
        return total(a)
    if np.isinf(p):
        return total(a, ReduceFn.MAX if p > 0 else ReduceFn.MIN)
    return root_of_sum(g, total(g.pow(a, ctx.value(p, dt))),
                       lambda s: g.pow(s, ctx.value(1.0 / p, dt)))


@converter("aten.cumsum.default")
def cumsum(ctx, c):
    x = ctx.value(c["self"], ctx.out_dtype())
    return ctx.g.cumsum(x, ctx.axis(ctx.static_int(c["dim"], "dim"), ctx.rank(x)))


@converter("aten.softmax.int", "aten._softmax.default", "aten.special_softmax.default")
def softmax(ctx, c):
    x = ctx.value(c["self"], ctx.out_dtype())
    return ctx.g.softmax(x, ctx.axis(ctx.static_int(c["dim"], "dim"), ctx.rank(x)))


@converter("aten.log_softmax.int", "aten._log_softmax.default",
           "aten.special_log_softmax.default")
def log_softmax(ctx, c):
    x = ctx.value(c["self"], ctx.out_dtype())
    return ctx.g.log_softmax(x, ctx.axis(ctx.static_int(c["dim"], "dim"), ctx.rank(x)))


@converter("aten.logsumexp.default")
def logsumexp(ctx, c):
    g = ctx.g
    x = ctx.value(c["self"], ctx.out_dtype())
    axes = _axes(ctx, c.args.get("dim"), ctx.rank(x))
    keep = bool(c.get("keepdim", False))
    m = g.reduce(x, ReduceFn.MAX, axes, True)
    m = g.where(g.isinf(m), ctx.value(0.0, ctx.dtype(x)), m)
    s = g.log(g.reduce(g.exp(g.sub(x, m)), ReduceFn.SUM, axes, True))
    y = g.add(s, m)
    if not keep:
        y = g.reshape(y, ctx.out_dims())
    return y


@converter("aten.topk.default")
def topk(ctx, c):
    x = ctx.value(c["self"])
    k = ctx.static_int(c["k"], "topk k")
    axis = ctx.axis(ctx.static_int(c.get("dim", -1), "dim"), ctx.rank(x))
    return ctx.g.top_k(x, k, axis, bool(c.get("largest", True)), True)


@converter("aten.sort.default", "aten.sort.stable")
def sort(ctx, c):
    x = ctx.value(c["self"])
    axis = ctx.axis(ctx.static_int(c.get("dim", -1), "dim"), ctx.rank(x))
    k = ctx.static_int(ctx.dims(x)[axis], "the sorted dim")
    return ctx.g.top_k(x, k, axis, bool(c.get("descending", False)), True)

