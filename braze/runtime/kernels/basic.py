"""NumPy kernels that write straight into their planned buffers (`out=`): elementwise math,
comparisons, where, cast, matmul, transpose, concat, gather, split and reductions. Ops whose
NumPy form would allocate temporaries anyway (gelu, layer_norm, ...) get numba kernels in other
files; anything not handled here or there runs its reference."""
from __future__ import annotations

import numpy as np

from ...ir.ops.elementwise import (
    Binary,
    BinaryFn,
    Cast,
    Clamp,
    Compare,
    CompareFn,
    LeakyRelu,
    Unary,
    UnaryFn,
    Where,
)
from ...ir.ops.float_to_int import float_to_int
from ...ir.ops.linalg import MatMul
from ...ir.ops.reduce import Reduce, ReduceFn
from ...ir.ops.shape import Concat, Gather, Reshape, Split, Transpose
from . import bf16_batched, bf16_gemm, blas, native
from .fused import gemm_bias_act, is_f32, packed_weight, prepared_gemm, prepared_how
from .registry import Dispatch, Kernel, nbytes, register_kernel

_UNARY_UFUNC = {
    UnaryFn.TANH: np.tanh, UnaryFn.EXP: np.exp, UnaryFn.LOG: np.log, UnaryFn.SQRT: np.sqrt,
    UnaryFn.NEG: np.negative, UnaryFn.ABS: np.abs, UnaryFn.SIN: np.sin, UnaryFn.COS: np.cos,
    UnaryFn.SQUARE: np.square, UnaryFn.RECIPROCAL: np.reciprocal, UnaryFn.FLOOR: np.floor,
    UnaryFn.CEIL: np.ceil, UnaryFn.SIGN: np.sign, UnaryFn.NOT: np.logical_not,
    UnaryFn.ROUND: np.rint, UnaryFn.TAN: np.tan, UnaryFn.ASIN: np.arcsin,
    UnaryFn.ACOS: np.arccos, UnaryFn.ATAN: np.arctan, UnaryFn.SINH: np.sinh,
    UnaryFn.COSH: np.cosh, UnaryFn.ASINH: np.arcsinh, UnaryFn.ACOSH: np.arccosh,
    UnaryFn.ATANH: np.arctanh,
}
_BINARY_UFUNC = {
    BinaryFn.ADD: np.add, BinaryFn.SUB: np.subtract, BinaryFn.MUL: np.multiply,
    BinaryFn.MAX: np.maximum, BinaryFn.MIN: np.minimum, BinaryFn.POW: np.power,
    BinaryFn.MOD: np.mod, BinaryFn.FMOD: np.fmod, BinaryFn.AND: np.logical_and,
    BinaryFn.OR: np.logical_or, BinaryFn.XOR: np.logical_xor,
}
_COMPARE_UFUNC = {CompareFn.EQ: np.equal, CompareFn.NE: np.not_equal, CompareFn.LT: np.less,
                  CompareFn.LE: np.less_equal, CompareFn.GT: np.greater,
                  CompareFn.GE: np.greater_equal}
_LOW = ("float16", "bfloat16")


def _plain_float(shape) -> bool:
    return shape.dtype.np.name not in _LOW


def _elementwise(run, ins, outs, name, inplace=(0,)):
    return Kernel(run, Dispatch.NATIVE, name, inplace=inplace, bytes=nbytes(ins) + nbytes(outs),
                  flops=outs[0].numel() or 0)


@register_kernel(Unary)
def unary(node, ins, outs, ctx):
    fn = node.op.fn
    if not _plain_float(ins[0]) and ins[0].dtype.is_float:
        return None
    if fn is UnaryFn.RELU:
        zero = ins[0].dtype.np.type(0)
        return _elementwise(lambda x, out: np.maximum(x, zero, out=out), ins, outs, "relu")
    if fn is UnaryFn.SIGMOID:
        def sigmoid(x, out):
            np.negative(x, out=out)
            with np.errstate(over="ignore"):  # exp(-x) = inf for x < -88: sigmoid 0, no warning
                np.exp(out, out=out)
            out += 1
            np.reciprocal(out, out=out)

        return _elementwise(sigmoid, ins, outs, "sigmoid")
    if fn is UnaryFn.RSQRT and ins[0].dtype.is_float:
        def rsqrt(x, out):
            np.sqrt(x, out=out)
            np.reciprocal(out, out=out)

        return _elementwise(rsqrt, ins, outs, "rsqrt")
    uf = _UNARY_UFUNC.get(fn)
    if uf is None:
        return None
    return _elementwise(lambda x, out: uf(x, out=out), ins, outs, fn.value)


@register_kernel(Clamp)
def clamp(node, ins, outs, ctx):
    """Floats only (NaN stays NaN, as np.clip keeps it); an integer clamp runs the reference,
    which rounds float bounds as the op defines."""
    if not ins[0].dtype.is_float or not _plain_float(ins[0]):
        return None
    lo, hi = node.op.lo, node.op.hi
    return _elementwise(lambda x, out: np.clip(x, lo, hi, out=out), ins, outs,
                        f"clamp [{lo:g}, {hi:g}]")


@register_kernel(LeakyRelu)
def leaky_relu(node, ins, outs, ctx):
    if not _plain_float(ins[0]):
        return None
    alpha = ins[0].dtype.np.type(node.op.alpha)

    def run(x, out):
        neg = x < 0  # before out is written: out may be x (in place)
        np.copyto(out, x)
        np.multiply(out, alpha, out=out, where=neg)

    return _elementwise(run, ins, outs, "leaky_relu")


@register_kernel(Binary)
def binary(node, ins, outs, ctx):
    fn = node.op.fn
    if not _plain_float(ins[0]) and ins[0].dtype.is_float:
        return None
    if fn is BinaryFn.DIV:
        uf = np.floor_divide if ins[0].dtype.is_int else np.true_divide
    else:
        uf = _BINARY_UFUNC[fn]
    return _elementwise(lambda a, b, out: uf(a, b, out=out), ins, outs, fn.value, (0, 1))


@register_kernel(Compare)
def compare(node, ins, outs, ctx):
    uf = _COMPARE_UFUNC[node.op.fn]
    return _elementwise(lambda a, b, out: uf(a, b, out=out), ins, outs, node.op.fn.value, ())


@register_kernel(Where)
def where(node, ins, outs, ctx):
    def run(c, a, b, out):
        np.copyto(out, b)
        np.copyto(out, a, where=c)

    return _elementwise(run, ins, outs, "where", ())


@register_kernel(Cast)
def cast(node, ins, outs, ctx):
    if ins[0].dtype.kind == "float" and node.op.dtype.kind in ("int", "uint", "bool"):
        def to_int(x, out):  # defined for NaN / out of range: the reference's own rule
            out[...] = float_to_int(x, out.dtype)

        return _elementwise(to_int, ins, outs, "cast", ())
    return _elementwise(lambda x, out: np.copyto(out, x, casting="unsafe"), ins, outs, "cast",
                        ())


@register_kernel(MatMul)
def matmul(node, ins, outs, ctx):
    a, b = ins
    if not _plain_float(a) or a.dtype.kind == "complex":
        return None
    k = a.dims[-1]
    flops = 2 * (outs[0].numel() or 0) * int(k)
    cost = dict(flops=flops, bytes=nbytes(ins) + nbytes(outs))
    lib = native.lib()
    low = bf16_gemm.gemm_kernel(node, ins, outs, ctx, has_bias=False, act=0, what="matmul") \
        if lib is not None and is_f32(a, b) else None
    if low is None and lib is not None and is_f32(a, b):
        low = bf16_batched.batched_kernel(node, ins, outs, ctx)
    if low is not None:
        return low
    packed = packed_weight(node, ctx) if lib is not None and is_f32(a, b) else None
    if packed is not None:
        def run_packed(x, w, out):
            if not prepared_gemm(x, packed, out, None, 0):
                blas.matmul(x, w, out)

        return Kernel(run_packed, Dispatch.NATIVE,
                      f"matmul ({prepared_how(packed)})", **cost)
    if lib is not None and b.rank == 2 and blas.sgemm_address() is not None:
        def run(x, w, out):
            if not gemm_bias_act(lib, x, w, out, None, 0):
                blas.matmul(x, w, out)

        return Kernel(run, Dispatch.NATIVE, "matmul (MKL sgemm tiles, one region)", **cost)
    return Kernel(lambda x, w, out: blas.matmul(x, w, out), Dispatch.NATIVE, "matmul (BLAS)",
                  **cost)


@register_kernel(Transpose)
def transpose(node, ins, outs, ctx):
    perm = node.op.perm
    return Kernel(lambda x, out: np.copyto(out, x.transpose(perm)), Dispatch.NATIVE,
                  "transpose copy", bytes=nbytes(ins) + nbytes(outs))


@register_kernel(Reshape)
def reshape_copy(node, ins, outs, ctx):
    """A reshape of memory that is not contiguous (a broadcast or a slice) copies."""
    return Kernel(lambda x, out: np.copyto(out, x.reshape(out.shape)), Dispatch.NATIVE,
                  "reshape copy", bytes=nbytes(ins) + nbytes(outs))


@register_kernel(Concat)
def concat(node, ins, outs, ctx):
    ax = node.op.axis

    def run(*arrays):
        np.concatenate(arrays[:-1], axis=ax, out=arrays[-1])

    return Kernel(run, Dispatch.NATIVE, "concat", bytes=nbytes(ins) + nbytes(outs))


@register_kernel(Gather)
def gather(node, ins, outs, ctx):
    ax = node.op.axis

    def run(x, idx, out):
        # NumPy buffers `out` when it checks the indices itself (mode "raise"): checked here
        # first, a gather of 1024 rows of 384 took 0.17 ms instead of 0.46. An index out of
        # range still raises, as the reference does; "wrap" only maps negative ones.
        n = x.shape[ax]
        if idx.size and (idx.min() < -n or idx.max() >= n):
            np.take(x, idx, axis=ax, out=out)
        np.take(x, idx, axis=ax, out=out, mode="wrap")

    return Kernel(run, Dispatch.NATIVE, "gather", bytes=nbytes(outs) * 2)


@register_kernel(Split)
def split(node, ins, outs, ctx):
    ax, sizes = node.op.axis, node.op.sizes
    cuts = np.cumsum(sizes)[:-1]

    def run(x, *arrays):
        for out, part in zip(arrays, np.split(x, cuts, axis=ax), strict=True):
            np.copyto(out, part)

    return Kernel(run, Dispatch.NATIVE, "split", bytes=nbytes(ins) + nbytes(outs))


_REDUCE = {ReduceFn.SUM: np.sum, ReduceFn.MAX: np.max, ReduceFn.MIN: np.min,
           ReduceFn.PROD: np.prod, ReduceFn.MEAN: np.mean}


@register_kernel(Reduce)
def reduce(node, ins, outs, ctx):
    if not _plain_float(ins[0]):
        return None
    fn = _REDUCE[node.op.fn]
    axes, keep = node.op.axes, node.op.keepdims

    def run(x, out):
        fn(x, axis=axes, keepdims=keep, out=out)

    return Kernel(run, Dispatch.NATIVE, f"reduce_{node.op.fn.value}",
                  bytes=nbytes(ins) + nbytes(outs), flops=ins[0].numel() or 0)
