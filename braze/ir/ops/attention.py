"""Attention and rotary position embedding (RoPE): logical composite ops with a direct NumPy
reference and a decomposition into primitives, plus `rope_tables` for model builders.

Attention: q [B, Hq, Sq, D], k/v [B, Hkv, Sk, D|Dv], Hkv divides Hq; query head h reads kv head
h // (Hq // Hkv). Causal masks align the last query with the last key (offset Sk - Sq)."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ...errors import ShapeError
from ..dtypes import DType
from ..op import Op, require, same_dtype
from ..shapes import Dim, Shape, broadcast_dims
from .reduce import safe_softmax

__all__ = ["MaskKind", "Attention", "Rope", "rope_tables", "visible_keys"]


class MaskKind(enum.Enum):
    """How attention scores are masked. CUSTOM and BIAS take a 4th, additive input."""

    NONE = "none"
    CAUSAL = "causal"
    SLIDING_WINDOW = "sliding_window"
    CUSTOM = "custom"
    BIAS = "bias"

    @property
    def takes_input(self) -> bool:
        return self in (MaskKind.CUSTOM, MaskKind.BIAS)

    @property
    def is_causal(self) -> bool:
        return self in (MaskKind.CAUSAL, MaskKind.SLIDING_WINDOW)


def visible_keys(mask: MaskKind, sq: int, sk: int, window: int = 0) -> np.ndarray:
    """Bool [sq, sk]: which keys each query may attend to under a causal / sliding-window mask.
    Query i sees key j iff j <= i + (sk - sq), and for a window also j > i + (sk - sq) - window."""
    last = np.arange(sq)[:, None] + (sk - sq)
    j = np.arange(sk)[None, :]
    ok = j <= last
    if mask is MaskKind.SLIDING_WINDOW:
        ok &= j > last - window
    elif mask is not MaskKind.CAUSAL:
        ok = np.ones((sq, sk), bool)
    return ok


def _masked_value(dt) -> float:
    """The finite stand-in for -inf at masked scores (a fully masked row stays finite)."""
    return float(ml_dtypes.finfo(dt).min)


def _compute_dtype(dt: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dt.itemsize < 4 else dt


@dataclass(frozen=True)
class Attention(Op):
    """softmax(mask(softcap(q @ k^T * scale))) @ v with grouped-query heads.

    `scale` defaults to 1/sqrt(D); `softcap` c maps scores s to c * tanh(s / c) before masking;
    CAUSAL / SLIDING_WINDOW (`window` keys, the query's own included) mask to a large negative
    value; CUSTOM / BIAS add a 4th input broadcastable to [B, Hq, Sq, Sk]. A query whose scores
    are all -inf after masking (every key masked by a -inf custom mask) outputs zeros, as
    PyTorch's scaled_dot_product_attention does (the softmax is braze's safe softmax).

    `round_operands` (set by the mixed-precision policy, braze/passes/precision.py): q, k, v
    and the probabilities are rounded to that dtype (and back) before their matmuls, whose
    products and sums stay in the compute dtype - what a bf16 GEMM with f32 accumulation
    computes. Autodiff passes gradients through that rounding unchanged, as through the
    policy's Cast pairs."""

    kind = "attention"
    arity = None
    min_arity = 3
    composite = True
    mask: MaskKind = MaskKind.NONE
    window: int = 0
    scale: float | None = None
    softcap: float | None = None
    round_operands: DType | None = None

    @property
    def n_inputs(self) -> int:
        return 4 if self.mask.takes_input else 3

    def check_arity(self, n: int) -> None:
        require(n == self.n_inputs, f"attention with mask {self.mask.value} takes "
                f"{self.n_inputs} inputs, got {n}")

    def infer(self, ins):
        q, k, v = ins[:3]
        same_dtype(self, ins)
        require(q.dtype.is_float, f"attention needs float inputs, got {q.dtype}")
        for name, s in (("q", q), ("k", k), ("v", v)):
            require(s.rank == 4, f"attention {name} must be [B, H, S, D], got {s}")
        b, hq, sq, d = q.dims
        require(k.dims[0] == b and v.dims[0] == b,
                f"attention batch differs: q {b}, k {k.dims[0]}, v {v.dims[0]}")
        hkv, sk = k.dims[1], k.dims[2]
        require(v.dims[1] == hkv and v.dims[2] == sk,
                f"attention k {k} and v {v} disagree on heads or sequence")
        require(k.dims[3] == d, f"attention head dim differs: q {d}, k {k.dims[3]}")
        if isinstance(hq, int) and isinstance(hkv, int):
            require(hkv > 0 and hq % hkv == 0,
                    f"attention kv heads {hkv} must divide query heads {hq}")
        else:
            require(hq == hkv, f"attention with symbolic heads needs Hq == Hkv, got {hq}, {hkv}")
        if self.mask is MaskKind.SLIDING_WINDOW:
            require(self.window > 0, f"sliding-window attention needs window > 0, got "
                    f"{self.window}")
        else:
            require(self.window == 0, f"attention window {self.window} is only meaningful with "
                    "mask sliding_window")
        require(self.softcap is None or self.softcap > 0,
                f"attention softcap must be > 0, got {self.softcap}")
        require(self.round_operands is None or self.round_operands.is_float,
                f"attention round_operands must be a float dtype, got {self.round_operands}")
        require(self.scale is not None or isinstance(d, int),
                f"attention with symbolic head dim {d!r} needs an explicit scale")
        if self.mask.takes_input:
            m, full = ins[3], (b, hq, sq, sk)
            ok = m.rank <= 4
            if ok:
                try:
                    ok = broadcast_dims(m.dims, full) == full
                except ShapeError:
                    ok = False
            require(ok, f"attention {self.mask.value} input {m} does not broadcast to "
                    f"[B, Hq, Sq, Sk] = [{', '.join(map(str, full))}]")
        return Shape((b, hq, sq, v.dims[3]), q.dtype)

    def score_scale(self, d: int) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(d)

    def reference(self, q, k, v, m=None):
        out_dt, ct = q.dtype, _compute_dtype(q.dtype)
        q, k, v = (self._rounded(a.astype(ct, copy=False)) for a in (q, k, v))
        rep = q.shape[1] // k.shape[1]
        if rep > 1:
            k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.matmul(q, k.swapaxes(-1, -2)) * ct.type(self.score_scale(q.shape[-1]))
        if self.softcap is not None:
            c = ct.type(self.softcap)
            s = c * np.tanh(s / c)
        if self.mask.is_causal:
            ok = visible_keys(self.mask, q.shape[2], k.shape[2], self.window)
            s = np.where(ok, s, ct.type(_masked_value(ct)))
        if m is not None:
            s = s + m.astype(ct, copy=False)
        return np.matmul(self._rounded(safe_softmax(s, -1)), v).astype(out_dt, copy=False)

    def _rounded(self, a: np.ndarray) -> np.ndarray:
        if self.round_operands is None:
            return a
        return a.astype(self.round_operands.np).astype(a.dtype)

    def decompose(self, g, ins):
        q, k, v = (self._round(g, x) for x in ins[:3])
        qs, ks = g.shape_of(q), g.shape_of(k)
        hq, sq, d = qs.dims[1:]
        hkv, sk = ks.dims[1], ks.dims[2]
        if hq != hkv:
            k, v = _repeat_heads(g, k, hq // hkv), _repeat_heads(g, v, hq // hkv)
        s = g.matmul(q, g.transpose(k, (0, 1, 3, 2)))
        s = g.mul(s, self.score_scale(d))
        if self.softcap is not None:
            s = g.mul(g.tanh(g.div(s, self.softcap)), self.softcap)
        if self.mask.is_causal:
            s = g.where(_visible(g, self.mask, sq, sk, self.window), s,
                        _masked_value(qs.dtype.np))
        if self.mask.takes_input:
            s = g.add(s, ins[3])
        return g.matmul(self._round(g, g.softmax(s, axis=-1)), v)

    def _round(self, g, x):
        if self.round_operands is None:
            return x
        return g.cast(g.cast(x, self.round_operands), g.shape_of(x).dtype)


def _visible(g, mask: MaskKind, sq: Dim, sk: Dim, window: int):
    """bool [Sq, Sk] visible_keys as graph ops: a constant for static lengths, else built
    from ranges so it holds for every binding of the sequence symbols."""
    if isinstance(sq, int) and isinstance(sk, int):
        return g.constant(visible_keys(mask, sq, sk, window))
    from ..symbolic import SymDim

    last = g.reshape(g.arange(sq), (sq, 1))
    offset = (SymDim.of(sk) - SymDim.of(sq)).to_dim()
    if offset != 0:
        last = g.add(last, g.sym_const((offset,), ()))
    j = g.reshape(g.arange(sk), (1, sk))
    ok = g.le(j, last)
    if mask is MaskKind.SLIDING_WINDOW:
        ok = g.logical_and(ok, g.gt(j, g.sub(last, g.constant(np.int64(window)))))
    return ok


def _repeat_heads(g, x, rep: int):
    """[B, Hkv, S, D] -> [B, Hkv * rep, S, D], each kv head repeated `rep` times in place."""
    b, h, s, d = g.shape_of(x).dims
    x5 = g.reshape(x, (b, h, 1, s, d))
    return g.reshape(g.expand(x5, (b, h, rep, s, d)), (b, h * rep, s, d))


# -- rotary position embedding ------------------------------------------------------------------
@dataclass(frozen=True)
class Rope(Op):
    """Rotary position embedding of x [..., S, D] by cos/sin [S, n_rot/2] (or broadcastable
    [..., S, n_rot/2]). Rotates the first `n_rot` dims (None: all), passes the rest through.
    Rotate-half (NeoX) pairs dims (i, i + n_rot/2); `interleaved` (GPT-J) pairs (2i, 2i + 1)."""

    kind = "rope"
    arity = 3
    composite = True
    interleaved: bool = False
    n_rot: int | None = None

    def rotated(self, d: Dim) -> int:
        return d if self.n_rot is None else self.n_rot

    def infer(self, ins):
        x, cos, sin = ins
        same_dtype(self, ins)
        require(x.dtype.is_float, f"rope needs float inputs, got {x.dtype}")
        require(x.rank >= 2, f"rope input must be [..., S, D], got {x}")
        d = x.dims[-1]
        require(isinstance(d, int), f"rope needs a static head dim, got {d!r}")
        n = self.rotated(d)
        require(0 < n <= d and n % 2 == 0, f"rope n_rot must be even and in (0, {d}], got {n}")
        require(cos.dims == sin.dims, f"rope cos {cos} and sin {sin} differ")
        require(1 <= cos.rank <= x.rank and cos.dims[-1] == n // 2,
                f"rope cos/sin must be [S, {n // 2}] (or [..., S, {n // 2}]), got {cos}")
        lead = x.dims[:-1]
        try:
            ok = broadcast_dims(cos.dims[:-1], lead) == lead
        except ShapeError:
            ok = False
        require(ok, f"rope cos/sin {cos} do not broadcast against x {x} positions")
        return x

    def reference(self, x, cos, sin):
        n, h = self.rotated(x.shape[-1]), self.rotated(x.shape[-1]) // 2
        xr = x[..., :n]
        if self.interleaved:
            a, b = xr[..., 0::2], xr[..., 1::2]
        else:
            a, b = xr[..., :h], xr[..., h:]
        ra, rb = a * cos - b * sin, b * cos + a * sin
        if self.interleaved:
            rot = np.stack(np.broadcast_arrays(ra, rb), axis=-1).reshape(ra.shape[:-1] + (n,))
        else:
            rot = np.concatenate(np.broadcast_arrays(ra, rb), axis=-1)
        out = np.concatenate([rot, x[..., n:]], axis=-1) if n < x.shape[-1] else rot
        return out.astype(x.dtype, copy=False)

    def decompose(self, g, ins):
        x, cos, sin = ins
        dims = g.shape_of(x).dims
        d = dims[-1]
        n = self.rotated(d)
        h = n // 2
        if self.interleaved:
            pairs = g.reshape(g.narrow(x, -1, 0, n) if n < d else x, dims[:-1] + (h, 2))
            a = g.reshape(g.narrow(pairs, -1, 0, 1), dims[:-1] + (h,))
            b = g.reshape(g.narrow(pairs, -1, 1, 1), dims[:-1] + (h,))
        else:
            a, b = g.narrow(x, -1, 0, h), g.narrow(x, -1, h, h)
        ra = g.sub(g.mul(a, cos), g.mul(b, sin))
        rb = g.add(g.mul(b, cos), g.mul(a, sin))
        if self.interleaved:
            col = dims[:-1] + (h, 1)
            rot = g.reshape(g.concat([g.reshape(ra, col), g.reshape(rb, col)], -1),
                            dims[:-1] + (n,))
        else:
            rot = g.concat([ra, rb], -1)
        return g.concat([rot, g.narrow(x, -1, n, d - n)], -1) if n < d else rot


def rope_tables(seq_len: int, n_rot: int, base: float = 10000.0, dtype=np.float32
                ) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables [seq_len, n_rot // 2] for positions 0..seq_len-1 with frequencies
    base ** (-2i / n_rot), computed in float64 and cast to `dtype`."""
    if n_rot <= 0 or n_rot % 2:
        raise ValueError(f"rope n_rot must be a positive even number, got {n_rot}")
    inv_freq = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    angles = np.outer(np.arange(seq_len, dtype=np.float64), inv_freq)
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)
