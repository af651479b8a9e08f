"""Attention kernels: q @ k^T and p @ v on BLAS, the scale / softcap / mask / safe-softmax step
in one native pass over the scores, in query blocks so the scores of a long sequence are never
all in memory at once (flash-style tiling: at most BLOCK_BYTES of scores per block). GQA runs
without copying k and v: the query heads of one kv head are stacked as rows of one matmul.

FusedAttentionBlock builds on it: one GEMM for the packed QKV projection (+ bias), heads
split (and rotated, for rope) into contiguous scratch, attention, heads merged, the output
projection GEMM (+ bias)."""
from __future__ import annotations

import numpy as np

from ...ir.ops.attention import Attention, MaskKind
from ...ir.ops.fused import FusedAttentionBlock, RopeMode
from . import attention_native as heads_c
from . import blas, native
from . import packed_gemm as pg
from .fused import _c, gemm_bias_act, is_f32, packed_weight
from .registry import Dispatch, Kernel, nbytes, register_kernel

BLOCK_BYTES = 8 << 20  # scores per query block


def _mask_strides(mask: np.ndarray | None, b: int, hq: int, sq: int, sk: int):
    """(array, batch, head, row, col) element strides of an additive mask broadcast to
    [B, Hq, Sq, Sk] (0 where it broadcasts)."""
    if mask is None:
        return None, 0, 0, 0, 0
    m = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    m = np.ascontiguousarray(m, np.float32)
    strides = [st // 4 if dim != 1 else 0 for st, dim in zip(m.strides, m.shape)]
    return m, strides[0], strides[1], strides[2], strides[3]


class AttentionCore:
    """softmax(mask(softcap(q @ k^T * scale))) @ v for contiguous q [B, Hq, Sq, D],
    k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv] into out [B, Hq, Sq, Dv]."""

    def __init__(self, op: Attention, b: int, hq: int, hkv: int, sq: int, sk: int, d: int):
        self.op, self.b, self.hq, self.hkv, self.sq, self.sk = op, b, hq, hkv, sq, sk
        self.rep = hq // hkv
        self.scale = float(op.score_scale(d))
        per_query = sk * 4 * b * hkv * self.rep  # bytes of scores per query position
        self.block = max(1, min(sq, BLOCK_BYTES // max(per_query, 1)))
        self.scores_shape = (b, hkv, self.rep * self.block, sk)

    def __call__(self, lib, q, k, v, mask, out, scores):
        op = self.op
        b, hkv, rep, sq, sk = self.b, self.hkv, self.rep, self.sq, self.sk
        d, dv = q.shape[-1], v.shape[-1]
        m, mb, mh, mr, mc = _mask_strides(mask, b, self.hq, sq, sk)
        qg = q.reshape(b, hkv, rep, sq, d)
        og = out.reshape(b, hkv, rep, sq, dv)
        kt = k.transpose(0, 1, 3, 2)
        causal = int(op.mask.is_causal)
        window = op.window if op.mask is MaskKind.SLIDING_WINDOW else 0
        softcap = float(op.softcap or 0.0)
        for q0 in range(0, sq, self.block):
            n = min(self.block, sq - q0)
            qb = qg[:, :, :, q0:q0 + n].reshape(b, hkv, rep * n, d)
            s = scores[:, :, :rep * n] if n == self.block else \
                np.empty((b, hkv, rep * n, sk), np.float32)
            blas.matmul(qb, kt, s)
            sc = np.ascontiguousarray(s)
            lib.attn_softmax(sc.ctypes.data, b * hkv, rep * n, n, sq, sk, q0, self.scale,
                             softcap, causal, window, None if m is None else m.ctypes.data, mb,
                             mh, hkv, rep, mr, mc)
            ob = blas.matmul(sc, v, np.empty(sc.shape[:-1] + v.shape[-1:], np.float32))
            og[:, :, :, q0:q0 + n] = ob.reshape(b, hkv, rep, n, dv)


@register_kernel(Attention)
def attention(node, ins, outs, ctx):
    lib = native.lib()
    if lib is None or not is_f32(*ins):
        return None
    q, k, v = ins[:3]
    b, hq, sq, d = (int(x) for x in q.dims)
    hkv, sk, dv = int(k.dims[1]), int(k.dims[2]), int(v.dims[3])
    has_mask = node.op.mask.takes_input
    flops = 2 * b * hq * sq * sk * (d + dv)
    cost = dict(flops=flops, bytes=nbytes(ins) + nbytes(outs))
    if heads_c.lib() is not None:
        heads = _Heads(node.op, (b, hq, hkv, sq, sk, d, dv))

        def run_heads(*arrays):
            qa, ka, va = (_rows_contiguous(a) for a in arrays[:3])
            out, scratch = arrays[-2], arrays[-1]
            views = (qa, ka, va, out)
            strides = sum((heads_c.head_strides(a) for a in views), ())
            heads(qa, ka, va, out, strides, arrays[3] if has_mask else None, scratch)

        return Kernel(run_heads, Dispatch.NATIVE, "C attention per (batch, head), MKL sgemm",
                      scratch=((heads.plan.scratch_shape, np.float32),), **cost)
    core = AttentionCore(node.op, b, hq, hkv, sq, sk, d)

    def run(*arrays):
        qa, ka, va = (np.ascontiguousarray(a) for a in arrays[:3])
        mask = arrays[3] if has_mask else None
        out, scores = arrays[-2], arrays[-1]
        core(lib, qa, ka, va, mask, out, scores)

    return Kernel(run, Dispatch.NATIVE, "BLAS + C attention (query-blocked)",
                  scratch=((core.scores_shape, np.float32),), **cost)


def _rows_contiguous(a: np.ndarray) -> np.ndarray:
    return a if heads_c.head_strides(a) is not None else np.ascontiguousarray(a, np.float32)


def _projection(lib, x: np.ndarray, w: np.ndarray, out: np.ndarray, bias, packed=None
                ) -> None:
    """out = x @ w (+ bias): one native GEMM + epilogue call where it can (braze's own on w
    packed once, when `packed` is given), else BLAS + C."""
    bias = None if bias is None else _c(bias)
    if packed is not None and pg.gemm(x, packed, out, bias, 0):
        return
    if gemm_bias_act(lib, x, w, out, bias, 0):
        return
    blas.matmul(x, w, out)
    if bias is not None:
        lib.bias_act(out.ctypes.data, bias.ctypes.data, x.size // x.shape[-1], out.shape[-1], 0)


class _Heads:
    """attention_native.attn_heads for one attention op and shape (B, Hq, Hkv, Sq, Sk, D, Dv)."""

    def __init__(self, op: Attention, shape: tuple[int, ...]):
        b, hq, hkv, sq, sk, d, dv = shape
        self.shape = shape
        self.scale = float(op.score_scale(d))
        self.softcap = float(op.softcap or 0.0)
        self.causal = bool(op.mask.is_causal)
        self.window = op.window if op.mask is MaskKind.SLIDING_WINDOW else 0
        self.plan = heads_c.HeadsPlan(sq, sk, self.causal)

    def __call__(self, q, k, v, out, strides, mask, scratch) -> None:
        b, hq = self.shape[:2]
        m, *mst = _mask_strides(mask, b, hq, self.shape[3], self.shape[4])
        heads_c.attn_heads(self.plan, q, k, v, out, strides, self.shape, self.scale,
                           self.softcap, self.causal, self.window, m, tuple(mst), scratch)


def _qk_norm_in_place(op: FusedAttentionBlock, qkv: np.ndarray, r: dict) -> None:
    """Normalize the q and k slices of the packed [B, S, width] projection in place (per head
    or over each whole slice), with the op's own norm reference."""
    b, s, _ = qkv.shape
    d = op.head_dim
    for role, start, h in (("q", 0, op.num_heads), ("k", op.num_heads * d, op.num_kv_heads)):
        part = qkv[:, :, start:start + h * d]
        if op.qk_norm_per_head:
            part = part.reshape(b, s, h, d)  # splits the unit-stride axis: still a view
        params = [r[k] for k in (f"{role}_norm_gamma", f"{role}_norm_beta") if k in r]
        part[...] = op.qk_norm.reference(part, *params)


@register_kernel(FusedAttentionBlock)
def attention_block(node, ins, outs, ctx):
    lib = native.lib()
    op = node.op
    if lib is None or not is_f32(*ins):
        return None
    roles = op.input_roles()
    x_s = ins[0]
    b, s, e = (int(x) for x in x_s.dims)
    hq, hkv, d = op.num_heads, op.num_kv_heads, op.head_dim
    width = op.qkv_width
    if op.rope is not RopeMode.NONE:
        cos = ins[roles.index("cos")]
        if cos.rank < 2 or any(x != 1 for x in cos.dims[:-2]) or cos.dims[-2] != s:
            return None
    n_rot = op.n_rot or d
    inter = int(op.rope is RopeMode.INTERLEAVED)
    e_out = int(outs[0].dims[-1])
    cost = dict(flops=2 * b * s * (e * width + hq * d * e_out) + 4 * b * hq * s * s * d,
                bytes=nbytes(ins) + nbytes(outs))
    if heads_c.lib() is not None:
        heads = _Heads(op.attention_op, (b, hq, hkv, s, s, d, d))
        merged_w = hq * d
        strides = (s * width, d, width) * 3 + (s * merged_w, d, merged_w)
        packed_qkv = packed_weight(node, ctx, roles.index("w_qkv"))
        packed_o = packed_weight(node, ctx, roles.index("w_o"))

        def run_packed(*arrays):
            r = dict(zip(roles, arrays[:len(roles)]))
            out = arrays[len(roles)]
            qkv, merged, scratch = arrays[len(roles) + 1:]
            _projection(lib, _c(r["x"]), r["w_qkv"], qkv, r.get("b_qkv"), packed_qkv)
            if op.qk_norm is not None:
                _qk_norm_in_place(op, qkv, r)
            if op.rope is not RopeMode.NONE:
                heads_c.rope_packed(qkv, _c(r["cos"]), _c(r["sin"]), hq + hkv, d, n_rot,
                                    bool(inter))
            q, k, v = (qkv[:, :, start:] for start in (0, hq * d, (hq + hkv) * d))
            heads(q, k, v, merged, strides, r.get("mask"), scratch)
            _projection(lib, merged, r["w_o"], out, r.get("b_o"), packed_o)

        scratch = (((b, s, width), np.float32), ((b, s, merged_w), np.float32),
                   (heads.plan.scratch_shape, np.float32))
        how = "braze packed-weight GEMM" if packed_qkv is not None and packed_o is not None \
            else "MKL"
        return Kernel(run_packed, Dispatch.NATIVE, f"fused attention block ({how} + C heads, "
                      "no head copies)", scratch=scratch, **cost)
    core = AttentionCore(op.attention_op, b, hq, hkv, s, s, d)
    scratch = (((b, s, width), np.float32), ((b, hq, s, d), np.float32),
               ((b, hkv, s, d), np.float32), ((b, hkv, s, d), np.float32),
               ((b, hq, s, d), np.float32), ((b, s, hq * d), np.float32),
               (core.scores_shape, np.float32))

    def run(*arrays):
        r = dict(zip(roles, arrays[:len(roles)]))
        out = arrays[len(roles)]
        qkv, q, k, v, att, merged, scores = arrays[len(roles) + 1:]
        blas.matmul(r["x"], r["w_qkv"], qkv)
        if op.has_qkv_bias:
            b_qkv = _c(r["b_qkv"])
            lib.bias_act(qkv.ctypes.data, b_qkv.ctypes.data,
                         b * s, width, 0)
        if op.qk_norm is not None:
            _qk_norm_in_place(op, qkv, r)
        heads = [(q, 0, hq), (k, hq * d, hkv), (v, (hq + hkv) * d, hkv)]
        for dst, start, h in heads:
            np.copyto(dst, qkv[:, :, start:start + h * d].reshape(b, s, h, d)
                      .transpose(0, 2, 1, 3))
        if op.rope is not RopeMode.NONE:
            c = np.ascontiguousarray(r["cos"])
            sn = np.ascontiguousarray(r["sin"])
            for t, h in ((q, hq), (k, hkv)):
                lib.rope(t.ctypes.data, c.ctypes.data, sn.ctypes.data, t.ctypes.data, b * h, s,
                         d, n_rot, inter)
        core(lib, q, k, v, r.get("mask"), att, scores)
        np.copyto(merged.reshape(b, s, hq, d), att.transpose(0, 2, 1, 3))
        blas.matmul(merged, r["w_o"], out)
        if op.has_out_bias:
            b_o = _c(r["b_o"])
            lib.bias_act(out.ctypes.data, b_o.ctypes.data, b * s, e_out, 0)

    return Kernel(run, Dispatch.NATIVE, "fused attention block (BLAS + C)", scratch=scratch,
                  **cost)
