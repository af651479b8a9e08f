"""Kernels for the convolution family (float32, NCHW): conv2d and fused_conv_bias_act,
conv_transpose2d (pooling and resize: pool_resize.py).

A conv is one GEMM per image and group, written straight into the output: the weights
[Cout/g, Cin/g * kh * kw] times the image's im2col columns [Cin/g * kh * kw, Ho * Wo] give the
[Cout/g, Ho * Wo] block of the NCHW output, no transpose. A 1x1 stride-1 unpadded conv reads the
image itself as the columns (no im2col); a depthwise conv (one input channel per filter) is a
direct C loop. Bias and activation are applied in place after the GEMM (fused into the loop for
depthwise). A transposed conv is the GEMM with the weights transposed, then col2im. Other
dtypes decline and run the reference.

Where the executor keeps a conv's input, output or residual NHWC (runtime/layout.py asks
`channels_last_input` which convs can), the conv runs on a bf16 engine or braze's NHWC f32
conv (conv_nhwc.py), whichever takes it, with those arrays' layouts."""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace

import numpy as np

from ...ir.ops.conv import (
    Conv2d,
    ConvTranspose2d,
)
from ...ir.ops.elementwise import UnaryFn
from ...ir.ops.fused import FusedConvBiasAct
from ..address import address
from . import (
    blas,
    conv_amx,
    conv_dp,
    conv_native,
    conv_nhwc,
    conv_tiles,
    gemm_choice,
    native,
    nhwc_io,
)
from . import packed_gemm as pg
from .conv_native import c_kernel
from .conv_native import contiguous as _contiguous
from .fused import is_f32, then_activation
from .native import ptr as _ptr
from .registry import Dispatch, Kernel, nbytes, register_kernel

__all__ = ["ConvGeometry", "channels_last_input", "rounded_output"]

_F32 = np.float32


@dataclass(frozen=True)
class ConvGeometry:
    """Concrete sizes of one conv: image x [n, c, h, w], filters [o, cg, kh, kw] in `groups`,
    output [n, o, ho, wo]; stride, padding (top, left, bottom, right) and dilation."""

    n: int
    c: int
    h: int
    w: int
    o: int
    cg: int
    kh: int
    kw: int
    ho: int
    wo: int
    groups: int
    stride: tuple[int, int]
    padding: tuple[int, int, int, int]
    dilation: tuple[int, int]

    @classmethod
    def of(cls, op, x_dims, w_dims, out_dims) -> ConvGeometry:
        n, c, h, w = (int(d) for d in x_dims)
        o, cg, kh, kw = (int(d) for d in w_dims)
        return cls(n, c, h, w, o, cg, kh, kw, int(out_dims[2]), int(out_dims[3]), op.groups,
                   op.stride, op.padding, op.dilation)

    @property
    def og(self) -> int:
        return self.o // self.groups

    @property
    def depthwise(self) -> bool:
        """Every filter reads one input channel (groups == channels), the channels' own: an
        image of one channel under many filters (wav2vec2's first conv, 1 -> 512) is a GEMM of
        K = kh kw instead (the depthwise loop ran it at 16 GFLOP/s, 1.7x the GEMM's time)."""
        return self.cg == 1 and self.groups == self.c and (self.c > 1 or self.o == 1)

    @property
    def direct(self) -> bool:
        """A 1x1 stride-1 unpadded conv: the image is its own im2col matrix."""
        return (self.kh, self.kw, *self.stride) == (1, 1, 1, 1) and not any(self.padding)

    def window_args(self) -> tuple[int, ...]:
        """kh, kw, stride, top / left padding and dilation, as the C loops take them."""
        (sh, sw), (dh, dw) = self.stride, self.dilation
        return (self.kh, self.kw, sh, sw, self.padding[0], self.padding[1], dh, dw)

    def flops(self) -> int:
        return 2 * self.n * self.o * self.ho * self.wo * self.cg * self.kh * self.kw


def _epilogue(act: UnaryFn | None) -> tuple[int, UnaryFn | None]:
    """(C epilogue code, activation left for NumPy after it)."""
    if act in conv_native.ACTIVATIONS:
        return conv_native.ACTIVATIONS[act], None
    return 0, act


def _bf16_engines(node, ins, outs, act: UnaryFn | None, ctx):
    """(the conv on a bf16 engine, AMX tiles or AVX512-BF16, or None; its geometry, epilogue
    code, bias, residual, epilogue name and cost). An activation the C epilogue lacks is left
    to the caller (then_activation)."""
    geo = ConvGeometry.of(node.op, ins[0].dims, ins[1].dims, outs[0].dims)
    code, _ = _epilogue(act)
    has_bias = len(ins) >= 3
    residual = isinstance(node.op, FusedConvBiasAct) and node.op.residual  # input 3: rest[1]
    what = act.value if act is not None else ("bias" if has_bias else "none")
    what = f"residual + {what}" if residual else what
    cost = {"flops": geo.flops(), "bytes": nbytes(ins) + nbytes(outs)}
    for engine in (conv_amx, conv_dp):
        low = engine.conv_kernel(node, geo, ins, outs, ctx, code, has_bias, residual, what,
                                 cost)
        if low is not None:
            break
    return low, (geo, code, has_bias, residual, what, cost)


def rounded_output(node, cast_node, ins, outs, ctx) -> Kernel | None:
    """One kernel for a conv and the cast to bf16 `cast_node` that is the only reader of its
    f32 result (the bf16 policy's rounding of the next convs' input, program's hand-off): a
    bf16 engine, or the NHWC f32 conv (a depthwise one before a bf16 1x1), writing its NHWC
    result rounded to bf16 (nearest even) into the cast's output (`outs`), which the next
    convs' copy-in reads as it is (KernelContext.handoff): the f32 values never reach memory.
    None where no kernel takes it that way (nhwc_io.rounds_in_store: an NCHW output or
    residual, tanh)."""
    act = getattr(node.op, "act", None)
    if conv_native.lib() is None or not is_f32(*ins) or outs[0].dtype.name != "bf16" or \
            not isinstance(node.op, (Conv2d, FusedConvBiasAct)) or _epilogue(act)[1]:
        return None  # (an activation left for NumPy can't be rounded in the store)
    low, (geo, code, has_bias, residual, what, cost) = _bf16_engines(node, ins, outs, act, ctx)
    if low is not None:
        return low
    lay = nhwc_io.layout_bits(node, ctx, residual=residual)
    if not nhwc_io.rounds_in_store(lay, code, residual):
        return None
    return _nhwc_f32(node, geo, ins, outs, ctx, lay | nhwc_io.OUT_BF16, code, has_bias,
                     residual, what, cost)


def _nhwc_f32(node, geo, ins, outs, ctx, lay: int, code: int, has_bias: bool, residual: bool,
              what: str, cost: dict) -> Kernel | None:
    """braze's NHWC f32 conv with the layout bits `lay`, or None where it does not run."""
    packed = conv_nhwc.takes(node, geo, ins, outs, ctx)
    if packed is None:
        return None
    fields = conv_nhwc.kernel_fields(geo, packed, lay, code, has_bias, residual, len(ins))
    out16 = ", bf16 out" if lay & nhwc_io.OUT_BF16 else ""
    return Kernel(**fields, dispatch=Dispatch.NATIVE, channels_last=True, **cost,
                  name=f"braze NHWC conv: taps in registers{nhwc_io.describe(lay)} "
                  f"({what}{out16})")


def _conv_kernel(node, ins, outs, act: UnaryFn | None, ctx) -> Kernel | None:
    """The conv's kernel with its C epilogue, and NumPy's activation after it where the C
    epilogue lacks `act` (fused.then_activation)."""
    if conv_native.lib() is None or not is_f32(*ins, *outs):
        return None
    return then_activation(_epilogue_kernel(node, ins, outs, act, ctx), _epilogue(act)[1],
                           len(ins))


def _epilogue_kernel(node, ins, outs, act: UnaryFn | None, ctx) -> Kernel | None:
    """The conv on the fastest engine that takes it, its epilogue the C one (`_epilogue`)."""
    lib = conv_native.lib()
    low, (geo, code, has_bias, residual, what, cost) = _bf16_engines(node, ins, outs, act, ctx)
    if low is not None:
        return low
    out_at = len(ins)  # position of the output among the step's arrays
    lay = nhwc_io.layout_bits(node, ctx, residual=residual)
    if lay:  # a value kept NHWC (runtime/layout.py): braze's NHWC f32 conv, or none
        return _nhwc_f32(node, geo, ins, outs, ctx, lay, code, has_bias, residual, what, cost)
    if geo.depthwise:
        mult = geo.o // geo.c

        def depthwise(x, w, *rest):
            b = rest[0] if has_bias else None
            r = rest[1] if residual else None
            return lib.depthwise, (_ptr(x), _ptr(w), _ptr(b), _ptr(r), _ptr(rest[-1]), geo.n,
                                   geo.c, geo.h, geo.w, mult, *geo.window_args(), geo.ho,
                                   geo.wo, code)

        return Kernel(**c_kernel(depthwise, out_at), dispatch=Dispatch.NATIVE,
                      name=f"C depthwise conv (epilogue {what})", **cost)
    og, cg, hw_out = geo.og, geo.cg, geo.ho * geo.wo
    k = cg * geo.kh * geo.kw
    scratch = () if geo.direct else (((k, hw_out), _F32),)
    name = ("1x1 conv: " if geo.direct else "im2col + ") + f"BLAS GEMM + C epilogue ({what})"
    sgemm = blas.sgemm_address()
    static = ctx.static.get(node.inputs[1]) if ctx is not None else None
    if static is not None and (static.dtype != _F32 or static.ndim != 4):
        static = None
    paths = conv_paths(geo, static is not None, sgemm is not None)
    choice = conv_choice(geo, code, has_bias, paths) if paths else None
    if choice == "shifted":
        return Kernel(**_shifted_kernel(node, geo, ctx, static, code, has_bias, residual,
                                        out_at), dispatch=Dispatch.NATIVE, **cost,
                      name=f"braze conv tiles: shifted GEMM + epilogue per tile ({what})")
    rows = _rows_kernel(node, geo, ctx, static, code, has_bias, residual, out_at) \
        if choice == "rows" else None
    if rows is not None:
        return Kernel(**rows, dispatch=Dispatch.NATIVE, **cost,
                      name=f"pixel rows (NHWC) + braze packed GEMM, epilogue per tile ({what})")
    if sgemm is not None:  # the whole conv is one C call
        def conv_gemm(x, w, *rest):
            return lib.conv_gemm, _im2col_args(geo, x, w, rest[0] if has_bias else None,
                                               rest[out_at - 2],
                                               None if geo.direct else rest[-1], code,
                                               rest[1] if residual else None)

        return Kernel(**c_kernel(conv_gemm, out_at), dispatch=Dispatch.NATIVE,
                      name=name.replace("BLAS GEMM", "MKL sgemm"), scratch=scratch, **cost)
    in_plane, in_group = geo.h * geo.w, cg * geo.h * geo.w

    def gemm(x, w, *rest):  # NumPy's matmul per image and group
        out = rest[out_at - 2]
        b = rest[0] if has_bias else None
        x = _contiguous(x)
        filters = _contiguous(w).reshape(geo.groups, og, k)
        cols = None if geo.direct else rest[-1]
        for i in range(geo.n):
            for g in range(geo.groups):
                if cols is None:
                    src = x[i, g * cg:(g + 1) * cg].reshape(cg, in_plane)
                else:
                    start = address(x) + 4 * (i * geo.c * in_plane + g * in_group)
                    lib.im2col(start, _ptr(cols), cg, geo.h, geo.w, *geo.window_args(), geo.ho,
                               geo.wo)
                    src = cols
                blas.matmul(filters[g], src, out[i, g * og:(g + 1) * og].reshape(og, hw_out))
        r = _contiguous(rest[1]) if residual else None
        if b is not None or code or residual:
            lib.channel_epilogue(_ptr(out), _ptr(b), _ptr(r), geo.n * geo.o, geo.o, hw_out,
                                 code)

    return Kernel(gemm, Dispatch.NATIVE, name, scratch=scratch, **cost)


def channels_last_input(node, ins, outs, ctx):
    """The activation value the conv `node` reads (the unrounded one where a bf16 engine
    rounds it itself) where its kernel takes NHWC input, output and residual (the bf16
    engines, braze's NHWC f32 conv for depthwise convs and others of conv_nhwc.MIN_MACS
    multiply-adds or more); None where it keeps NCHW (runtime/layout.py)."""
    if not isinstance(node.op, (Conv2d, FusedConvBiasAct)) or conv_native.lib() is None or \
            not is_f32(*ins, *outs):
        return None
    geo = ConvGeometry.of(node.op, ins[0].dims, ins[1].dims, outs[0].dims)
    for engine in (conv_amx.AMX, conv_dp.DP):
        found = conv_amx.applies(node, geo, outs, ctx, engine)
        if found is not None:
            return found[0]
    if (geo.depthwise or geo.flops() >= 2 * conv_nhwc.MIN_MACS) and \
            conv_nhwc.takes(node, geo, ins, outs, ctx) is not None:
        return node.inputs[0]
    return None


def _im2col_args(geo: ConvGeometry, x, w, b, y, cols, act: int, res=None) -> tuple:
    """conv_native.conv_gemm's arguments (im2col + MKL's sgemm; cols None when direct; res a
    residual of y's shape or None)."""
    return (blas.sgemm_address(), blas.local_threads_address(), _ptr(x), _ptr(w), _ptr(b),
            _ptr(res), _ptr(y), _ptr(cols), geo.n, geo.c, geo.h, geo.w, geo.o, geo.groups,
            *geo.window_args(), geo.ho, geo.wo, int(geo.direct), act)


def conv_paths(geo: ConvGeometry, static_weight: bool, mkl: bool) -> tuple[str, ...]:
    """The GEMM convs that can run `geo` here (gemm_choice.CONV_CHOICES): braze's conv tiles
    with a C compiler, the pixel-row form for one group and a weight known when the program is
    built (packed once; a residual joins as its product goes back to NCHW), im2col + MKL's
    sgemm with MKL."""
    paths = []
    if conv_tiles.lib() is not None:
        paths.append("shifted")
        if geo.groups == 1 and static_weight and pg.lib() is not None:
            paths.append("rows")
    if mkl:
        paths.append("im2col")
    return tuple(paths)


def _shifted_kernel(node, geo: ConvGeometry, ctx, static, code: int, has_bias: bool,
                    residual: bool, out_at: int) -> dict:
    """The Kernel fields (run, bind, scratch) of the conv on braze's conv tiles
    (conv_tiles.py). A static weight goes to taps-major order once (ctx.prepared); another
    one per call, into scratch, as the input into its phase planes where the conv reads
    padding or strides."""
    lib = conv_tiles.lib()
    layout = conv_tiles.Layout.of(geo)
    w_t = None
    if static is not None:
        key = ("conv taps-major", node.inputs[1])
        if key not in ctx.prepared:
            ctx.prepared[key] = conv_tiles.taps_major(static)
        w_t = ctx.prepared[key]
    scratch = [] if layout.direct else [((layout.input_floats(geo),), _F32)]
    if w_t is None:
        scratch.append(((geo.o * geo.cg * geo.kh * geo.kw,), _F32))

    def call(x, w, *rest):
        extra = list(rest[out_at - 1:])
        xq = x if layout.direct else extra.pop(0)
        w_src, w_dst = (w_t, w_t) if w_t is not None else (w, extra.pop(0))
        return lib.conv_tiles_run, conv_tiles.run_args(
            geo, layout, x, xq, w_src, w_dst, rest[0] if has_bias else None,
            rest[out_at - 2], code, rest[1] if residual else None)

    return {**c_kernel(call, out_at, library=lib), "scratch": tuple(scratch)}


def _rows_kernel(node, geo: ConvGeometry, ctx, static, code: int, has_bias: bool,
                 residual: bool, out_at: int) -> dict | None:
    """The Kernel fields (run, scratch) of the conv in pixel-row form (conv_tiles.rows_conv):
    the static weight packed once for braze's GEMM; None where it can't be packed."""
    key = ("conv pixel-row weight", node.inputs[1])
    if key not in ctx.prepared:
        ctx.prepared[key] = conv_tiles.rows_weight(conv_tiles.taps_major(static))
    packed = ctx.prepared[key]
    if packed is None:
        return None
    layout = conv_tiles.RowsLayout.of(geo)
    call = conv_tiles.rows_conv(geo, layout, packed, code, residual)

    def run(x, w, *rest):
        b = _contiguous(rest[0]) if has_bias else None
        out = rest[out_at - 2]
        call(_contiguous(x), b, out, *rest[out_at - 1:],
             res=_contiguous(rest[1]) if residual else None)

    return {"run": run, "scratch": layout.scratch(geo)}


def conv_key(geo: ConvGeometry, act: int, bias: bool, paths: tuple[str, ...]) -> str:
    """The choice file's key (gemm_choice.choose_keyed) of a conv geometry and epilogue, at the
    calling thread's OpenMP thread count (the executable's limit while it builds a program:
    the paths split their work over threads differently) and the paths that could run."""
    (sh, sw), (dh, dw) = geo.stride, geo.dilation
    lib = native.lib()
    threads = lib.braze_max_threads() if lib is not None else 1
    return (f"conv-1:{geo.n}x{geo.c}x{geo.h}x{geo.w}:{geo.o}x{geo.cg}x{geo.kh}x{geo.kw}"
            f":g{geo.groups}:s{sh}x{sw}:p{'x'.join(map(str, geo.padding))}:d{dh}x{dw}"
            f":t{threads}:{'|'.join(paths)}" + (f":act{act}" if act else ":bias" if bias else ""))


def conv_choice(geo: ConvGeometry, act: int, bias: bool, paths: tuple[str, ...]) -> str:
    """Which of `paths` (conv_paths) runs this geometry here, measured once per machine
    (gemm_choice.py). They trade places by shape (AMX Xeon VM, 1 thread): braze's conv tiles
    ("shifted") took 0.79-0.91x MKL's time on 3x3 convs of 64-96 channels at 56-80 pixels a
    side; MKL's im2col + sgemm ("im2col") won most 1x1 convs; small planes with many channels
    leave most of the tiles' 64-pixel vectors idle (7x7: 49 of 64), where the pixel-row form
    ("rows": channels across the vectors, braze's packed GEMM) fits. BRAZE_CONV=shifted|rows|
    im2col forces one where it can run."""
    forced = os.environ.get("BRAZE_CONV")
    if forced in paths:
        return forced
    if len(paths) == 1:
        return paths[0]

    def runs() -> dict:
        return _choice_runs(measured_geometry(geo), act, bias, paths)

    key = conv_key(geo, act, bias, paths)
    near = gemm_choice.stand_in(key, lambda other: size_distance(key, other))
    return near if near is not None else gemm_choice.choose_keyed(key, runs)


_KEY = re.compile(r"conv-1:(\d+)x(\d+)x(\d+)x(\d+):(.*)")
NEAR_SIZE = math.log(2.0)  # how far (|log h ratio| + |log w ratio|) a measured size stands in


def size_distance(key: str, other: str) -> float | None:
    """How far apart two conv choice keys' image sizes are, when they differ only in the batch
    and the input's H and W, by at most a factor of 2 in H x W; else None. The paths' costs
    per output row depend on the channels, kernel, stride and width, and the measured conv
    caps the rows (measured_geometry), so a nearby size's choice stands for this one."""
    a, b = _KEY.fullmatch(key), _KEY.fullmatch(other)
    if a is None or b is None or a[2] != b[2] or a[5] != b[5] or \
            0 in (int(a[3]), int(a[4]), int(b[3]), int(b[4])):
        return None
    d = abs(math.log(int(a[3]) / int(b[3]))) + abs(math.log(int(a[4]) / int(b[4])))
    return d if d <= NEAR_SIZE else None


MEASURED_MACS = 1 << 23  # a choice's measured conv does at most about this many multiply-adds


def measured_geometry(geo: ConvGeometry) -> ConvGeometry:
    """The conv a choice for `geo` is measured on: one image, and only as many output rows as
    keep it near MEASURED_MACS (a 960 x 960 OCR image's convs took 10-100 ms a call: dozens of
    calls per path and geometry would have made a cold compile take minutes). The width,
    channels, kernel, stride and top padding stay: the paths' costs depend on them, and per row
    they scale with the rows."""
    per_row = geo.o * geo.wo * geo.cg * geo.kh * geo.kw
    ho = max(1, min(geo.ho, MEASURED_MACS // max(per_row, 1)))
    if geo.n == 1 and ho == geo.ho:
        return geo
    (sh, _), (dh, _) = geo.stride, geo.dilation
    pt, pl, pb, pr = geo.padding
    if ho < geo.ho:  # the rows the first ho outputs read, bottom padding where they run past
        need = (ho - 1) * sh + (geo.kh - 1) * dh + 1 - pt
        h = max(1, min(geo.h, need))
        pb = max(0, need - h)
    else:
        h = geo.h
    return replace(geo, n=1, h=h, ho=ho, padding=(pt, pl, pb, pr))


def _choice_runs(geo: ConvGeometry, act: int, bias: bool, paths: tuple[str, ...]) -> dict:
    """{path: call} for each of `paths` on random operands of `geo`."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((geo.n, geo.c, geo.h, geo.w), dtype=_F32)
    w = rng.standard_normal((geo.o, geo.cg, geo.kh, geo.kw), dtype=_F32)
    w /= np.float32(np.sqrt(geo.cg * geo.kh * geo.kw))
    b = np.linspace(-1, 1, geo.o, dtype=_F32) if act or bias else None
    y = np.empty((geo.n, geo.o, geo.ho, geo.wo), _F32)
    w_t = conv_tiles.taps_major(w)
    keep = [x, w, b, y, w_t]  # alive as long as the calls
    calls = {}
    if "shifted" in paths:
        layout = conv_tiles.Layout.of(geo)
        xq = x if layout.direct else np.empty(layout.input_floats(geo), _F32)
        args = conv_tiles.run_args(geo, layout, x, xq, w_t, w_t, b, y, act)
        keep.append(xq)
        calls["shifted"] = lambda: conv_tiles.lib().conv_tiles_run(*args)
    if "rows" in paths:
        rows = conv_tiles.RowsLayout.of(geo)
        scratch = [np.empty(shape, dt) for shape, dt in rows.scratch(geo)]
        packed = conv_tiles.rows_weight(w_t)
        call = conv_tiles.rows_conv(geo, rows, packed, act)
        keep += [scratch, packed]
        calls["rows"] = lambda: call(x, b, y, *scratch)
    if "im2col" in paths:
        cols = None if geo.direct else \
            np.empty((geo.cg * geo.kh * geo.kw, geo.ho * geo.wo), _F32)
        mkl_args = _im2col_args(geo, x, w, b, y, cols, act)
        keep.append(cols)
        calls["im2col"] = lambda: conv_native.lib().conv_gemm(*mkl_args)
    return {name: (lambda fn=fn: (keep, fn())) for name, fn in calls.items()}


@register_kernel(Conv2d)
def conv2d(node, ins, outs, ctx):
    return _conv_kernel(node, ins, outs, None, ctx)


@register_kernel(FusedConvBiasAct)
def fused_conv_bias_act(node, ins, outs, ctx):
    return _conv_kernel(node, ins, outs, node.op.act, ctx)


@register_kernel(ConvTranspose2d)
def conv_transpose2d(node, ins, outs, ctx):
    """cols = W_g^T x_g (one GEMM per image and group), then col2im into the output; where the
    windows do not overlap (kernel == stride, no dilation: the 2x2 stride-2 upsampling of
    segmentation heads) each output pixel is one read of cols, bias included
    (col2im_disjoint), instead of zeroing, scatter-adding and a bias pass. A static weight is
    transposed once."""
    lib = conv_native.lib()
    if lib is None or not is_f32(*ins, *outs):
        return None
    op = node.op
    n, c, h, w = (int(d) for d in ins[0].dims)
    _, og, kh, kw = (int(d) for d in ins[1].dims)
    ho, wo = (int(d) for d in outs[0].dims[2:])
    groups = op.groups
    cg, o, k = c // groups, og * groups, og * kh * kw
    (sh, sw), (dh, dw) = op.stride, op.dilation
    window = (kh, kw, sh, sw, op.padding[0], op.padding[1], dh, dw)
    has_bias = op.has_bias
    disjoint = (kh, kw, dh, dw) == (sh, sw, 1, 1)
    static = ctx.static.get(node.inputs[1]) if ctx is not None else None
    wt_static = None
    if static is not None and static.dtype == _F32:
        key = ("conv-transpose weight, transposed", node.inputs[1])
        if key not in ctx.prepared:
            ctx.prepared[key] = np.ascontiguousarray(
                static.reshape(groups, cg, k).transpose(0, 2, 1))
        wt_static = ctx.prepared[key]

    def run(x, wt, *rest):
        out, cols, wt_t = rest[-3:]
        b = _contiguous(rest[0]) if has_bias else None
        x = _contiguous(x)
        if wt_static is not None:
            wt_t = wt_static
        else:
            np.copyto(wt_t, wt.reshape(groups, cg, k).transpose(0, 2, 1))
        for i in range(n):
            for g in range(groups):
                blas.matmul(wt_t[g], x[i, g * cg:(g + 1) * cg].reshape(cg, h * w), cols)
                start = address(out) + 4 * (i * o + g * og) * ho * wo
                if disjoint:
                    lib.col2im_disjoint(_ptr(cols), None if b is None else
                                        address(b) + 4 * g * og, start, og, h, w, kh, kw,
                                        op.padding[0], op.padding[1], ho, wo)
                else:
                    lib.col2im(_ptr(cols), start, og, h, w, *window, ho, wo)
        if b is not None and not disjoint:
            lib.channel_epilogue(_ptr(out), _ptr(b), None, n * o, o, ho * wo, 0)

    name = "BLAS GEMM + C " + ("disjoint col2im with bias" if disjoint else "col2im")
    return Kernel(run, Dispatch.NATIVE, name,
                  flops=2 * n * c * h * w * og * kh * kw, bytes=nbytes(ins) + nbytes(outs),
                  scratch=(((k, h * w), _F32), ((groups, k, cg), _F32)))
