"""Data-movement kernels that write into their planned buffers: strided slices (Swin's patch
merging `x[:, 0::2, 1::2]`, LeViT's query subsampling) copy a strided view of the input,
constant padding (EfficientNet's asymmetric "same" padding before its convs) fills the border
and copies the input into the interior, and gather_elements (DeBERTa's disentangled attention
gathers its position scores with it: 29% of a call on the NumPy reference) and cumsum
(position ids from an attention mask) are C loops. Reflect / edge padding runs its
reference."""
from __future__ import annotations

import numpy as np

from ...errors import InterpretError
from ...ir.ops.indexing import GatherElements, Slice
from ...ir.ops.reduce import Cumsum
from ...ir.ops.shape import Pad, PadMode
from ..address import address
from . import native
from .registry import Dispatch, Kernel, nbytes, register_kernel


@register_kernel(Slice)
def strided_slice(node, ins, outs, ctx):
    op = node.op
    axis = op.axis % ins[0].rank
    index = (slice(None),) * axis + (slice(op.start, op.stop, op.step),)

    def run(x, out):
        np.copyto(out, x[index])

    return Kernel(run, Dispatch.NATIVE, "strided slice copy", bytes=2 * nbytes(outs))


@register_kernel(Pad)
def constant_pad(node, ins, outs, ctx):
    op = node.op
    if op.mode is not PadMode.CONSTANT:
        return None
    value = ins[0].dtype.np.type(op.value)

    def run(x, out):
        interior = tuple(slice(before, before + n) for (before, _), n in zip(op.pads, x.shape))
        if any(before or after for before, after in op.pads):
            out.fill(value)  # the border (the interior is overwritten next)
        np.copyto(out[interior], x)

    return Kernel(run, Dispatch.NATIVE, "constant pad", bytes=nbytes(ins) + nbytes(outs))


@register_kernel(GatherElements)
def gather_elements(node, ins, outs, ctx):
    """Data of 4- or 8-byte elements, int32 / int64 indices whose dims off the axis equal the
    data's (the collapsed [outer, n, inner] form); other cases run the reference. An index
    repeated over leading axes (DeBERTa's relative positions, expanded over batch x heads) is
    read once per repeat from cache instead of copied out: a broadcast view as it is, and a
    static index (computed once per binding) reduced to its distinct leading blocks and to
    int32, its range checked once."""
    x, idx = ins
    lib = native.lib()
    ax = node.op.axis % x.rank
    if lib is None or x.dtype.np.itemsize not in (4, 8) or idx.dtype.np.itemsize not in (4, 8):
        return None
    if any(a != b for i, (a, b) in enumerate(zip(idx.dims, x.dims)) if i != ax):
        return None
    outer = int(np.prod(x.dims[:ax], dtype=np.int64))
    inner = int(np.prod(x.dims[ax + 1:], dtype=np.int64))
    n, m = int(x.dims[ax]), int(idx.dims[ax])
    elem = x.dtype.np.itemsize
    static = ctx.static.get(node.inputs[1]) if ctx is not None else None
    negatives = node.op.negative_indices
    ready = None if static is None else _static_index(static, ax, n, negatives)

    def fail():
        raise InterpretError(f"gather_elements at node {node.label}: an index is outside "
                             f"[{-n if negatives else 0}, {n}) along axis {ax}")

    def run(data, indices, out):
        data = np.ascontiguousarray(data)
        if not negatives and ready is None and indices.size and indices.min() < 0:
            raise InterpretError(f"at node {node.label}: " + node.op.negative_index_message(
                indices.min(), n, ax))
        if ready is not None:
            if ready[2]:
                fail()
            indices, rows = ready[0], ready[1]
        else:
            indices, rows = _leading_repeats(indices, ax)
        if lib.gather_elements(address(data), address(indices), address(out), outer, n, m,
                               inner, elem, int(indices.dtype.itemsize == 8), rows):
            fail()

    how = "" if ready is None or ready[1] == outer else \
        f", a static index block reused {outer // max(ready[1], 1)} times"
    return Kernel(run, Dispatch.NATIVE, "C gather_elements" + how,
                  bytes=2 * nbytes(outs) + nbytes(ins[1:]))


def _leading_repeats(indices: np.ndarray, ax: int) -> tuple[np.ndarray, int]:
    """(contiguous index blocks, how many) for indices broadcast over leading axes before
    `ax` (stride 0: an expand's view), without copying the repeats."""
    lead = 0
    while lead < ax and indices.strides[lead] == 0:
        lead += 1
    block = np.ascontiguousarray(indices[(0,) * lead])
    return block, int(np.prod(block.shape[:ax - lead], dtype=np.int64))


def _static_index(index: np.ndarray, ax: int, n: int,
                  negatives: bool = True) -> tuple[np.ndarray, int, bool]:
    """A static index as (its distinct leading blocks, contiguous, negatives wrapped, int32;
    how many blocks; whether any index is outside [-n, n), or [0, n) without `negatives`):
    leading axes along which it does not change are dropped, whether a broadcast view or
    copied out."""
    lead = 0
    while lead < ax and index.shape[0] and (index.strides[0] == 0
                                            or not (index != index[:1]).any()):
        index = index[0]  # the next leading axis is axis 0 again
        lead += 1
    index = index.astype(np.int64)
    bad = bool(((index < (-n if negatives else 0)) | (index >= n)).any())
    wrapped = np.where(index < 0, index + n, index)
    index = np.ascontiguousarray(wrapped.astype(np.int32 if n < 2 ** 31 else np.int64))
    return index, int(np.prod(index.shape[:ax - lead], dtype=np.int64)), bad


_CUMSUM_KINDS = {"f32": 0, "f64": 1, "i32": 2, "i64": 3}


@register_kernel(Cumsum)
def cumsum(node, ins, outs, ctx):
    """float32 / float64 / int32 / int64 running sums along any axis, exclusive or reversed,
    in NumPy's order (bit-identical to the reference). float16 / bfloat16 inputs sum in
    float32 as the reference does (cast into a float32 scratch, summed there, rounded once
    into the output); other dtypes run the reference."""
    x = ins[0]
    lib = native.lib()
    half = x.dtype.name in ("f16", "bf16")
    kind = 0 if half else _CUMSUM_KINDS.get(x.dtype.name)
    if lib is None or kind is None or x.rank == 0:
        return None
    ax = node.op.axis % x.rank
    n = int(x.dims[ax])
    inner = int(np.prod(x.dims[ax + 1:], dtype=np.int64))
    outer = int(np.prod(x.dims[:ax], dtype=np.int64))
    op = node.op

    def run(data, out, *wide):
        data = np.ascontiguousarray(data)
        if wide:  # f16 / bf16: sum the float32 values, round the sums once
            np.copyto(wide[0], data, casting="unsafe")
            data, dest = wide
        else:
            dest = out
        lib.cumsum(address(data), address(dest), outer, n, inner, kind, int(op.exclusive),
                   int(op.reverse))
        if wide:
            np.copyto(out, dest, casting="unsafe")

    shape = tuple(int(d) for d in x.dims)
    scratch = ((shape, np.float32),) * 2 if half else ()
    return Kernel(run, Dispatch.NATIVE, "C cumsum" + (" in float32" if half else ""),
                  bytes=nbytes(ins) + nbytes(outs), flops=x.numel() or 0, scratch=scratch)
