"""Builder methods for conv2d, conv_transpose2d, pooling, resize (2x nearest and general).

Strides, dilations and kernels take an int or a pair; paddings an int, a pair (ph, pw) or a
4-tuple (top, left, bottom, right)."""
from __future__ import annotations

from ...errors import GraphError, ShapeError
from ..op import Value
from ..ops.conv import Conv2d, ConvTranspose2d, GlobalAvgPool, Pool2d, PoolKind, ResizeNearest2x
from ..ops.resize import CoordinateMode, NearestMode, Resize, ResizeMode


def _pair(v, what: str) -> tuple[int, int]:
    if isinstance(v, int) and not isinstance(v, bool):
        return (v, v)
    t = tuple(v) if isinstance(v, (tuple, list)) else ()
    if len(t) != 2 or not all(isinstance(i, int) for i in t):
        raise GraphError(f"{what} must be an int or a pair of ints, got {v!r}")
    return t


def _dim_pair(v) -> tuple:
    """A resize size: an int, or a pair of dims (ints or symbolic expressions such as "2*h")."""
    t = (v, v) if isinstance(v, int) and not isinstance(v, bool) else \
        (tuple(v) if isinstance(v, (tuple, list)) else ())
    if len(t) != 2 or not all(isinstance(d, str) or (isinstance(d, int) and
                                                    not isinstance(d, bool)) for d in t):
        raise GraphError(f"size must be an int or a pair of dims, got {v!r}")
    return t


def _pair_any(v, what: str) -> tuple:
    t = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    if len(t) != 2:
        raise GraphError(f"{what} must be a number or a pair, got {v!r}")
    return t


def _padding4(v) -> tuple[int, int, int, int]:
    if isinstance(v, int) and not isinstance(v, bool):
        return (v, v, v, v)
    t = tuple(v) if isinstance(v, (tuple, list)) else ()
    if len(t) == 2 and all(isinstance(i, int) for i in t):
        return (t[0], t[1], t[0], t[1])
    if len(t) == 4 and all(isinstance(i, int) for i in t):
        return t
    raise GraphError(f"padding must be an int, (ph, pw) or (top, left, bottom, right), got {v!r}")


def _enum(cls, v, what: str):
    if isinstance(v, cls):
        return v
    try:
        return cls(v)
    except ValueError:
        raise GraphError(f"unknown {what} {v!r}; known: "
                         f"{', '.join(m.value for m in cls)}") from None


def _is_kernel_size(b) -> bool:
    """RLX's kernel_size where braze's bias goes: an int or a pair (a bias is a Value)."""
    return isinstance(b, (tuple, list)) or (isinstance(b, int) and not isinstance(b, bool))


def _pool_kind(kind) -> PoolKind:
    if isinstance(kind, PoolKind):
        return kind
    try:
        return PoolKind(kind)
    except ValueError:
        raise GraphError(f"unknown pool kind {kind!r}; known: max, avg") from None


class ConvBuilder:
    def conv2d(self, x: Value, w: Value, b: Value | None = None, stride=1, padding=0,
               dilation=1, groups: int = 1) -> Value:
        """NCHW convolution with weight [O, C/groups, kh, kw] and optional bias [O]. RLX's
        `conv2d(x, w, kernel_size, stride, padding, dilation, groups)` works too: an int or a
        pair where the bias goes is the kernel size, checked against the weight."""
        if _is_kernel_size(b):
            self._check_kernel("conv2d", w, b, 2)
            b = None
        op = Conv2d(_pair(stride, "stride"), _padding4(padding), _pair(dilation, "dilation"),
                    int(groups), b is not None)
        return self.add_node(op, (x, w) if b is None else (x, w, b))[0]

    def conv_transpose2d(self, x: Value, w: Value, b: Value | None = None, stride=1, padding=0,
                         output_padding=0, dilation=1, groups: int = 1) -> Value:
        """Transposed NCHW convolution with weight [C, O/groups, kh, kw] and optional bias [O].
        RLX's `conv_transpose2d(x, w, kernel_size, stride, padding, dilation, output_padding,
        groups)` works too (an int or a pair where the bias goes; note dilation before
        output_padding)."""
        if _is_kernel_size(b):
            self._check_kernel("conv_transpose2d", w, b, 2)
            b, output_padding, dilation = None, dilation, output_padding
        op = ConvTranspose2d(_pair(stride, "stride"), _padding4(padding),
                             _pair(output_padding, "output_padding"),
                             _pair(dilation, "dilation"), int(groups), b is not None)
        return self.add_node(op, (x, w) if b is None else (x, w, b))[0]

    def _check_kernel(self, what: str, w: Value, kernel, first: int) -> None:
        k = _pair(kernel, "kernel_size")
        have = self.shape_of(w).dims[first:]
        if tuple(have) != k:
            raise ShapeError(f"{what}: kernel_size {k} differs from the weight's kernel dims "
                             f"{tuple(have)} (weight {self.shape_of(w)}); braze reads the "
                             "kernel size from the weight")

    def pool(self, x: Value, kind: PoolKind | str, kernel, stride=None, padding=0, *,
             count_include_pad: bool = False) -> Value:
        """Max or average pooling; `stride` defaults to the kernel."""
        k = _pair(kernel, "kernel")
        s = k if stride is None else _pair(stride, "stride")
        op = Pool2d(_pool_kind(kind), k, s, _padding4(padding), bool(count_include_pad))
        return self.add_node(op, (x,))[0]

    def max_pool2d(self, x: Value, kernel, stride=None, padding=0) -> Value:
        return self.pool(x, PoolKind.MAX, kernel, stride, padding)

    def avg_pool2d(self, x: Value, kernel, stride=None, padding=0, *,
                   count_include_pad: bool = False) -> Value:
        return self.pool(x, PoolKind.AVG, kernel, stride, padding,
                         count_include_pad=count_include_pad)

    def global_avg_pool(self, x: Value) -> Value:
        """[N, C, H, W] -> [N, C, 1, 1] mean."""
        return self.add_node(GlobalAvgPool(), (x,))[0]

    def resize_nearest_2x(self, x: Value) -> Value:
        """[N, C, H, W] -> [N, C, 2H, 2W], nearest neighbour."""
        return self.add_node(ResizeNearest2x(), (x,))[0]

    def resize(self, x: Value, size, mode: ResizeMode | str = "nearest",
               coordinate: CoordinateMode | str = "half_pixel",
               nearest: NearestMode | str = "round_prefer_floor", scale=None, *,
               cubic_a: float = -0.75, exclude_outside: bool = False) -> Value:
        """[N, C, H, W] -> [N, C, *size] with ONNX Resize semantics (braze.ir.ops.resize);
        `scale` (sh, sw) is the coordinate scale, out / in when None."""
        sc = None if scale is None else tuple(float(s) for s in _pair_any(scale, "scale"))
        op = Resize(_dim_pair(size), _enum(ResizeMode, mode, "resize mode"),
                    _enum(CoordinateMode, coordinate, "coordinate transformation mode"),
                    _enum(NearestMode, nearest, "nearest mode"), sc, float(cubic_a),
                    bool(exclude_outside))
        return self.add_node(op, (x,))[0]
