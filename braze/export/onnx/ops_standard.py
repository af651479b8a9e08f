"""Standard ONNX mappings for every primitive braze op (and the logical ops standard ONNX
has: LayerNormalization, Softmax, LogSoftmax, BatchNormalization). Where braze's meaning
differs from the ONNX op's in an edge case the mapping adds the fix (integer division floors,
softmax of an all -inf row is zeros), so ONNX Runtime computes exactly what braze does."""
from __future__ import annotations

import math

import numpy as np

from ...ir.dtypes import f16, f32, f64
from ...ir.ops.conv import (
    Conv2d,
    ConvTranspose2d,
    GlobalAvgPool,
    Pool2d,
    PoolKind,
    ResizeNearest2x,
)
from ...ir.ops.elementwise import (
    Binary,
    BinaryFn,
    Cast,
    Clamp,
    Compare,
    CompareFn,
    IsInf,
    IsNan,
    LeakyRelu,
    StopGradient,
    Unary,
    UnaryFn,
    Where,
)
from ...ir.ops.generate import Range, SymConst
from ...ir.ops.indexing import DynamicNarrow, GatherElements, Slice, TopK, Trilu
from ...ir.ops.linalg import DotGeneral, MatMul
from ...ir.ops.norm import BatchNorm, LayerNorm
from ...ir.ops.reduce import ArgMax, Cumsum, LogSoftmax, Reduce, ReduceFn, Softmax
from ...ir.ops.resize import Resize
from ...ir.ops.shape import Concat, Expand, Gather, Narrow, Pad, Reshape, Split, Transpose
from ...ir.symbolic import SymDim
from .builder import ExportError, onnx_type
from .registry import exporter

_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))


def _dt(b, v):
    return b.g.shape_of(v).dtype


def scalar(b, value, like_dtype) -> str:
    return b.const(np.asarray(value, dtype=like_dtype.np))


# -- elementwise ----------------------------------------------------------------------------------
_DIRECT_UNARY = {UnaryFn.RELU: "Relu", UnaryFn.SIGMOID: "Sigmoid", UnaryFn.TANH: "Tanh",
                 UnaryFn.EXP: "Exp", UnaryFn.LOG: "Log", UnaryFn.SQRT: "Sqrt",
                 UnaryFn.NEG: "Neg", UnaryFn.ABS: "Abs", UnaryFn.SIN: "Sin", UnaryFn.COS: "Cos",
                 UnaryFn.ERF: "Erf", UnaryFn.RECIPROCAL: "Reciprocal", UnaryFn.FLOOR: "Floor",
                 UnaryFn.CEIL: "Ceil", UnaryFn.SIGN: "Sign", UnaryFn.NOT: "Not",
                 UnaryFn.ROUND: "Round", UnaryFn.HARD_SWISH: "HardSwish", UnaryFn.TAN: "Tan",
                 UnaryFn.ASIN: "Asin", UnaryFn.ACOS: "Acos", UnaryFn.ATAN: "Atan",
                 UnaryFn.SINH: "Sinh", UnaryFn.COSH: "Cosh", UnaryFn.ASINH: "Asinh",
                 UnaryFn.ACOSH: "Acosh", UnaryFn.ATANH: "Atanh"}


def unary_fn(b, fn: UnaryFn, x: str, dt, target: str) -> str:
    """`fn(x)` as ONNX nodes (ORT's contrib Gelu / FastGelu / QuickGelu take float and float16
    only: other types are written with standard ops)."""
    contrib = target == "onnxruntime" and dt in (f32, f16)
    if fn in _DIRECT_UNARY:
        return b.op1(_DIRECT_UNARY[fn], x)
    if fn is UnaryFn.RSQRT:
        return b.op1("Reciprocal", b.op1("Sqrt", x))
    if fn is UnaryFn.SQUARE:
        return b.op1("Mul", x, x)
    if fn is UnaryFn.RELU6:
        return b.op1("Clip", x, scalar(b, 0.0, dt), scalar(b, 6.0, dt))
    if fn is UnaryFn.SILU:
        return b.op1("Mul", x, b.op1("Sigmoid", x))
    if fn is UnaryFn.QUICK_GELU:
        if contrib:
            return b.op1("QuickGelu", x, domain="com.microsoft", alpha=1.702)
        return b.op1("Mul", x, b.op1("Sigmoid", b.op1("Mul", x, scalar(b, 1.702, dt))))
    if fn is UnaryFn.GELU:
        if b.opset >= 20:
            return b.op1("Gelu", x)
        if contrib:
            return b.op1("Gelu", x, domain="com.microsoft")
        inner = b.op1("Erf", b.op1("Div", x, scalar(b, np.sqrt(2.0), dt)))
        return b.op1("Mul", b.op1("Mul", x, scalar(b, 0.5, dt)),
                     b.op1("Add", inner, scalar(b, 1.0, dt)))
    if fn is UnaryFn.GELU_APPROX:
        if b.opset >= 20:
            return b.op1("Gelu", x, approximate="tanh")
        if contrib:
            return b.op1("FastGelu", x, domain="com.microsoft")
        cube = b.op1("Mul", b.op1("Mul", x, x), x)
        inner = b.op1("Mul", b.op1("Add", x, b.op1("Mul", cube, scalar(b, 0.044715, dt))),
                      scalar(b, _SQRT_2_OVER_PI, dt))
        return b.op1("Mul", b.op1("Mul", x, scalar(b, 0.5, dt)),
                     b.op1("Add", b.op1("Tanh", inner), scalar(b, 1.0, dt)))
    raise NotImplementedError(f"unary {fn.value}")


@exporter(Unary)
def unary(b, n, ins, target):
    return [unary_fn(b, n.op.fn, ins[0], n.outputs[0].dtype, target)]


_DIRECT_BINARY = {BinaryFn.ADD: "Add", BinaryFn.SUB: "Sub", BinaryFn.MUL: "Mul",
                  BinaryFn.MAX: "Max", BinaryFn.MIN: "Min", BinaryFn.POW: "Pow",
                  BinaryFn.AND: "And", BinaryFn.OR: "Or", BinaryFn.XOR: "Xor"}


@exporter(Binary)
def binary(b, n, ins, target):
    fn, (x, y) = n.op.fn, ins
    dt = n.outputs[0].dtype
    if fn in _DIRECT_BINARY:
        return [b.op1(_DIRECT_BINARY[fn], x, y)]
    if fn is BinaryFn.DIV:
        if dt.is_int:  # braze floors; ONNX truncates: (x - x mod y) / y is exact and floors
            return [b.op1("Div", b.op1("Sub", x, b.op1("Mod", x, y)), y)]
        return [b.op1("Div", x, y)]
    if fn is BinaryFn.FMOD:
        return [b.op1("Mod", x, y, fmod=1)]
    if dt.is_int:  # MOD: the divisor's sign, ONNX Mod with fmod=0
        return [b.op1("Mod", x, y)]
    q = b.op1("Floor", b.op1("Div", x, y))
    return [b.op1("Sub", x, b.op1("Mul", y, q))]


_COMPARE = {CompareFn.EQ: "Equal", CompareFn.LT: "Less", CompareFn.LE: "LessOrEqual",
            CompareFn.GT: "Greater", CompareFn.GE: "GreaterOrEqual"}


@exporter(Compare)
def compare(b, n, ins, target):
    if n.op.fn is CompareFn.NE:
        return [b.op1("Not", b.op1("Equal", *ins))]
    return [b.op1(_COMPARE[n.op.fn], *ins)]


@exporter(Where)
def where(b, n, ins, target):
    if n.outputs[0].dtype.kind == "bool":
        # ONNX Runtime has no CPU Where kernel for bool: (c and x) or (not c and y)
        c, x, y = ins
        return [b.op1("Or", b.op1("And", c, x), b.op1("And", b.op1("Not", c), y))]
    return [b.op1("Where", *ins)]


@exporter(Cast)
def cast(b, n, ins, target):
    return [b.op1("Cast", ins[0], to=onnx_type(n.op.dtype))]


@exporter(LeakyRelu)
def leaky_relu(b, n, ins, target):
    return [b.op1("LeakyRelu", ins[0], alpha=float(n.op.alpha))]


@exporter(Clamp)
def clamp(b, n, ins, target):
    dt = n.outputs[0].dtype
    return [b.op1("Clip", ins[0], scalar(b, n.op.lo, dt), scalar(b, n.op.hi, dt))]


@exporter(StopGradient)
def stop_gradient(b, n, ins, target):
    return [b.op1("Identity", ins[0])]


@exporter(IsNan)
def isnan(b, n, ins, target):
    return [b.op1("IsNaN", ins[0])]


@exporter(IsInf)
def isinf(b, n, ins, target):
    return [b.op1("IsInf", ins[0], detect_positive=int(n.op.detect_positive),
                  detect_negative=int(n.op.detect_negative))]


# -- linear algebra -------------------------------------------------------------------------------
@exporter(MatMul)
def matmul(b, n, ins, target):
    return [b.op1("MatMul", *ins)]


@exporter(DotGeneral)
def dot_general(b, n, ins, target):
    op = n.op
    ra, rb = (b.g.shape_of(v).rank for v in n.inputs)
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    la = [next(letters) for _ in range(ra)]
    lb = [next(letters) for _ in range(rb)]
    for i, j in zip(op.lhs_contract + op.lhs_batch, op.rhs_contract + op.rhs_batch, strict=True):
        lb[j] = la[i]
    out = [la[d] for d in op.lhs_batch] + [la[d] for d in op.free_dims(ra, "lhs")]
    out += [lb[d] for d in op.free_dims(rb, "rhs")]
    return [b.op1("Einsum", *ins, equation=f"{''.join(la)},{''.join(lb)}->{''.join(out)}")]


# -- shape and indexing ---------------------------------------------------------------------------
@exporter(Reshape)
def reshape(b, n, ins, target):
    dims = n.op.dims
    zero = any(d == 0 for d in dims)
    return [b.op1("Reshape", ins[0], b.dims_tensor(dims), allowzero=1 if zero else None)]


@exporter(Transpose)
def transpose(b, n, ins, target):
    return [b.op1("Transpose", ins[0], perm=list(n.op.perm))]


@exporter(Narrow)
def narrow(b, n, ins, target):
    op = n.op
    start = b.const(np.asarray([op.start], np.int64))
    if isinstance(op.length, int):
        end = b.const(np.asarray([op.start + op.length], np.int64))
    else:
        end = b.dims_tensor(((SymDim.of(op.length) + op.start).to_dim(),))
    return [b.op1("Slice", ins[0], start, end, b.const(np.asarray([op.axis], np.int64)))]


@exporter(DynamicNarrow)
def dynamic_narrow(b, n, ins, target):
    """ONNX Slice with starts / ends computed from the input dims (ONNX would clamp where braze
    raises; the exported model equals braze's wherever braze's bounds check passes)."""
    op = n.op
    start, stop = SymDim.of(op.start), SymDim.of(op.start) + SymDim.of(op.length)
    return [b.op1("Slice", ins[0], b.dims_tensor((start.to_dim(),)),
                  b.dims_tensor((stop.to_dim(),)), b.const(np.asarray([op.axis], np.int64)))]


@exporter(Slice)
def slice_(b, n, ins, target):
    op = n.op
    big = np.iinfo(np.int64).max
    stop = max(min(op.stop, big), -big)
    return [b.op1("Slice", ins[0], b.const(np.asarray([op.start], np.int64)),
                  b.const(np.asarray([stop], np.int64)), b.const(np.asarray([op.axis], np.int64)),
                  b.const(np.asarray([op.step], np.int64)))]


@exporter(Concat)
def concat(b, n, ins, target):
    return [b.op1("Concat", *ins, axis=n.op.axis)]


@exporter(Expand)
def expand(b, n, ins, target):
    return [b.op1("Expand", ins[0], b.dims_tensor(n.op.dims))]


@exporter(Gather)
def gather(b, n, ins, target):
    return [b.op1("Gather", *ins, axis=n.op.axis)]


@exporter(GatherElements)
def gather_elements(b, n, ins, target):
    return [b.op1("GatherElements", *ins, axis=n.op.axis)]


@exporter(Pad)
def pad(b, n, ins, target):
    befores = [p[0] for p in n.op.pads]
    afters = [p[1] for p in n.op.pads]
    dt = n.outputs[0].dtype
    pads = b.const(np.asarray(befores + afters, np.int64))
    if n.op.mode.value != "constant":  # ONNX reflect / edge mean what braze's modes mean
        return [b.op1("Pad", ins[0], pads, mode=n.op.mode.value)]
    return [b.op1("Pad", ins[0], pads, scalar(b, n.op.value, dt), mode="constant")]


@exporter(Split)
def split(b, n, ins, target):
    sizes = b.const(np.asarray(n.op.sizes, np.int64))
    return b.op("Split", [ins[0], sizes], n_out=len(n.op.sizes), axis=n.op.axis)


@exporter(TopK)
def top_k(b, n, ins, target):
    k = b.const(np.asarray([n.op.k], np.int64))
    return b.op("TopK", [ins[0], k], n_out=2, axis=n.op.axis, largest=int(n.op.largest),
                sorted=int(n.op.sorted))


@exporter(Trilu)
def trilu(b, n, ins, target):
    return [b.op1("Trilu", ins[0], b.const(np.int64(n.op.k)), upper=int(n.op.upper))]


@exporter(Range)
def range_(b, n, ins, target):
    op = n.op
    dt = op.dtype
    length = b.dim_scalar(op.length)
    if dt.is_int:
        start, delta = b.const(dt.np.type(op.start)), b.const(dt.np.type(op.delta))
        n_ = length if dt.name == "i64" else b.op1("Cast", length, to=onnx_type(dt))
        limit = b.op1("Add", start, b.op1("Mul", n_, delta))
        return [b.op1("Range", start, limit, delta)]
    # A float Range would count ceil((limit - start) / delta) elements in float, one too many
    # where rounding lifts it (0.7 + 10 * 0.1): count in int64, then start + i * delta in f64
    # (as the reference computes it), cast to the dtype.
    i = b.op1("Range", b.const(np.int64(0)), length, b.const(np.int64(1)))
    vals = b.op1("Add", b.const(np.float64(op.start)),
                 b.op1("Mul", b.op1("Cast", i, to=onnx_type(f64)), b.const(np.float64(op.delta))))
    return [b.op1("Cast", vals, to=onnx_type(dt))]


@exporter(SymConst)
def sym_const(b, n, ins, target):
    op = n.op
    t = b.dims_tensor(op.values) if op.values else b.const(np.zeros(0, np.int64))
    t = b.op1("Reshape", t, b.const(np.asarray(op.shape, np.int64).reshape(len(op.shape))))
    return [t if op.dtype.name == "i64" else b.op1("Cast", t, to=onnx_type(op.dtype))]


# -- reductions and logical kinds -----------------------------------------------------------------
_REDUCE = {ReduceFn.SUM: "ReduceSum", ReduceFn.MEAN: "ReduceMean", ReduceFn.MAX: "ReduceMax",
           ReduceFn.MIN: "ReduceMin", ReduceFn.PROD: "ReduceProd"}


@exporter(Reduce)
def reduce(b, n, ins, target):
    op = n.op
    name = _REDUCE[op.fn]
    keep = int(op.keepdims)
    if not op.axes:
        return [b.op1("Identity", ins[0])]
    axes = np.asarray(op.axes, np.int64)
    if name == "ReduceSum" or b.opset >= 18:
        return [b.op1(name, ins[0], b.const(axes), keepdims=keep)]
    return [b.op1(name, ins[0], axes=list(op.axes), keepdims=keep)]


def _safe_softmax(b, x: str, axis: int, dt) -> str:
    """ONNX Softmax gives NaN for a row of only -inf; braze's softmax gives zeros."""
    p = b.op1("Softmax", x, axis=axis)
    return b.op1("Where", b.op1("IsNaN", p), scalar(b, 0.0, dt), p)


@exporter(Softmax)
def softmax(b, n, ins, target):
    return [_safe_softmax(b, ins[0], n.op.axis, n.outputs[0].dtype)]


@exporter(LogSoftmax)
def log_softmax(b, n, ins, target):
    return [b.op1("LogSoftmax", ins[0], axis=n.op.axis)]


@exporter(Cumsum)
def cumsum(b, n, ins, target):
    return [b.op1("CumSum", ins[0], b.const(np.int64(n.op.axis)), exclusive=int(n.op.exclusive),
                  reverse=int(n.op.reverse))]


@exporter(ArgMax)
def argmax(b, n, ins, target):
    return [b.op1("ArgMax", ins[0], axis=n.op.axis, keepdims=int(n.op.keepdims))]


def _layer_norm_ok(n, g, target):
    return n.outputs[0].dtype.is_float


@exporter(LayerNorm, accept=_layer_norm_ok)
def layer_norm(b, n, ins, target):
    op = n.op
    x = ins[0]
    dt = n.outputs[0].dtype
    trailing = b.g.shape_of(n.inputs[0]).dims[op.axis:]
    rest = iter(ins[1:])
    gamma = next(rest) if op.has_gamma else b.const(np.ones(trailing, dt.np))
    beta = next(rest) if op.has_beta else None
    args = [x, gamma] + ([beta] if beta is not None else [])
    return [b.op1("LayerNormalization", *args, axis=op.axis, epsilon=float(op.eps))]


@exporter(BatchNorm)
def batch_norm(b, n, ins, target):
    return [b.op1("BatchNormalization", *ins, epsilon=float(n.op.eps))]


# -- convolution ----------------------------------------------------------------------------------
def conv_attrs(op) -> dict:
    return {"strides": list(op.stride), "pads": list(op.padding),
            "dilations": list(op.dilation), "group": op.groups}


@exporter(Conv2d)
def conv2d(b, n, ins, target):
    return [b.op1("Conv", *ins, **conv_attrs(n.op))]


@exporter(ConvTranspose2d)
def conv_transpose2d(b, n, ins, target):
    attrs = conv_attrs(n.op)
    return [b.op1("ConvTranspose", *ins, output_padding=list(n.op.output_padding), **attrs)]


@exporter(Pool2d)
def pool2d(b, n, ins, target):
    op = n.op
    attrs = {"kernel_shape": list(op.kernel), "strides": list(op.stride),
             "pads": list(op.padding)}
    if op.pool is PoolKind.MAX:
        return [b.op1("MaxPool", ins[0], **attrs)]
    return [b.op1("AveragePool", ins[0], count_include_pad=int(op.count_include_pad), **attrs)]


@exporter(GlobalAvgPool)
def global_avg_pool(b, n, ins, target):
    return [b.op1("GlobalAveragePool", ins[0])]


@exporter(Resize)
def resize(b, n, ins, target):
    op = n.op
    attrs = dict(mode=op.mode.value, coordinate_transformation_mode=op.coordinate.value,
                 nearest_mode=op.nearest.value, cubic_coeff_a=float(op.cubic_a),
                 exclude_outside=int(op.exclude_outside))
    if op.scale is not None:  # the scale drives the source coordinates, as ONNX's scales do
        dims_in, dims_out = b.g.shape_of(n.inputs[0]).dims[2:], n.outputs[0].dims[2:]
        scale = [_onnx_scale(n, s, d_in, d_out)
                 for s, d_in, d_out in zip(op.scale, dims_in, dims_out, strict=True)]
        scales = b.const(np.asarray([1, 1, *scale], np.float32))
        return [b.op1("Resize", ins[0], "", scales, **attrs)]
    sizes = b.dims_tensor(n.outputs[0].dims)
    return [b.op1("Resize", ins[0], "", "", sizes, **attrs)]


def _onnx_scale(n, scale: float, d_in, d_out) -> np.float32:
    """`scale` as the float32 ONNX takes, moved by at most a few ulps so that ONNX's output size
    floor(d_in * scale) is `d_out` (float32 0.7 makes 10 rows 6, where braze's size is 7, as
    PyTorch's interpolate(scale_factor=0.7) gives); an ExportError when no nearby float32 does
    (a size that disagrees with its scale, which ONNX's Resize cannot express)."""
    s = np.float32(scale)
    if not (isinstance(d_in, int) and isinstance(d_out, int)):
        return s
    up, down = s, s
    for _ in range(8):
        for c in (up, down):
            if math.floor(np.float32(d_in) * c) == d_out == math.floor(d_in * float(c)):
                return c
        up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(0))
    raise ExportError(f"cannot export node {n.describe()}: ONNX's Resize makes floor({d_in} * "
                      f"{scale:g}) = {math.floor(d_in * scale)} of the input's {d_in}, not the "
                      f"size {d_out} this resize gives with that scale; give a size that "
                      "matches the scale, or no scale")


@exporter(ResizeNearest2x)
def resize_nearest_2x(b, n, ins, target):
    scales = b.const(np.asarray([1, 1, 2, 2], np.float32))
    return [b.op1("Resize", ins[0], "", scales, mode="nearest",
                  coordinate_transformation_mode="asymmetric", nearest_mode="floor")]
