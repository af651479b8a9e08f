"""DynamicQuantMatMul: `act(x @ w + b)` with w stored as int8 and x quantized per row when it
runs, as `bz.quantize_dynamic` rewrites a linear layer (passes/quant/dynamic_matmul.py).

Its decomposition is its meaning, written in the quantize / dequantize primitives (quant.py):
each row of x (x viewed as [rows, K]) is quantized to u8 with a scale and zero point from the
row's min and max, 0 included (ONNX DynamicQuantizeLinear's formulas, per row):

  scale = (max - min) / 255 (1 where that is 0), zp = saturate_u8(round(-min / scale))
  (a row holding a NaN: scale NaN, zp 0, so its outputs are NaN, as a float matmul's; one
  holding an infinity: scale inf, so its values dequantize to 0 * inf, NaN too)
  x' = fake_quantize(x, scale, zp) = dequantize(quantize(x, ...))   (per row: axis 0)
  w' = w_q * w_scale                (dequantize(w_q, w_scale, 0) per column, as a cast and a
                                     multiply: see below)
  y = act(x' @ w' + b)

The CPU kernel (runtime/kernels/int8_gemm.py) computes the same quantization and sums the
u8 x s8 products in int32, exactly; it differs from the decomposition only by the order and
rounding of the float32 sums. The weight's dequantize is written as cast(w_q) * w_scale (the
same float32 numbers): ONNX Runtime's optimizer (1.32, level EXTENDED and up) fuses two
DequantizeLinear nodes feeding a MatMul into MatMulIntegerToFloat, which then refuses the
per-row zero point at run time ("Per-Channel is not supported yet"). Autodiff differentiates
the decomposition: fake_quantize passes x's cotangent straight through (every value of a row
lies in its row's range), the int8 weight gets none and its scales get the multiply's."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..dtypes import f32, i8, u8
from ..op import Value, require
from ..shapes import broadcast_dims
from .elementwise import Unary, UnaryFn
from .fused_simple import FusedOp, _act_infer
from .quant import FakeQuantize

if TYPE_CHECKING:
    from ..graph import Graph

__all__ = ["DynamicQuantMatMul", "MAX_K"]

MAX_K = 33000  # the longest rows whose int32 sums (255 * 127 * K, and zp * column sum) fit


@dataclass(frozen=True)
class DynamicQuantMatMul(FusedOp):
    """`act(dynamic_quantize(x) @ dequantize(w_q, w_scale) + b)`: inputs (x, w_q, w_scale[, b]);
    x f32 [..., K], w_q i8 [K, N] (symmetric: zero point 0), w_scale f32 [N] (one scale per
    column; a per-tensor scale repeated), b f32 of rank <= 1."""

    kind = "dynamic_quant_matmul"
    act: UnaryFn | None = None
    has_bias: bool = False

    def input_roles(self) -> tuple[str, ...]:
        return ("x", "w_q", "w_scale", "b") if self.has_bias else ("x", "w_q", "w_scale")

    def infer(self, ins):
        r = self.named(ins)
        x, wq, ws = r["x"], r["w_q"], r["w_scale"]
        require(x.dtype == f32 and x.rank >= 1, f"{self.kind} needs an f32 x of rank >= 1, "
                                                f"got {x}")
        require(wq.dtype == i8 and wq.rank == 2, f"{self.kind} needs an i8 [K, N] w_q, got {wq}")
        require(x.dims[-1] == wq.dims[0],
                f"{self.kind}: x {x} and w_q {wq} disagree on K (x's last dim, w_q's first)")
        require(ws.dtype == f32 and ws.dims == (wq.dims[1],),
                f"{self.kind} needs an f32 w_scale [{wq.dims[1]}] (one per column), got {ws}")
        y = x.with_dims(x.dims[:-1] + (wq.dims[1],))
        if self.has_bias:
            b = r["b"]
            require(b.dtype == f32 and b.rank <= 1, f"{self.kind} needs an f32 bias of rank "
                                                    f"<= 1, got {b}")
            require(broadcast_dims(y.dims, b.dims) == y.dims,
                    f"{self.kind} bias {b} does not broadcast onto the product {y}")
        return _act_infer(self.act, y)

    def decompose(self, g: Graph, ins: Sequence[Value]) -> Value:
        r = self.named(ins)
        x, wq = r["x"], r["w_q"]
        xs, (k, n) = g.shape_of(x), g.shape_of(wq).dims
        rows = g.reshape(x, (-1, k))
        lo = g.minimum(g.reduce_min(rows, 1), 0.0)
        hi = g.maximum(g.reduce_max(rows, 1), 0.0)
        span = g.div(g.sub(hi, lo), 255.0)
        scale = g.where(g.compare(span, 0.0, "eq"), 1.0, span)   # NaN stays: a NaN row
        zp_f = g.clamp(g.add_node(Unary(UnaryFn.ROUND), (g.div(g.neg(lo), scale),))[0], 0, 255)
        zp = g.cast(g.where(g.isnan(zp_f), 0.0, zp_f), u8)
        xd = g.add_node(FakeQuantize(0), (rows, scale, zp))[0]
        wd = g.mul(g.cast(wq, f32), r["w_scale"])
        y = g.reshape(g.matmul(xd, wd), xs.dims[:-1] + (n,))
        if self.has_bias:
            y = g.add(y, r["b"])
        return y if self.act is None else g.activation(y, self.act)
