"""Pooling and resize kernels (float32, NCHW, C loops of conv_native): max / average pooling,
global average pooling, resize_nearest_2x and resize. Resize reads the op's own index or
interpolation tables (`Resize.indices` / `Resize.weights`): each matrix row has a few
consecutive nonzeros, so resampling runs as two separable passes over those taps instead of
two dense GEMMs. Other dtypes decline and run the reference. (The NHWC pools the executor uses
between channels-last convs are nhwc_ops'.)"""
from __future__ import annotations

import numpy as np

from ...ir.ops.conv import GlobalAvgPool, Pool2d, PoolKind, ResizeNearest2x
from ...ir.ops.resize import Resize, ResizeMode
from . import conv_native
from .conv_native import c_kernel
from .fused import is_f32
from .native import ptr as _ptr
from .registry import Dispatch, Kernel, nbytes, register_kernel

__all__ = ["resample_taps", "upscale_factor"]

_F32 = np.float32


@register_kernel(Pool2d)
def pool2d(node, ins, outs, ctx):
    lib = conv_native.lib()
    if lib is None or not is_f32(*ins):
        return None
    op = node.op
    n, c, h, w = (int(d) for d in ins[0].dims)
    ho, wo = (int(d) for d in outs[0].dims[2:])
    (kh, kw), (sh, sw) = op.kernel, op.stride
    is_max = int(op.pool is PoolKind.MAX)

    def pool(x, out):
        return lib.pool2d, (_ptr(x), _ptr(out), n * c, h, w, kh, kw, sh, sw, op.padding[0],
                            op.padding[1], ho, wo, is_max, int(op.count_include_pad))

    return Kernel(**c_kernel(pool), dispatch=Dispatch.NATIVE, name=f"C {op.pool.value} pool",
                  flops=n * c * ho * wo * kh * kw, bytes=nbytes(ins) + nbytes(outs))


@register_kernel(GlobalAvgPool)
def global_avg_pool(node, ins, outs, ctx):
    lib = conv_native.lib()
    if lib is None or not is_f32(*ins):
        return None
    n, c, h, w = (int(d) for d in ins[0].dims)

    def means(x, out):
        return lib.plane_means, (_ptr(x), _ptr(out), n * c, h * w)

    return Kernel(**c_kernel(means), dispatch=Dispatch.NATIVE, name="C plane means",
                  flops=n * c * h * w, bytes=nbytes(ins) + nbytes(outs))


@register_kernel(ResizeNearest2x)
def resize_nearest_2x(node, ins, outs, ctx):
    """float32: the C nearest gather with index tables i // 2 (NumPy's broadcast copy of this
    ran at 0.2 GB/s in the OCR detector); other dtypes: the broadcast copy."""
    n, c, h, w = (int(d) for d in ins[0].dims)
    cost = {"bytes": nbytes(ins) + nbytes(outs)}
    lib = conv_native.lib()
    if lib is not None and is_f32(*ins):
        rows = np.arange(2 * h, dtype=np.int64) // 2
        cols = np.arange(2 * w, dtype=np.int64) // 2

        def gather(x, out):
            return lib.gather2d, (_ptr(x), _ptr(out), n * c, h, w, 2 * h, 2 * w, _ptr(rows),
                                  _ptr(cols), 2)

        return Kernel(**c_kernel(gather), dispatch=Dispatch.NATIVE, name="C nearest gather",
                      **cost)

    def run(x, out):
        np.copyto(out.reshape(n, c, h, 2, w, 2), x[:, :, :, None, :, None])

    return Kernel(run, Dispatch.NATIVE, "NumPy broadcast copy", **cost)


def upscale_factor(index: np.ndarray, n_in: int) -> int:
    """f where a nearest index table reads source i at outputs i * f .. i * f + f - 1 for every
    i < n_in (an integer upscale), else 0."""
    f = len(index) // n_in
    if f < 1 or len(index) != f * n_in:
        return 0
    return f if np.array_equal(index, np.arange(len(index)) // f) else 0


def resample_taps(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An [out, in] resampling matrix as (start [out] int64, weights [out, taps] float32): row r
    is weights[r] on columns start[r] .. start[r] + taps - 1, taps the widest nonzero span."""
    n_out, n_in = m.shape
    nz = m != 0
    some = nz.any(axis=1)
    first = np.where(some, nz.argmax(axis=1), 0)
    last = np.where(some, n_in - 1 - nz[:, ::-1].argmax(axis=1), 0)
    taps = int((last - first).max(initial=0)) + 1
    start = np.minimum(first, n_in - taps).astype(np.int64)
    cols = start[:, None] + np.arange(taps)
    return start, np.ascontiguousarray(np.take_along_axis(m, cols, axis=1), dtype=_F32)


@register_kernel(Resize)
def resize(node, ins, outs, ctx):
    lib = conv_native.lib()
    if lib is None or not is_f32(*ins):
        return None
    op: Resize = node.op
    n, c, h, w = (int(d) for d in ins[0].dims)
    ho, wo = (int(d) for d in outs[0].dims[2:])
    cost = {"bytes": nbytes(ins) + nbytes(outs)}
    if op.mode is ResizeMode.NEAREST:
        rows, cols = op.indices(0, h, ho), op.indices(1, w, wo)
        repeat = upscale_factor(cols, w)

        def gather(x, out):
            return lib.gather2d, (_ptr(x), _ptr(out), n * c, h, w, ho, wo, _ptr(rows),
                                  _ptr(cols), repeat)

        return Kernel(**c_kernel(gather), dispatch=Dispatch.NATIVE, name="C nearest gather",
                      **cost)
    hs, hw_ = resample_taps(op.weights(0, h, ho))
    ws, ww = resample_taps(op.weights(1, w, wo))

    def resample(x, out, tmp):
        return lib.resample, (_ptr(x), _ptr(out), _ptr(tmp), n * c, h, w, ho, wo, _ptr(ws),
                              _ptr(ww), ww.shape[1], _ptr(hs), _ptr(hw_), hw_.shape[1])

    flops = 2 * n * c * (h * wo * ww.shape[1] + ho * wo * hw_.shape[1])
    return Kernel(**c_kernel(resample), dispatch=Dispatch.NATIVE,
                  name=f"C separable {op.mode.value} resampling",
                  scratch=(((n * c, h, wo), _F32),), flops=flops, **cost)
