"""Attention backward ops: `attention_backward` (one cotangent: q, k, v or the additive
mask/bias input, chosen by `wrt`) and `attention_backward_all` (d q, d k, d v as three outputs).
Inputs are (dy, q, k, v[, mask]); the attributes are the forward Attention's, so every mask kind
(none, causal, sliding window, custom, bias), grouped-query heads, the score scale and the logit
softcap are covered. Both recompute the probabilities P from q and k (no saved activations):

    dV = P^T dy;  dP = dy V^T;  dS = P * (dP - rowsum(dP * P));  masked scores get no gradient;
    softcap: dS0 = dS * (1 - tanh^2(s0 / c));  dQ = scale * dS0 K;  dK = scale * dS0^T Q;
and with grouped-query heads dK / dV sum over the query heads that share a kv head."""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ..op import Op, require
from ..shapes import Shape
from .attention import (
    Attention,
    MaskKind,
    _compute_dtype,
    _masked_value,
    _repeat_heads,
    _visible,
    visible_keys,
)
from .reduce import safe_softmax

__all__ = ["AttentionGrad", "AttentionBackward", "AttentionBackwardAll"]


class AttentionGrad(enum.Enum):
    """Which input's cotangent `attention_backward` returns."""

    Q = "q"
    K = "k"
    V = "v"
    MASK = "mask"


@dataclass(frozen=True)
class _AttentionBackwardBase(Op):
    """The forward attention's attributes; inputs (dy, q, k, v[, mask])."""

    arity = None
    min_arity = 4
    composite = True
    mask: MaskKind = MaskKind.NONE
    window: int = 0
    scale: float | None = None
    softcap: float | None = None

    def forward(self) -> Attention:
        return Attention(self.mask, self.window, self.scale, self.softcap)

    def check_arity(self, n: int) -> None:
        want = 1 + self.forward().n_inputs
        require(n == want, f"{self.kind} with mask {self.mask.value} takes {want} inputs "
                f"(dy, q, k, v{', mask' if want == 5 else ''}), got {n}")

    def check(self, ins) -> tuple[Shape, ...]:
        dy, fwd = ins[0], ins[1:]
        out = self.forward().infer(tuple(fwd))
        require(dy.dims == out.dims and dy.dtype == out.dtype,
                f"{self.kind}: dy {dy} must have attention's output type {out}")
        return tuple(fwd)

    def np_grads(self, dy, q, k, v, m=None) -> dict[AttentionGrad, np.ndarray]:
        """Every cotangent in NumPy, in the compute dtype."""
        ct = _compute_dtype(q.dtype)
        dy, q, k, v = (a.astype(ct, copy=False) for a in (dy, q, k, v))
        b, hkv = k.shape[:2]
        rep = q.shape[1] // hkv
        kk, vv = (np.repeat(a, rep, axis=1) if rep > 1 else a for a in (k, v))
        scale = ct.type(self.forward().score_scale(q.shape[-1]))
        s = np.matmul(q, kk.swapaxes(-1, -2)) * scale
        th = None
        if self.softcap is not None:
            c = ct.type(self.softcap)
            th = np.tanh(s / c)
            s = c * th
        ok = None
        if self.mask.is_causal:
            ok = visible_keys(self.mask, q.shape[2], k.shape[2], self.window)
            s = np.where(ok, s, ct.type(_masked_value(ct)))
        if m is not None:
            s = s + m.astype(ct, copy=False)
        p = safe_softmax(s, -1)
        dp = np.matmul(dy, vv.swapaxes(-1, -2))
        ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
        grads = {AttentionGrad.MASK: _np_unbroadcast(ds, m.shape) if m is not None else None}
        if ok is not None:
            ds = np.where(ok, ds, ct.type(0))
        if th is not None:
            ds = ds * (1 - th * th)

        def group_sum(a):
            return a.reshape(b, hkv, rep, *a.shape[2:]).sum(axis=2) if rep > 1 else a

        grads[AttentionGrad.Q] = np.matmul(ds, kk) * scale
        grads[AttentionGrad.K] = group_sum(np.matmul(ds.swapaxes(-1, -2), q) * scale)
        grads[AttentionGrad.V] = group_sum(np.matmul(p.swapaxes(-1, -2), dy))
        return grads

    def graph_grads(self, g, ins, want: tuple[AttentionGrad, ...]) -> dict:
        """The cotangents in `want` as graph ops."""
        dy, q, k, v = ins[:4]
        m = ins[4] if len(ins) == 5 else None
        qs, ks = g.shape_of(q), g.shape_of(k)
        hq, sq, d = qs.dims[1:]
        hkv, sk = ks.dims[1], ks.dims[2]
        rep = hq // hkv if hq != hkv else 1
        kk, vv = (_repeat_heads(g, a, rep) if rep > 1 else a for a in (k, v))
        scale = self.forward().score_scale(d)
        s = g.mul(g.matmul(q, g.transpose(kk, (0, 1, 3, 2))), scale)
        th = None
        if self.softcap is not None:
            th = g.tanh(g.div(s, self.softcap))
            s = g.mul(th, self.softcap)
        ok = None
        if self.mask.is_causal:
            ok = _visible(g, self.mask, sq, sk, self.window)
            s = g.where(ok, s, _masked_value(qs.dtype.np))
        if m is not None:
            s = g.add(s, m)
        p = g.softmax(s, -1)
        out = {}
        if AttentionGrad.V in want:
            out[AttentionGrad.V] = _group_sum(g, g.matmul(g.transpose(p, (0, 1, 3, 2)), dy), rep)
        if want == (AttentionGrad.V,):
            return out
        dp = g.matmul(dy, g.transpose(vv, (0, 1, 3, 2)))
        ds = g.mul(p, g.sub(dp, g.sum(g.mul(dp, p), -1, keepdims=True)))
        if AttentionGrad.MASK in want:
            out[AttentionGrad.MASK] = _graph_unbroadcast(g, ds, g.shape_of(m).dims)
        if ok is not None:
            ds = g.where(ok, ds, 0.0)
        if th is not None:
            ds = g.mul(ds, g.sub(1.0, g.mul(th, th)))
        if AttentionGrad.Q in want:
            out[AttentionGrad.Q] = g.mul(g.matmul(ds, kk), scale)
        if AttentionGrad.K in want:
            dk = g.mul(g.matmul(g.transpose(ds, (0, 1, 3, 2)), q), scale)
            out[AttentionGrad.K] = _group_sum(g, dk, rep)
        return out


def _np_unbroadcast(a: np.ndarray, shape: tuple) -> np.ndarray:
    lead = a.ndim - len(shape)
    a = a.sum(axis=tuple(range(lead))) if lead else a
    ones = tuple(i for i, n in enumerate(shape) if n == 1 and a.shape[i] != 1)
    return a.sum(axis=ones, keepdims=True) if ones else a


def _graph_unbroadcast(g, a, dims: tuple):
    lead = g.shape_of(a).rank - len(dims)
    a = g.sum(a, tuple(range(lead))) if lead else a
    have = g.shape_of(a).dims
    ones = tuple(i for i, n in enumerate(dims) if n == 1 and have[i] != 1)
    return g.sum(a, ones, keepdims=True) if ones else a


def _group_sum(g, a, rep: int):
    """[B, Hkv * rep, S, D] -> [B, Hkv, S, D], summing each kv head's `rep` query heads."""
    if rep == 1:
        return a
    b, h, s, d = g.shape_of(a).dims
    return g.sum(g.reshape(a, (b, h // rep, rep, s, d)), 2)


@dataclass(frozen=True)
class AttentionBackward(_AttentionBackwardBase):
    """One cotangent of attention, picked by `wrt` (q, k, v, or the custom/bias mask input)."""

    kind = "attention_backward"
    wrt: AttentionGrad = AttentionGrad.Q

    def infer(self, ins):
        q, k, v, *m = self.check(ins)
        if self.wrt is AttentionGrad.MASK:
            require(bool(m), f"{self.kind} wrt=mask needs a mask kind with an input, got "
                    f"{self.mask.value}")
            return m[0]
        return {AttentionGrad.Q: q, AttentionGrad.K: k, AttentionGrad.V: v}[self.wrt]

    def reference(self, dy, q, k, v, m=None):
        want = (q, k, v, m)[list(AttentionGrad).index(self.wrt)]
        return self.np_grads(dy, q, k, v, m)[self.wrt].astype(want.dtype, copy=False)

    def decompose(self, g, ins):
        return self.graph_grads(g, ins, (self.wrt,))[self.wrt]


@dataclass(frozen=True)
class AttentionBackwardAll(_AttentionBackwardBase):
    """(d q, d k, d v) of attention in one op sharing the recomputed probabilities."""

    kind = "attention_backward_all"

    def infer(self, ins):
        return self.check(ins)[:3]

    def reference(self, dy, q, k, v, m=None):
        grads = self.np_grads(dy, q, k, v, m)
        return tuple(grads[w].astype(q.dtype, copy=False)
                     for w in (AttentionGrad.Q, AttentionGrad.K, AttentionGrad.V))

    def decompose(self, g, ins):
        want = (AttentionGrad.Q, AttentionGrad.K, AttentionGrad.V)
        grads = self.graph_grads(g, ins, want)
        return tuple(grads[w] for w in want)
