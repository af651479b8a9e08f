"""Normalizations: layer_norm (and native_layer_norm's mean / rstd when read), rms_norm (eps None
means the dtype's machine epsilon, as torch), group_norm, and inference batch_norm (every ATen
spelling: batch_norm, _native_batch_norm_legit_no_training, native_batch_norm in eval mode), and
batch norm with batch statistics and no running ones (`_native_batch_norm_legit.no_stats`: what
InstanceNorm and BiT's weight standardization export as), written as reductions over the input."""
from __future__ import annotations

import numpy as np

from ....ir.ops.reduce import ReduceFn
from ..context import Call, Lazy, TorchContext, converter


def _affine(ctx: TorchContext, c: Call, dt, wkey="weight", bkey="bias"):
    w, b = c.args.get(wkey), c.args.get(bkey)
    return (None if w is None else ctx.value(w, dt)), (None if b is None else ctx.value(b, dt))


def _axis(ctx, x, normalized_shape) -> int:
    n = len(ctx.static_ints(normalized_shape, "normalized_shape"))
    rank = ctx.rank(x)
    if not 1 <= n <= rank:
        raise ctx.fail(f"normalized_shape of {n} dims does not fit an input of rank {rank}")
    return rank - n


@converter("aten.layer_norm.default")
def layer_norm(ctx, c):
    dt = ctx.out_dtype()
    x = ctx.value(c["input"], dt)
    w, b = _affine(ctx, c, dt)
    axis = _axis(ctx, x, c["normalized_shape"])
    return ctx.g.layer_norm(x, w, b, float(c.get("eps", 1e-5)), axis)


def _stats(ctx, x, axis: int, eps: float):
    """(mean, rstd) with keepdims over axes axis.., as native_layer_norm returns them."""
    g = ctx.g
    axes = tuple(range(axis, ctx.rank(x)))
    m = g.reduce(x, ReduceFn.MEAN, axes, True)
    d = g.sub(x, m)
    var = g.reduce(g.mul(d, d), ReduceFn.MEAN, axes, True)
    return m, g.rsqrt(g.add(var, ctx.value(float(eps), ctx.dtype(x))))


@converter("aten.native_layer_norm.default")
def native_layer_norm(ctx, c):
    dt = ctx.out_dtype(0)
    x = ctx.value(c["input"], dt)
    w, b = _affine(ctx, c, dt)
    axis = _axis(ctx, x, c["normalized_shape"])
    eps = float(c["eps"])
    y = ctx.g.layer_norm(x, w, b, eps, axis)
    stats = Lazy(lambda: _stats(ctx, x, axis, eps))
    return (y, Lazy(lambda: stats.get()[0]), Lazy(lambda: stats.get()[1]))


@converter("aten.rms_norm.default")
def rms_norm(ctx, c):
    dt = ctx.out_dtype()
    x = ctx.value(c["input"], dt)
    w = c.args.get("weight")
    w = None if w is None else ctx.value(w, dt)
    eps = c.args.get("eps")
    if eps is None:  # torch's default: the eps of the type it computes in (f32 for f16 / bf16)
        eps = float(np.finfo(np.float64 if dt.name == "f64" else np.float32).eps)
    return ctx.g.rms_norm(x, w, None, float(eps), _axis(ctx, x, c["normalized_shape"]))


@converter("aten.group_norm.default")
def group_norm(ctx, c):
    dt = ctx.out_dtype()
    x = ctx.value(c["input"], dt)
    w, b = _affine(ctx, c, dt)
    groups = ctx.static_int(c["num_groups"], "num_groups")
    return ctx.g.group_norm(x, groups, w, b, float(c.get("eps", 1e-5)))


@converter("aten.native_group_norm.default")
def native_group_norm(ctx, c):
    dt = ctx.out_dtype(0)
    x = ctx.value(c["input"], dt)
    w, b = _affine(ctx, c, dt)
    y = ctx.g.group_norm(x, ctx.static_int(c["group"], "group"), w, b, float(c["eps"]))
    err = ctx.fail("native_group_norm's mean / rstd outputs are not supported")

    def extra():
        raise err

    return (y, Lazy(extra), Lazy(extra))


def _batch_norm(ctx, c: Call, dt):
    x = ctx.value(c["input"], dt)
    dims = ctx.dims(x)
    if ctx.rank(x) < 2:
        raise ctx.fail(f"batch_norm needs [N, C, ...], got {dims}")
    ch = (dims[1],)
    mean, var = c.args.get("running_mean"), c.args.get("running_var")
    if mean is None or var is None:
        raise ctx.fail("batch_norm without running statistics normalizes with batch "
                       "statistics (training); call module.eval() before importing")
    w, b = _affine(ctx, c, dt)
    g = ctx.g
    w = w if w is not None else g.expand(ctx.value(1.0, dt), ch)
    b = b if b is not None else g.expand(ctx.value(0.0, dt), ch)
    return g.batch_norm(x, w, b, ctx.value(mean, dt), ctx.value(var, dt), float(c["eps"]))


@converter("aten.batch_norm.default", "aten._native_batch_norm_legit_no_training.default",
           "aten.native_batch_norm.default", "aten._batch_norm_impl_index.default",
           "aten._native_batch_norm_legit.default")
def batch_norm(ctx, c):
    if c.args.get("training"):
        raise ctx.fail("batch_norm in training mode uses batch statistics; call module.eval() "
                       "before importing")
    dt = ctx.out_dtype(0)
    y = _batch_norm(ctx, c, dt)
    if c.key == "aten.batch_norm.default":
        return y
    n_out = len(c.node.meta["val"]) if isinstance(c.node.meta.get("val"), (list, tuple)) else 1
    empty = Lazy(lambda: ctx.g.constant(np.zeros((0,), dt.np), dt))
    return (y,) + tuple(empty for _ in range(n_out - 1))


@converter("aten._native_batch_norm_legit.no_stats")
def batch_norm_batch_stats(ctx, c):
    """Normalize [N, C, ...] with its own statistics over every axis but the channel axis 1
    (biased variance), then the optional per-channel affine. Returns (output, save_mean,
    save_invstd), the statistics as [C] vectors. Written as reductions rather than a braze
    batch_norm: the statistics depend on the input, so the conv + batch_norm folds must not
    see running statistics here."""
    if not c.args.get("training"):
        raise ctx.fail("batch_norm without running statistics outside training mode has no "
                       "statistics to normalize with")
    g = ctx.g
    dt = ctx.out_dtype(0)
    x = ctx.value(c["input"], dt)
    rank = ctx.rank(x)
    if rank < 2:
        raise ctx.fail(f"batch_norm needs [N, C, ...], got {ctx.dims(x)}")
    axes = (0,) + tuple(range(2, rank))
    m = g.reduce(x, ReduceFn.MEAN, axes, True)
    d = g.sub(x, m)
    var = g.reduce(g.mul(d, d), ReduceFn.MEAN, axes, True)
    invstd = g.rsqrt(g.add(var, ctx.value(float(c["eps"]), dt)))
    y = g.mul(d, invstd)
    w, b = _affine(ctx, c, dt)
    per_channel = (-1,) + (1,) * (rank - 2)
    if w is not None:
        y = g.mul(y, g.reshape(w, per_channel))
    if b is not None:
        y = g.add(y, g.reshape(b, per_channel))
    return (y, Lazy(lambda: g.reshape(m, (-1,))), Lazy(lambda: g.reshape(invstd, (-1,))))
