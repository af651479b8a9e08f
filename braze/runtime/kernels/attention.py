"""Attention kernels on attention_native's flash-style C kernel (per (batch, kv head, query
block): scores, online softmax and p @ v in cache, GQA without copying k and v). Without a C
compiler they return None (the reference kernels run).

FusedAttentionBlock builds on it: one GEMM per joined projection (+ bias) - the packed QKV of
self-attention, or q of x and k/v of x_kv for cross-attention (S_kv may differ from S) -, q / k
normalized and rotated in place, the kernel reading the heads straight out of those buffers and
writing them merged, the output projection GEMM (+ bias). With a KV cache (a decode step) the
new keys / values are appended to the cache in the present_k / present_v outputs, which the
heads kernel reads."""
from __future__ import annotations

import numpy as np

from ...errors import InterpretError
from ...ir.ops.attention import Attention, MaskKind
from ...ir.ops.fused import FusedAttentionBlock, RopeMode
from ..address import address
from . import amx_gemm, attention_amx, attention_dp, bf16_gemm, blas, native
from . import attention_native as heads_c
from .fused import _c, gemm_bias_act, is_f32, packed_weight, prepared_gemm, prepared_how
from .registry import Dispatch, Kernel, nbytes, register_kernel


def _mask_strides(mask: np.ndarray | None, b: int, hq: int, sq: int, sk: int):
    """(array, batch, head, row, col) element strides of an additive mask broadcast to
    [B, Hq, Sq, Sk] (0 where it broadcasts)."""
    if mask is None:
        return None, 0, 0, 0, 0
    m = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    m = np.ascontiguousarray(m, np.float32)
    strides = [st // 4 if dim != 1 else 0 for st, dim in zip(m.strides, m.shape)]
    return m, strides[0], strides[1], strides[2], strides[3]


@register_kernel(Attention)
def attention(node, ins, outs, ctx):
    if heads_c.lib() is None or not is_f32(*ins) or not _core_runs(node.op):
        return None
    q, k, v = ins[:3]
    b, hq, sq, d = (int(x) for x in q.dims)
    hkv, sk, dv = int(k.dims[1]), int(k.dims[2]), int(v.dims[3])
    has_mask = node.op.mask.takes_input
    flops = 2 * b * hq * sq * sk * (d + dv)
    cost = dict(flops=flops, bytes=nbytes(ins) + nbytes(outs))
    heads = _Heads(node.op, (b, hq, hkv, sq, sk, d, dv))

    def run_heads(*arrays):
        qa, ka, va = (_rows_contiguous(a) for a in arrays[:3])
        out, scratch = arrays[-2], arrays[-1]
        views = (qa, ka, va, out)
        strides = sum((heads_c.head_strides(a) for a in views), ())
        heads(qa, ka, va, out, strides, arrays[3] if has_mask else None, scratch)

    return Kernel(run_heads, Dispatch.NATIVE,
                  f"C attention per (batch, kv head, query block), {heads.how}",
                  scratch=((heads.plan.scratch_shape, np.float32),), **cost)


def _core_runs(op: Attention) -> bool:
    """Whether the C kernel computes `op`'s rounding of its operands (none, or bf16)."""
    return op.round_operands is None or op.round_operands.name == "bf16"


def _rows_contiguous(a: np.ndarray) -> np.ndarray:
    return a if heads_c.head_strides(a) is not None else np.ascontiguousarray(a, np.float32)


def _projection(lib, x: np.ndarray, w: np.ndarray, out: np.ndarray, bias, packed=None,
                x16: np.ndarray | None = None) -> None:
    """out = x @ w (+ bias): one native GEMM + epilogue call where it can (on w prepared once
    by fused.packed_weight, or the bf16 GEMM rounding x through `x16`, when `packed` is
    given), else BLAS + C."""
    bias = None if bias is None else _c(bias)
    if isinstance(packed, bf16_gemm.PREPARED):
        if not bf16_gemm.gemm(x, packed, out, bias, 0, x16):
            raise InterpretError(f"bf16 projection: x {x.shape} does not fit the weight "
                                 f"{w.shape}")
        return
    if packed is not None and prepared_gemm(x, packed, out, bias, 0):
        return
    if gemm_bias_act(lib, x, w, out, bias, 0):
        return
    blas.matmul(x, w, out)
    if bias is not None:
        lib.bias_act(address(out), address(bias), x.size // x.shape[-1], out.shape[-1], 0)


class _Heads:
    """attention_native.attn_heads for one attention op and shape (B, Hq, Hkv, Sq, Sk, D, Dv).
    `in16` / `out16` (the bf16 cores only, see bf16_inside): q, k, v come, and the output
    leaves, as bf16 values."""

    def __init__(self, op: Attention, shape: tuple[int, ...], in16: bool = False,
                 out16: bool = False):
        b, hq, hkv, sq, sk, d, dv = shape
        self.shape = shape
        self.scale = float(op.score_scale(d))
        self.softcap = float(op.softcap or 0.0)
        self.causal = bool(op.mask.is_causal)
        self.window = op.window if op.mask is MaskKind.SLIDING_WINDOW else 0
        self.rounded = op.round_operands is not None  # bf16 (_core_runs)
        core = _bf16_core() if self.rounded else None
        if core is not None:
            self.plan = core[0](shape, in16, out16)
            self.how = f"{core[1]} on bf16-rounded q, k, v and probabilities"
        else:
            self.plan = heads_c.HeadsPlan(shape, self.rounded)
            self.how = "braze micro-kernels" + (" on bf16-rounded q, k, v and probabilities"
                                                if self.rounded else "")

    def __call__(self, q, k, v, out, strides, mask, scratch) -> None:
        b, hq = self.shape[:2]
        m, *mst = _mask_strides(mask, b, hq, self.shape[3], self.shape[4])
        heads_c.attn_heads(self.plan, q, k, v, out, strides, self.scale, self.softcap,
                           self.causal, self.window, m, tuple(mst), scratch)


def _qk_norm_in_place(op: FusedAttentionBlock, proj: dict, r: dict) -> None:
    """Normalize the q and k slices of their packed [B, S_in, width] projections (`proj`:
    joined roles -> buffer) in place (per head or over each whole slice), with the op's own
    norm reference."""
    d = op.head_dim
    for role in "qk":
        joined, start, h = op.slices()[role]
        buf = proj[joined]
        part = buf[:, :, start:start + h * d]
        if op.qk_norm_per_head:
            part = part.reshape(buf.shape[:2] + (h, d))  # splits the unit-stride axis: a view
        params = [r[k] for k in (f"{role}_norm_gamma", f"{role}_norm_beta") if k in r]
        part[...] = op.qk_norm.reference(part, *params)


class _BlockShape:
    """Sizes of one FusedAttentionBlock call: per projection (input role, joined roles, rows
    S_in, width), and each of q, k, v's (joined roles, start column, heads, S_in)."""

    def __init__(self, op: FusedAttentionBlock, ins: tuple):
        roles = op.input_roles()
        dims = {src: tuple(int(n) for n in ins[roles.index(src)].dims) for src in ("x", "x_kv")
                if src in roles}
        self.b, self.s, self.e = dims["x"]
        self.projections = [(src, joined, dims[src][1], op.role_width(joined), dims[src][2])
                            for src, joined in op.qkv_inputs.projections]
        seq = {src: dims[src][1] for src in dims}
        self.heads = {role: sl + (seq[src],) for (role, sl), src in
                      zip(op.slices().items(), op.qkv_inputs.sources)}
        self.past = int(ins[roles.index("past_k")].dims[2]) if op.kv_cache else 0
        self.sk = self.heads["k"][3] + self.past

    def buffers(self, dtype=np.float32) -> tuple:
        """Scratch (shape, dtype) of each projection's output."""
        return tuple(((self.b, rows, width), dtype) for _, _, rows, width, _ in self.projections)

    def flops(self, op: FusedAttentionBlock, e_out: int) -> int:
        hq, d = op.num_heads, op.head_dim
        proj = sum(rows * e_in * width for _, _, rows, width, e_in in self.projections)
        return 2 * self.b * (proj + self.s * hq * d * e_out) + 4 * self.b * hq * self.s * \
            self.sk * d


def _append_to_cache(op, shape: _BlockShape, proj: dict, r: dict, present: tuple) -> None:
    """present_k / present_v [B, Hkv, P + S, D]: the cache, then the new heads read out of
    their packed projection."""
    p = shape.past
    for role, out in zip("kv", present):
        joined, start, h, s = shape.heads[role]
        new = proj[joined][:, :, start:start + h * op.head_dim]
        out[:, :, :p] = r[f"past_{role}"]
        out[:, :, p:] = new.reshape(shape.b, s, h, op.head_dim).transpose(0, 2, 1, 3)


def _project_all(lib, op, shape: _BlockShape, r: dict, bufs, packed, x16) -> dict:
    """Run every joined projection into its buffer, then the q/k norm and rope in place;
    returns joined roles -> buffer."""
    proj = {}
    for (src, joined, *_), buf, pw in zip(shape.projections, bufs, packed):
        x = _c(r[src])  # held in a name: a temporary copy would be freed before the call
        _projection(lib, x, r[f"w_{joined}"], buf, r.get(f"b_{joined}"), pw, x16)
        proj[joined] = buf
    if op.qk_norm is not None:
        _qk_norm_in_place(op, proj, r)
    if op.rope is not RopeMode.NONE:  # q and k lead one projection (infer checks)
        heads_c.rope_packed(proj[shape.projections[0][1]], _c(r["cos"]), _c(r["sin"]),
                            op.num_heads + op.num_kv_heads, op.head_dim, op.n_rot or op.head_dim,
                            op.rope is RopeMode.INTERLEAVED)
    return proj


@register_kernel(FusedAttentionBlock)
def attention_block(node, ins, outs, ctx):
    lib = native.lib()
    op = node.op
    if lib is None or heads_c.lib() is None or not is_f32(*ins) \
            or not _core_runs(op.attention_op):
        return None
    roles = op.input_roles()
    shape = _BlockShape(op, ins)
    b, s, sk = shape.b, shape.s, shape.sk
    hq, hkv, d = op.num_heads, op.num_kv_heads, op.head_dim
    if op.rope is not RopeMode.NONE:
        cos = ins[roles.index("cos")]
        if cos.rank < 2 or any(x != 1 for x in cos.dims[:-2]) or cos.dims[-2] != s:
            return None
    e_out = int(outs[0].dims[-1])
    n_out = len(outs)
    cost = dict(flops=shape.flops(op, e_out), bytes=nbytes(ins) + nbytes(outs))
    n_proj = len(shape.projections)
    merged_w = hq * d
    heads = _Heads(op.attention_op, (b, hq, hkv, s, sk, d, d))
    widths = {joined: (rows, width) for _, joined, rows, width, _ in shape.projections}
    views = [shape.heads[role] for role in "qkv"]
    strides = sum(((widths[j][0] * widths[j][1], d, widths[j][1]) for j, *_ in views), ())
    strides += (s * merged_w, d, merged_w)
    low, reads = _bf16_projections(node, ctx, shape, roles)
    packed = low or [packed_weight(node, ctx, roles.index(f"w_{joined}"),
                                   bias=f"b_{joined}" in roles)
                     for _, joined, *_ in shape.projections]
    rounding = op.round_attention
    low_o = bf16_gemm.bf16_weight(node, ctx, roles.index("w_o")) \
        if rounding is not None and rounding.name == "bf16" else None
    packed_o = low_o or packed_weight(node, ctx, roles.index("w_o"), bias="b_o" in roles)
    in16, out16 = _bf16_inside(op, low, low_o)
    in16 = in16 and not op.kv_cache  # the heads read the f32 present keys / values
    if op.kv_cache:
        present = (hkv * sk * d, sk * d, d)  # C-contiguous [B, Hkv, P + S, D]
        strides = strides[:3] + present * 2 + strides[9:]
    if in16 or out16:
        heads = _Heads(op.attention_op, heads.shape, in16, out16)
    round_merged = rounding is not None and low_o is None

    def run_packed(*arrays):
        r = dict(zip(roles, arrays[:len(roles)]))
        out, *present = arrays[len(roles):len(roles) + n_out]
        bufs = arrays[len(roles) + n_out:len(roles) + n_out + n_proj]
        merged, scratch, *x16 = arrays[len(roles) + n_out + n_proj:]
        x16 = x16[0] if x16 else None
        proj = _project_all(lib, op, shape, r, bufs, packed, x16)
        q, k, v = (proj[joined][:, :, start:] for joined, start, *_ in views)
        if present:
            _append_to_cache(op, shape, proj, r, present)
            k, v = present
        heads(q, k, v, merged, strides, r.get("mask"), scratch)
        if round_merged:  # the policy's rounding, where no bf16 GEMM does it
            bf16_gemm.round_through(merged, rounding)
        _projection(lib, merged, r["w_o"], out, r.get("b_o"), packed_o, x16)

    scratch = shape.buffers(amx_gemm.BF16 if in16 else np.float32) + (
        ((b, s, merged_w), amx_gemm.BF16 if out16 else np.float32),
        (heads.plan.scratch_shape, np.float32))
    if low or low_o:
        rows_k = max([bf16_gemm.scratch_elems(b * rows, e_in)
                      for _, _, rows, _, e_in in shape.projections] * bool(low)
                     + [bf16_gemm.scratch_elems(b * s, merged_w)] * bool(low_o))
        scratch += (((rows_k,), np.uint16),)
    if low or low_o:
        qkv_how = bf16_gemm.describe(low[0]) if low else "f32 GEMM"
        out_how = bf16_gemm.describe(low_o) if low_o else "f32 GEMM"
        how = f"{qkv_how} for q/k/v and the output" if qkv_how == out_how else \
            f"{qkv_how} for q/k/v, {out_how} for the output"
    elif None not in packed and packed_o is not None:
        how = prepared_how(packed_o)
    else:
        how = "MKL"
    core = f" ({heads.how})" if heads.rounded else ""
    if in16 or out16:
        core += ", bf16 " + " and ".join(["q/k/v"] * in16 + ["output"] * out16)
    copies = "new keys / values appended to the cache" if op.kv_cache else "no head copies"
    return Kernel(run_packed, Dispatch.NATIVE, f"fused attention block ({how} + C heads"
                  f"{core}, {copies})", scratch=scratch, reads=reads, **cost)


def _bf16_core():
    """(plan class, description) of the bf16 attention core that runs here: AMX tiles, or
    AVX512-BF16 dot products; None (the f32 micro-kernels on rounded values run)."""
    if attention_amx.available():
        return attention_amx.AmxHeadsPlan, "AMX bf16 tiles"
    if attention_dp.available():
        return attention_dp.DpHeadsPlan, "AVX512-BF16 dot products"
    return None


def _bf16_inside(op: FusedAttentionBlock, low: list | None, low_o) -> tuple[bool, bool]:
    """Whether the block's q/k/v projections hand the bf16 attention core (AMX or
    AVX512-BF16) bf16 values (in16), and whether the core hands the output projection bf16
    values (out16): the core rounds q, k, v and the projection its operand exactly so, so
    this is the same computation at half the bytes. in16 needs one of braze's bf16 GEMMs for
    every q/k/v projection (they write bf16) and no q/k norm or rope between projection and
    core (they work on the f32 values); out16 needs one for the output projection (they
    read bf16 in place)."""
    rounds = op.attention_op.round_operands
    core = rounds is not None and rounds.name == "bf16" and (bool(low) or low_o is not None) \
        and _bf16_core() is not None   # last: it compiles the core
    in16 = core and bool(low) and all(isinstance(w, bf16_gemm.OWN) for w in low) and \
        op.qk_norm is None and op.rope is RopeMode.NONE
    return in16, core and isinstance(low_o, bf16_gemm.OWN)


def _bf16_projections(node, ctx, shape: _BlockShape, roles) -> tuple[list | None, tuple]:
    """Under the bf16 policy, each q/k/v projection's weight prepared for the bf16 GEMM and
    the (input position, unrounded value) each input role is read from (the GEMM rounds it
    itself), when every projection qualifies; else (None, ()). (The output projection's
    operand is rounded inside the block: see `round_attention`.)"""
    weights, reads = [], {}
    for src, joined, *_ in shape.projections:
        pos = roles.index(src)
        source = bf16_gemm.rounded_source(node, ctx, pos)
        w = bf16_gemm.bf16_weight(node, ctx, roles.index(f"w_{joined}")) \
            if source is not None else None
        if w is None:
            return None, ()
        weights.append(w)
        reads[pos] = source
    return weights, tuple(reads.items())
