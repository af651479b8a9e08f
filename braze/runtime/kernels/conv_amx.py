"""Convolutions under the bf16 policy on AMX tiles, as an implicit GEMM (no im2col matrix).

The policy rounds a conv's input and weight to bf16 (cast(cast(x, bf16), f32)). A conv of one
group with a static weight and such a rounded input reads the unrounded input instead (the
rounding casts are not run) and copies it once per call into a zero-padded NHWC bf16 buffer
(channels padded to 32, rounded to nearest even as they are copied). An output tile is 32
pixels x 32 output channels, four 16 x 16 f32 tiles: for every tap and block of 32 input
channels, a 16 x 32 bf16 A tile is 16 output pixels' input channels, loaded straight from the
NHWC buffer with one row stride (stride-1 convs: 32 consecutive positions along the padded
plane's pitch, so a small plane's rows share tiles and only the positions past each row's end
are wasted; strided ones: 32 pixels of one output row, the stride's pixel step apart), and the
weight's VNNI tiles (amx_gemm.amx_pack of the weight as a [taps x C, O] matrix, packed once)
are the B tiles. The tile leaves through an f32 scratch: bias, residual and activation, then
NCHW through 8 x 8 transposes or NHWC rows (nhwc_io: the input, output and residual are each
NCHW or NHWC, as the executor keeps them, runtime/layout.py). Products of bf16 values are
exact in f32 and the tiles accumulate in f32: the policy's numbers up to the order of the
sums.

Before this, such convs ran braze's f32 kernels on the rounded values after two cast passes
(slower than fp32); a pixel-row im2col + bf16 GEMM form was slower still (its im2col and
conversion passes). Groups of whole 32-channel blocks (RegNet's 64-channel groups) run group by
group; depthwise convs and other convs under AMX_MIN_MACS multiply-adds per output (on AMX
tiles MobileNetV2's 16-96-channel 1x1 convs ran at 25-66 GFLOP/s: those run the AVX512-BF16
engine where the policy rounds them) and other grouped ones keep the f32 kernels.
Isolated, hot 3x3 convs run at 1.3-1.6 TFLOP/s on the AMX Xeon VM; in ResNet-50 the per-conv
copies in and out (NCHW f32 <-> NHWC bf16) and cold weights left 0.5-0.9 ms a conv, before
the activations between convs were kept NHWC."""
from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np

from ...errors import InterpretError
from ..address import address
from ..codegen import cc
from ..plan import aligned_empty
from . import amx_gemm, bf16_gemm, c_snippets, conv_native, nhwc_io
from .registry import Dispatch, Kernel

__all__ = ["conv_kernel", "lib", "Engine", "AMX", "applies"]

SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <omp.h>
#include <immintrin.h>
#if !defined(__AMX_TILE__) || !defined(__AMX_BF16__)
#error "AMX tiles needed"
#endif
""" + cc.simd_math_decls() + cc.parallel_min_define() + c_snippets.ACT_SPAN + nhwc_io.NHWC_IO \
    + amx_gemm.TILE_CONFIG + r"""
/* y [n, o, ho, wo] = act(conv + bias (+ res)) from conv_prep_bf16's xt and the packed weight bp
   (per group, amx_pack of its [kh kw cg, og] matrix: tap t = ky kw + kx, channel block cb at k
   block t (cg / 32) + cb; cg = cp for one group, else a multiple of 32); bias [o] and res
   (y's shape) may be NULL. A tile is 32 pixels: with `pitch` (stride 1) 32 consecutive
   positions q = oy wp + ox of the padded plane's pitch, whose input for tap (ky, kx) is the
   padded pixel q + ky dh wp + kx dw (one uniform stride, rows of a small plane sharing a tile;
   the wp - wo positions past each row's end are computed and dropped); otherwise 32 pixels of
   one output row, their input sw pixels apart. */
void amx_conv(const uint16_t* xt, const uint16_t* bp, const float* bias, const float* res,
              float* y, int64_t n, int64_t o, int64_t cp, int64_t groups, int64_t cg,
              int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
              int64_t hp, int64_t wp, int64_t ho, int64_t wo, int pitch, int act,
              int lay) {
  int64_t og = o / groups, cb_n = cg / 32, kb_n = kh * kw * cb_n, nb_n = (og + 31) / 32;
  int64_t blocks = pitch ? (ho * wp + 31) / 32 : ho * ((wo + 31) / 32);
  int64_t group_w = nb_n * kb_n * 1024, plane = ho * wo, step = pitch ? cp : sw * cp;
  int64_t items = n * blocks * groups * nb_n;
  #pragma omp parallel if (BRAZE_PARALLEL(n * o * plane * kh * kw * cp, BRAZE_PAR_MIN_MACS))
  {
    configure_tiles();
    float tmp[32 * 32] __attribute__((aligned(64)));
    #pragma omp for schedule(static)
    for (int64_t it = 0; it < items; it++) {
      int64_t gn = it % (groups * nb_n), t = it / (groups * nb_n), g = gn / nb_n, nb = gn % nb_n;
      int64_t blk = t % blocks, img = t / blocks;
      int64_t q0, npx, base;  /* first position, positions, A base pixel in the image */
      tile_at(blk, 32, pitch, ho, wp, wo, sh, sw, &q0, &npx, &base);
      int two = npx > 16;
      const uint16_t* bcol = bp + g * group_w + nb * kb_n * 1024;
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int64_t ky = 0; ky < kh; ky++)
        for (int64_t kx = 0; kx < kw; kx++) {
          const uint16_t* a = xt + (img * hp * wp + base + ky * dh * wp + kx * dw) * cp + g * cg;
          const uint16_t* b = bcol + (ky * kw + kx) * cb_n * 1024;
          for (int64_t cb = 0; cb < cb_n; cb++, b += 1024) {
            _tile_loadd(4, a + cb * 32, step * 2);
            _tile_loadd(6, b, 64);
            _tile_loadd(7, b + 512, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            if (two) {
              _tile_loadd(5, a + 16 * step + cb * 32, step * 2);
              _tile_dpbf16ps(2, 5, 6);
              _tile_dpbf16ps(3, 5, 7);
            }
          }
        }
      _tile_stored(0, tmp, 128);
      _tile_stored(1, tmp + 16, 128);
      if (two) {
        _tile_stored(2, tmp + 512, 128);
        _tile_stored(3, tmp + 528, 128);
      }
      int64_t chans = og - nb * 32 < 32 ? og - nb * 32 : 32, oc0 = g * og + nb * 32;
      store_tile(tmp, 32, npx, chans, oc0, bias, res, y, img, o, plane, q0, pitch, wp, wo,
                 act, lay);
    }
    _tile_release();
  }
}

/* The conv of x [n, c, h, w]: conv_prep_bf16 into xt, then amx_conv. */
void amx_conv_run(const float* x, uint16_t* xt, const uint16_t* bp, const float* bias,
                  const float* res, float* y, int64_t n, int64_t c, int64_t h, int64_t w,
                  int64_t o, int64_t cp, int64_t groups, int64_t kh, int64_t kw, int64_t sh,
                  int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t hp,
                  int64_t wp, int64_t ho, int64_t wo, int pitch, int act, int lay) {
  conv_prep_bf16(x, xt, n, c, h, w, cp, hp, wp, pt, pl, lay & (IN_NHWC | IN_BF16));
  amx_conv(xt, bp, bias, res, y, n, o, cp, groups, groups == 1 ? cp : c / groups, kh, kw, sh,
           sw, dh, dw, hp, wp, ho, wo, pitch, act, lay);
}
"""

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {"amx_conv_run": [_P] * 6 + [_I64] * 19 + [_INT] * 3}


@cache
def lib():
    """The compiled AMX conv library, or None without AMX (or Linux's permission for its
    tiles, which amx_gemm asks for) or a C compiler."""
    if not amx_gemm.available():
        return None
    return cc.load_library(SOURCE + conv_native.packed_wrappers(_SIGNATURES), "braze_conv_amx",
                           conv_native.with_packed(_SIGNATURES))


@dataclass(frozen=True)
class Engine:
    """A bf16 implicit-GEMM conv (this module's AMX one, conv_dp's AVX512-BF16 one): its C
    library (None where it does not run), its entry point (amx_conv_run's arguments), its
    weight packing (w [o, cg, kh, kw], groups) -> packed, the input's padded channel count
    for one group, whether it takes a conv's groups, the pixels a strided tile reads past a
    row's end (a multiple of `tile`), its name in dispatch reports, and the fewest
    multiply-adds per output (kh kw C / groups) of a conv it takes (0: any the policy
    rounded)."""

    lib: Callable[[], object]
    entry: str
    pack: Callable[[np.ndarray, int], np.ndarray]
    channels: Callable[[int], int]
    takes_groups: Callable[[int, int], bool]
    tile: int
    name: str
    min_macs: int = 0


def packed_weight(w: np.ndarray, groups: int = 1) -> np.ndarray:
    """A bf16-valued conv weight [o, cg, kh, kw] as amx_conv reads it: per group, the
    [kh kw cg, og] matrix (channels zero-padded to a multiple of 32 for one group) packed into
    VNNI tile pairs, the groups one after another."""
    o, cg, kh, kw = w.shape
    og, cp = o // groups, amx_gemm.up32(cg)
    parts = []
    for g in range(groups):
        m = np.zeros((kh, kw, cp, og), np.float32)
        m[:, :, :cg, :] = w[g * og:(g + 1) * og].transpose(2, 3, 1, 0)
        parts.append(amx_gemm.AmxWeight(m.reshape(kh * kw * cp, og)).packed)
    if groups == 1:
        return parts[0]
    out = aligned_empty(sum(p.size for p in parts), np.uint16)
    np.concatenate(parts, out=out)
    return out


AMX_MIN_MACS = 256
"""The AMX conv's floor: under it (MobileNetV2's 16-96-channel 1x1 convs) AMX tiles ran at
25-66 GFLOP/s, mostly tile loads and stores; the AVX512-BF16 engine takes those."""

AMX = Engine(lib, "amx_conv_run", packed_weight, amx_gemm.up32,
             lambda groups, cg: groups == 1 or cg % 32 == 0, 32,
             "braze AMX conv: implicit GEMM on NHWC bf16", AMX_MIN_MACS)


def applies(node, geo, outs, ctx, engine: Engine) -> tuple | None:
    """(the input it reads: the unrounded f32 one, or bf16 values an earlier conv handed over
    (KernelContext.handoff); the packed weight) where the conv `node` (geometry `geo`, a
    conv.ConvGeometry) runs on `engine`, else None: no bf16 policy or no such engine here,
    groups the engine does not take (AMX: whole blocks of 32 channels), fewer multiply-adds
    per output than the engine's floor (AMX_MIN_MACS on AMX; the policy's min_conv_macs
    decides which convs are rounded at all), a weight computed at run time or not
    bf16-valued, an input the policy did not round, an output neither f32 nor bf16."""
    if ctx is None or outs[0].dtype.name not in ("f32", "bf16") or \
            not bf16_gemm.bf16_policy(ctx) or geo.kh * geo.kw * geo.cg < engine.min_macs or \
            engine.lib() is None or not engine.takes_groups(geo.groups, geo.cg):
        return None
    handed = ctx.handoff.get(node.inputs[0]) if ctx.handoff else None
    src = handed if handed is not None else bf16_gemm.rounded_source(node, ctx, 0)
    w = ctx.static.get(node.inputs[1])
    if src is None or w is None or w.dtype != np.float32 or w.ndim != 4:
        return None
    key = (engine.entry, "weight", node.inputs[1])
    if key not in ctx.prepared:
        ctx.prepared[key] = engine.pack(w, geo.groups) \
            if bf16_gemm.bf16_bits(w) is not None else None
    packed = ctx.prepared[key]
    return None if packed is None else (src, packed)


def conv_kernel(node, geo, ins, outs, ctx, act: int, has_bias: bool, residual: bool,
                what: str, cost: dict, engine: Engine | None = None
                ) -> Kernel | None:
    """The conv `node` (geometry `geo`, a conv.ConvGeometry) on `engine` (None: AMX), or None
    where it does not apply (`applies`). Its input, output and residual are NCHW or NHWC as
    the executor keeps them (KernelContext.channels_last). A bf16 output (`outs` are the
    rounding cast's, conv.rounded_output) is written rounded, NHWC, and only with an NHWC
    residual and an activation act16 has (not tanh); a bf16 input (handed over) is NHWC."""
    engine = AMX if engine is None else engine
    found = applies(node, geo, outs, ctx, engine)
    if found is None:
        return None
    src, packed = found
    lay = nhwc_io.layout_bits(node, ctx, src, residual)
    handed = ctx.handoff.get(node.inputs[0]) == src if ctx.handoff else False
    if outs[0].dtype.name == "bf16":
        if not nhwc_io.rounds_in_store(lay, act, residual):
            return None
        lay |= nhwc_io.OUT_BF16
    out16 = bool(lay & nhwc_io.OUT_BF16)
    if handed:
        if not lay & nhwc_io.IN_NHWC:
            return None
        lay |= nhwc_io.IN_BF16
    hp, wp, pitch = nhwc_io.extent(geo, engine.tile)
    cp = engine.channels(geo.c) if geo.groups == 1 else geo.c
    # bf16 values needing no padding (of the image, or of channels) and tiles reading no
    # columns past a row (tile 0: conv_dp's) are read where they are, with no copy
    in_place = handed and engine.tile == 0 and not any(geo.padding) and cp == geo.c
    if in_place:
        hp, wp = geo.h, geo.w
    out_at = len(ins)  # the output's position among the step's arrays
    (sh, sw), (dh, dw) = geo.stride, geo.dilation
    entry = getattr(engine.lib(), engine.entry)

    def call(x, w_, *rest):
        bias = rest[0] if has_bias else None
        res = rest[1] if residual else None
        if x.dtype != (amx_gemm.BF16 if handed else np.float32) or \
                (bias is not None and bias.dtype != np.float32):
            raise InterpretError(f"bf16 conv at node {node.label}: a {x.dtype} input (needs "
                                 f"{'bf16' if handed else 'f32'}, and an f32 bias)")
        return entry, (address(x), address(x if in_place else rest[-1]), address(packed),
                       None if bias is None else address(bias),
                       None if res is None else address(res), address(rest[out_at - 2]),
                       geo.n, geo.c, geo.h, geo.w, geo.o, cp, geo.groups, geo.kh, geo.kw, sh, sw,
                       dh, dw, geo.padding[0], geo.padding[1], hp, wp, geo.ho, geo.wo,
                       int(pitch), act, lay)

    return Kernel(**conv_native.c_kernel(call, out_at, library=engine.lib()),
                  dispatch=Dispatch.NATIVE, name=f"{engine.name}, "
                  f"{'bf16 operand handed over' if handed else 'operand rounded in'}"
                  f"{' (read in place)' if in_place else ''}"
                  f"{nhwc_io.describe(lay)} ({what}{', bf16 out' if out16 else ''})",
                  reads=((0, src),), **cost, channels_last=True,
                  scratch=() if in_place else
                  (((geo.n * hp * wp * cp + (32 + geo.kw * geo.dilation[1]) * cp,), np.uint16),))
