"""ONNX normalizations over the channel axis: BatchNormalization (inference and training form),
InstanceNormalization, GroupNormalization, LpNormalization and LRN.

Training-form BatchNormalization (training_mode=1, or the running / saved statistics outputs
before opset 14) normalizes with the statistics of its own input, as the spec says; the
TorchScript exporter writes it for `F.batch_norm(..., training=True)` even in an eval-mode
model, e.g. the weight standardization of BiT's convolutions. When that input is a stored
weight the result is computed at import and becomes a weight itself."""
from __future__ import annotations

import numpy as np

from ....ir.ops.io import Constant, Param
from ....ir.ops.reduce import ReduceFn
from ....ir.shapes import Shape
from ...norms import root_of_sum
from ..context import converter
from ..dtypes import onnx_dtype
from ..known import Known

_MOMENTUM = 0.9  # ONNX's default


# -- BatchNormalization -------------------------------------------------------------------------
@converter("BatchNormalization")
def batch_norm(ctx, node):
    """Inference form: normalize with the given running mean / variance. Training form: with the
    batch statistics (over every axis but 1), plus the updated running statistics when the
    node names those outputs."""
    if _training(ctx, node):
        return _batch_norm_training(ctx, node)
    x = ctx.value(node, 0)
    stats = [_as_dtype(ctx, ctx.value(node, i), ctx.dtype(x)) for i in range(1, 5)]
    return [ctx.g.batch_norm(x, *stats, eps=float(node.attr("epsilon", 1e-5)))]


def _training(ctx, node) -> bool:
    extra = [i for i, o in enumerate(node.outputs) if o and i > 0]
    if ctx.opset >= 14:
        if node.attr("training_mode", 0):
            return True
        if extra:
            raise ctx.fail(node, "BatchNormalization with training_mode=0 has no running_mean / "
                                 "running_var outputs (they exist only with training_mode=1); "
                                 "drop the extra outputs or set training_mode=1")
        return False
    # opsets 9-13: the statistics outputs are what make the node a training step
    if 4 in extra:
        raise ctx.fail(node, "BatchNormalization's saved_var output (opsets 9-13) is not "
                             "supported: ONNX leaves its meaning open (ONNX Runtime returns "
                             "1 / sqrt(var + epsilon)); read the variance from the running var "
                             "output or use opset 14's training_mode form")
    return bool(extra)


def _batch_norm_training(ctx, node):
    """Y from the batch statistics of x; running_mean / running_var (opset >= 14: outputs 1, 2;
    before: outputs 1, 2 and saved_mean 3) = input * momentum + batch * (1 - momentum), with
    the population variance as ONNX's reference computes it."""
    g = ctx.g
    x = ctx.value(node, 0)
    dims, dt = ctx.dims(x), ctx.dtype(x)
    if len(dims) < 2 or not dt.is_float:
        raise ctx.fail(node, f"BatchNormalization needs a float [N, C, ...] input, got {dt}"
                             f"{list(dims)}")
    eps, momentum = float(node.attr("epsilon", 1e-5)), float(node.attr("momentum", _MOMENTUM))
    axes = [0] + list(range(2, len(dims)))
    arrays = [_static_array(ctx, node, i) for i in range(3)]
    if all(a is not None for a in arrays):
        y, mean, var = _fold_training(ctx, node, *arrays, axes, eps)
    else:
        mean = g.reduce(x, ReduceFn.MEAN, axes, False)
        centered = g.sub(x, g.reduce(x, ReduceFn.MEAN, axes, True))
        var = g.reduce(g.mul(centered, centered), ReduceFn.MEAN, axes, False)
        scale, bias = (_as_dtype(ctx, ctx.value(node, i), dt) for i in (1, 2))
        y = g.batch_norm(x, scale, bias, mean, var, eps=eps)
    outs = [y]
    for i, batch in ((1, mean), (2, var)):
        outs.append(_running(ctx, node, i, batch, momentum) if _named(node, i) else None)
    if _named(node, 3):
        outs.append(mean)
    return outs


def _fold_training(ctx, node, x, scale, bias, axes, eps):
    """Training-form BatchNormalization of a stored tensor, computed now (in float64, rounded
    to x's dtype): (y as a weight, batch mean, batch variance as compile-time values)."""
    dt = ctx.dtype(ctx.value(node, 0))
    x64 = np.asarray(x, np.float64)
    mean, var = x64.mean(axis=tuple(axes)), x64.var(axis=tuple(axes))
    bshape = (-1,) + (1,) * (x64.ndim - 2)
    y = (x64 - mean.reshape(bshape)) / np.sqrt(var.reshape(bshape) + eps)
    y = y * np.asarray(scale, np.float64).reshape(bshape) + \
        np.asarray(bias, np.float64).reshape(bshape)
    y = y.astype(dt.np)
    if y.size == 1:
        y_out = Known(y, dt)
    else:
        with ctx.g.provenance_scope(node.name or node.outputs[0]):
            y_out = ctx.g.param(_fresh_param_name(ctx, node.outputs[0]), Shape(y.shape, dt),
                                value=y)
    return y_out, Known(mean.astype(dt.np), dt), Known(var.astype(dt.np), dt)


def _running(ctx, node, i: int, batch, momentum: float):
    """input_i * momentum + batch * (1 - momentum), in input_i's dtype."""
    stat = ctx.tensor(node, i + 2)
    if isinstance(batch, Known) and stat.known is not None and not stat.known.symbolic:
        out = np.asarray(stat.known.array, np.float64) * momentum + \
            np.asarray(batch.array, np.float64) * (1 - momentum)
        return Known(out.astype(stat.known.dtype.np), stat.known.dtype)
    g = ctx.g
    given = ctx.value(node, i + 2)
    b = ctx.materialize(batch) if isinstance(batch, Known) else batch
    b = _as_dtype(ctx, b, ctx.dtype(given))
    return g.add(g.mul(given, ctx.const_like(momentum, given)),
                 g.mul(b, ctx.const_like(1 - momentum, given)))


def _named(node, i: int) -> bool:
    return i < len(node.outputs) and bool(node.outputs[i])


def _as_dtype(ctx, v, dt):
    return v if ctx.dtype(v) == dt else ctx.g.cast(v, dt)


def _static_array(ctx, node, i: int) -> np.ndarray | None:
    """Input `i` as a NumPy array when it is fixed at import time (a compile-time value, a
    constant or a weight with a stored value), else None."""
    t = ctx.tensor(node, i)
    if t.known is not None:
        return None if t.known.symbolic else np.asarray(t.known.array)
    op = ctx.g.node(t.value).op
    if isinstance(op, Constant):
        return np.asarray(op.value)
    if isinstance(op, Param) and op.name in ctx.g.weights:
        return np.asarray(ctx.g.weights[op.name])
    return None


def _fresh_param_name(ctx, base: str) -> str:
    name, k = base, 1
    while ctx.g.has_name(name):
        name, k = f"{base}.{k}", k + 1
    return name


# -- InstanceNormalization, LpNormalization -----------------------------------------------------
@converter("InstanceNormalization")
def instance_norm(ctx, node):
    x = ctx.value(node, 0)
    dims = ctx.dims(x)
    if len(dims) < 3 or not isinstance(dims[1], int):
        raise ctx.fail(node, f"InstanceNormalization needs [N, C, ...] with a static C, got "
                             f"{dims}")
    return [ctx.g.group_norm(x, dims[1], ctx.value(node, 1), ctx.value(node, 2),
                             eps=float(node.attr("epsilon", 1e-5)))]


@converter("GroupNormalization")
def group_norm(ctx, node):
    """braze's group_norm. Opset 18-20 gives scale and bias per group ([num_groups]: each
    repeated over its group's channels), 21 on per channel ([C]); the statistics run in
    stash_type (float32 by default: a float16 input is normalized in float32, then cast back
    and scaled)."""
    g = ctx.g
    x = ctx.value(node, 0)
    dims = ctx.dims(x)
    groups = node.attr("num_groups", None)
    if len(dims) < 3 or not isinstance(dims[1], int):
        raise ctx.fail(node, f"GroupNormalization needs [N, C, ...] with a static C, got "
                             f"{dims}; pass input_shapes= to import_onnx to fix it")
    if not isinstance(groups, int) or groups < 1 or dims[1] % groups:
        raise ctx.fail(node, f"num_groups {groups!r} does not divide the {dims[1]} channels")
    c, eps = dims[1], float(node.attr("epsilon", 1e-5))
    scale, bias = ctx.value(node, 1), ctx.value(node, 2)
    want, per = (groups, "per group") if ctx.opset < 21 else (c, "per channel")
    for name, v in (("scale", scale), ("bias", bias)):
        if tuple(ctx.dims(v)) != (want,):
            raise ctx.fail(node, f"{name} has shape {tuple(ctx.dims(v))}; opset {ctx.opset} "
                                 f"takes [{want}] ({per})")
    if want != c:  # per group: each value over its group's c / groups channels
        scale, bias = ((g.reshape(g.expand(g.reshape(v, (groups, 1)), (groups, c // groups)),
                                  (c,))) for v in (scale, bias))
    stash = onnx_dtype(node.attr("stash_type", 1), f"{ctx.source}: node {node.label} stash_type")
    if ctx.dtype(x) == stash:
        return [g.group_norm(x, groups, scale, bias, eps=eps)]
    y = g.cast(g.group_norm(g.cast(x, stash), groups, eps=eps), ctx.dtype(x))
    at = (c,) + (1,) * (len(dims) - 2)
    return [g.add(g.mul(y, g.reshape(scale, at)), g.reshape(bias, at))]


@converter("LRN")
def lrn(ctx, node):
    """Local response normalization across channels (AlexNet, GoogLeNet): x / (bias + alpha /
    size * the sum of x^2 over the `size` channels around each one, zeros past the ends)^beta,
    the window floor((size - 1) / 2) channels before and ceil((size - 1) / 2) after."""
    g = ctx.g
    x = ctx.value(node, 0)
    dims = ctx.dims(x)
    size = node.attr("size", None)
    if len(dims) < 3 or not isinstance(dims[1], int):
        raise ctx.fail(node, f"LRN needs [N, C, ...] with a static C, got {dims}")
    if not isinstance(size, int) or size < 1:
        raise ctx.fail(node, f"LRN needs a positive int size, got {size!r}")
    alpha, beta = float(node.attr("alpha", 1e-4)), float(node.attr("beta", 0.75))
    before, c = (size - 1) // 2, dims[1]
    sq = g.mul(x, x)
    padded = g.pad(sq, [(0, 0), (before, size - 1 - before)] + [(0, 0)] * (len(dims) - 2))
    total = g.narrow(padded, 1, 0, c)
    for k in range(1, size):
        total = g.add(total, g.narrow(padded, 1, k, c))
    scale = g.add(ctx.const_like(float(node.attr("bias", 1.0)), x),
                  g.mul(ctx.const_like(alpha / size, x), total))
    return [g.div(x, g.pow(scale, ctx.const_like(beta, x)))]


@converter("LpNormalization")
def lp_norm(ctx, node):
    g = ctx.g
    x = ctx.value(node, 0)
    rank = len(ctx.dims(x))
    axis = int(node.attr("axis", -1)) % rank
    p = int(node.attr("p", 2))
    if p == 2:
        norm = root_of_sum(g, g.reduce(g.mul(x, x), ReduceFn.SUM, [axis], True), g.sqrt)
    elif p == 1:
        norm = g.reduce(g.abs(x), ReduceFn.SUM, [axis], True)
    else:
        raise ctx.fail(node, f"LpNormalization p={p} is not defined (ONNX allows 1 and 2)")
    zero = ctx.const_like(0.0, x)
    safe = g.where(g.eq(norm, zero), ctx.const_like(1.0, x), norm)
    return [g.div(x, safe)]
