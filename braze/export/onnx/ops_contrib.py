"""ONNX Runtime contrib-op mappings (target "onnxruntime", domain com.microsoft unless noted):
fused kinds and logical ops whose ORT op means exactly the same thing. Each `accept` states
the conditions (a mask kind ORT lacks, a softcap, GQA for the packed Attention op, ...); a node
outside them is exported as its decomposition instead.

- fused_matmul_bias_act: MatMul + BiasGelu (gelu), MatMul + FastGelu with bias (gelu_approx)
- fused_residual_ln: SkipLayerNormalization (4th output: the exposed sum); the skip may be
  [B, S, D], [1, S, D] or [S, D] (ViT's position embeddings)
- fused_residual_rms_norm: SkipSimplifiedLayerNormalization
- rms_norm alone: its decomposition (ORT's SimplifiedLayerNormalization sits in the default
  domain where onnx.checker rejects it; residual RMS norms use the contrib op above)
- fused_attention_block (no rope, MHA, no softcap/window/qk-norm): Attention (packed QKV weights)
  for self-attention; cross-attention and a separate value input: their projections, then
  MultiHeadAttention (separate query, key, value); a decode step's block (kv_cache, self-
  attention): its packed projection sliced into query, key, value, then MultiHeadAttention
  with past_key / past_value, whose present_key / present_value are the block's present
  outputs; then the output projection;
  attention: MultiHeadAttention; rope: RotaryEmbedding
- fused_conv_bias_act: FusedConv (relu / sigmoid / tanh; a residual as its Z input)

ORT's softmax gives NaN for a query whose keys are all masked with -inf; braze gives zeros, so
the output of an attention with a mask input is zeroed at the queries whose mask row is all -inf
(where(any key not -inf, y, 0)); a NaN from q, k, v or the mask stays NaN, as in braze. Without a
mask input (none, or causal with equal query and key lengths) every query sees a key, and no
guard is written (a guard would also keep braze from re-fusing the imported model)."""
from __future__ import annotations

import numpy as np

from ...ir.dtypes import bool_, f16, f32
from ...ir.ops.attention import Attention, MaskKind, Rope
from ...ir.ops.elementwise import UnaryFn
from ...ir.ops.fused import (
    FusedAttentionBlock,
    FusedConvBiasAct,
    FusedMatMulBiasAct,
    FusedResidualLN,
    FusedResidualRmsNorm,
    QkvInputs,
    RopeMode,
)
from .builder import onnx_type
from .ops_standard import conv_attrs, scalar, unary_fn
from .registry import exporter

MS = "com.microsoft"
_ORT_MASKS = (MaskKind.NONE, MaskKind.CAUSAL, MaskKind.CUSTOM, MaskKind.BIAS)


def _ort(target: str) -> bool:
    return target == "onnxruntime"


# the element types ONNX Runtime's CPU contrib ops used here take (their type constraints:
# float and float16; double and bfloat16 make an invalid model or one without a kernel)
_ORT_FLOATS = (f32, f16)


def _ort_float(n) -> bool:
    """Whether node `n` computes in a type the contrib ops take (else: standard ops)."""
    return all(v.dtype in _ORT_FLOATS for v in n.outputs)


def _reduce(b, op_type: str, x: str, axes) -> str:
    """ReduceMax / ReduceSum over `axes`, dims kept (axes an input from opset 18, ReduceSum 13)."""
    if op_type == "ReduceSum" or b.opset >= 18:
        return b.op1(op_type, x, b.const(np.asarray(axes, np.int64)), keepdims=1)
    return b.op1(op_type, x, axes=list(axes), keepdims=1)


def _nan_of(b, x: str, axes, dt) -> str:
    """sum(0 * x) over `axes`: 0, or NaN where those entries of x hold a NaN (or an inf)."""
    return _reduce(b, "ReduceSum", b.op1("Mul", x, scalar(b, 0.0, dt)), axes)


def _sees_a_key(b, mask_v, mask: str, dt) -> str:
    """bool [B|1, H|1, Sq|1, 1]: whether a query's additive mask row has an entry other than
    -inf (a NaN counts as one: it propagates, as in braze's softmax)."""
    rank = b.g.shape_of(mask_v).rank
    if rank < 4:
        mask = b.op1("Unsqueeze", mask, b.const(np.arange(4 - rank, dtype=np.int64)))
    open_ = b.op1("Cast", b.op1("Not", b.op1("Equal", mask, scalar(b, -np.inf, dt))),
                  to=onnx_type(f32))
    return b.op1("Cast", _reduce(b, "ReduceMax", open_, [3]), to=onnx_type(bool_))


def _zero_fully_masked(b, y: str, sees: str, fill: str, heads_last: int | None = None) -> str:
    """y with `fill` (0 @ v: zeros, NaN where a NaN input reaches the query) at the queries
    whose every key is masked. y is [B, H, S, D], or with `heads_last` = H it is [B, S, H*D]
    (a block's attention before the output projection), `fill` then [B, 1, 1, 1]."""
    if heads_last is None:
        return b.op1("Where", sees, y, fill)
    sees = b.op1("Transpose", sees, perm=[0, 2, 1, 3])  # [B|1, Sq|1, H|1, 1]
    y4 = b.op1("Reshape", y, b.const(np.asarray([0, 0, heads_last, -1], np.int64)))
    y4 = b.op1("Where", sees, y4, fill)
    return b.op1("Reshape", y4, b.const(np.asarray([0, 0, -1], np.int64)))


# -- matmul epilogues -----------------------------------------------------------------------------
@exporter(FusedMatMulBiasAct, accept=lambda n, g, t: True)
def matmul_bias_act(b, n, ins, target):
    op = n.op
    dt = n.outputs[0].dtype
    y = b.op1("MatMul", ins[0], ins[1])
    contrib = _ort(target) and _ort_float(n)
    if op.has_bias and contrib and op.act is UnaryFn.GELU:
        return [b.op1("BiasGelu", y, ins[2], domain=MS)]
    if op.has_bias and contrib and op.act is UnaryFn.GELU_APPROX:
        return [b.op1("FastGelu", y, ins[2], domain=MS)]
    if op.has_bias:
        y = b.op1("Add", y, ins[2])
    return [y if op.act is None else unary_fn(b, op.act, y, dt, target)]


# -- norms ----------------------------------------------------------------------------------------
def _last_axis(n, g) -> bool:
    rank = n.outputs[0].rank
    return n.op.axis in (-1, rank - 1)


def _skip_ok(n, g, target, allow_beta: bool):
    if (not _ort(target) or not _ort_float(n) or not n.op.has_gamma
            or (n.op.has_beta and not allow_beta)):
        return False
    x, r = (g.shape_of(v) for v in n.inputs[:2])
    # ORT's skip may also be [1, S, D] or [S, D] against a [B, S, D] input (its
    # skip_layer_norm_helper checks the last two dims); other broadcasts decompose
    skip_ok = r.dims == x.dims or (x.rank == 3 and r.dims in ((1, *x.dims[1:]), x.dims[1:]))
    return skip_ok and r.dtype == x.dtype and x.rank == 3 and _last_axis(n, g)


def _skip(b, n, ins, op_type):
    """Outputs (y, "", "", sum): the unused mean / inv_std_var outputs stay unnamed."""
    op = n.op
    y = b.fresh(op_type.lower())
    if not op.expose_sum:
        return b.op(op_type, ins, outputs=[y], domain=MS, epsilon=float(op.eps))
    s = b.fresh("skip_sum")
    b.op(op_type, ins, outputs=[y, "", "", s], domain=MS, epsilon=float(op.eps))
    return [y, s]


@exporter(FusedResidualLN, accept=lambda n, g, t: _skip_ok(n, g, t, True))
def residual_ln(b, n, ins, target):
    return _skip(b, n, ins, "SkipLayerNormalization")


@exporter(FusedResidualRmsNorm, accept=lambda n, g, t: _skip_ok(n, g, t, False))
def residual_rms(b, n, ins, target):
    return _skip(b, n, ins, "SkipSimplifiedLayerNormalization")


# -- attention ------------------------------------------------------------------------------------
def _attention_ok(n, g, target):
    op = n.op
    if (not _ort(target) or not _ort_float(n) or op.softcap is not None
            or op.mask not in _ORT_MASKS):
        return False
    if op.round_operands is not None:  # rounded inside: decomposed, Cast pairs written
        return False
    q, k, v = (g.shape_of(x) for x in n.inputs[:3])
    if q.dims[3] != v.dims[3] or not isinstance(q.dims[1], int):
        return False
    if op.mask.is_causal and q.dims[2] != k.dims[2]:
        return False
    return not op.mask.takes_input or g.shape_of(n.inputs[3]).rank <= 4


def attention_bias(b, mask_v, mask_name: str, sq, sk) -> str:
    """The additive mask as ORT wants it: 4-D with full query and key lengths."""
    dims = b.g.shape_of(mask_v).dims
    rank = len(dims)
    if rank < 4:
        mask_name = b.op1("Unsqueeze", mask_name,
                          b.const(np.arange(4 - rank, dtype=np.int64)))
        dims = (1,) * (4 - rank) + tuple(dims)
    if dims[2] != sq or dims[3] != sk:
        mask_name = b.op1("Expand", mask_name, b.dims_tensor((1, 1, sq, sk)))
    return mask_name


def _bsh(b, x: str, dims) -> str:
    """[B, H, S, D] -> [B, S, H*D]."""
    bb, h, s, d = dims
    t = b.op1("Transpose", x, perm=[0, 2, 1, 3])
    return b.op1("Reshape", t, b.dims_tensor((bb, s, h * d)))


def _repeat_heads(b, x: str, dims, heads: int):
    """GQA: [B, Hkv, S, D] -> [B, heads, S, D], each kv head repeated in place."""
    bb, h, s, d = dims
    rep = heads // h
    x5 = b.op1("Unsqueeze", x, b.const(np.asarray([2], np.int64)))
    x5 = b.op1("Expand", x5, b.dims_tensor((bb, h, rep, s, d)))
    return b.op1("Reshape", x5, b.dims_tensor((bb, heads, s, d))), (bb, heads, s, d)


@exporter(Attention, accept=_attention_ok)
def attention(b, n, ins, target):
    op = n.op
    q_dims = b.g.shape_of(n.inputs[0]).dims
    k_dims = b.g.shape_of(n.inputs[1]).dims
    v_dims = b.g.shape_of(n.inputs[2]).dims
    k_in, v_in = ins[1], ins[2]
    if k_dims[1] != q_dims[1]:  # MultiHeadAttention wants one head count: repeat kv heads
        k_in, k_dims = _repeat_heads(b, k_in, k_dims, q_dims[1])
        v_in, v_dims = _repeat_heads(b, v_in, v_dims, q_dims[1])
    q, k, v = _bsh(b, ins[0], q_dims), _bsh(b, k_in, k_dims), _bsh(b, v_in, v_dims)
    bias = (attention_bias(b, n.inputs[3], ins[3], q_dims[2], k_dims[2])
            if op.mask.takes_input else "")
    args = [q, k, v, "", "", bias] if bias else [q, k, v]
    d = q_dims[3]
    y = b.op1("MultiHeadAttention", *args, domain=MS, num_heads=int(q_dims[1]),
              scale=float(op.score_scale(d)), unidirectional=int(op.mask is MaskKind.CAUSAL))
    bb, h, s, dv = q_dims[0], q_dims[1], q_dims[2], v_dims[3]
    y = b.op1("Reshape", y, b.dims_tensor((bb, s, h, dv)))
    y = b.op1("Transpose", y, perm=[0, 2, 1, 3])
    if op.mask.takes_input:  # braze's masked row: 0 @ v, NaN for a NaN in q_i, any k, v's column
        dt = n.outputs[0].dtype
        fill = b.op1("Add", b.op1("Add", _nan_of(b, ins[0], [3], dt), _nan_of(b, k_in, [2, 3], dt)),
                     _nan_of(b, v_in, [2], dt))
        y = _zero_fully_masked(b, y, _sees_a_key(b, n.inputs[3], ins[3], dt), fill)
    return [y]


def _block_ok(n, g, target):
    op = n.op
    return (_ort(target) and _ort_float(n) and op.rope is RopeMode.NONE
            and op.num_heads == op.num_kv_heads and op.softcap is None
            and op.mask in _ORT_MASKS and op.qk_norm is None and op.round_core is None
            and (not op.kv_cache or op.qkv_inputs is QkvInputs.SELF))


@exporter(FusedAttentionBlock, accept=_block_ok)
def attention_block(b, n, ins, target):
    op = n.op
    r = op.named(ins)
    dt = n.outputs[0].dtype
    present = []
    if op.kv_cache:
        y, *present = _decode_step(b, n, r)
    elif op.qkv_inputs is QkvInputs.SELF:
        y = _self_attention(b, n, r)
    else:
        y = _attention_of_two_inputs(b, n, r)
    if op.mask.takes_input:
        y = _zero_fully_masked(b, y, _block_sees_a_key(b, n, r), _block_fill(b, n, r),
                               heads_last=op.num_heads)
    if op.round_attention is not None:  # the precision policy's rounding of w_o's operand
        y = b.op1("Cast", b.op1("Cast", y, to=onnx_type(op.round_attention)), to=onnx_type(dt))
    y = b.op1("MatMul", y, r["w_o"])
    return [b.op1("Add", y, r["b_o"]) if op.has_out_bias else y, *present]


def _block_sees_a_key(b, n, r) -> str:
    return _sees_a_key(b, n.inputs[n.op.input_roles().index("mask")], r["mask"],
                       n.outputs[0].dtype)


def _block_fill(b, n, r) -> str:
    """[B, 1, 1, 1]: NaN where a NaN in the batch's activations (x, x_kv, the KV cache) reaches
    every query through its keys, else 0 (a masked query's 0 @ v)."""
    dt = n.outputs[0].dtype
    fill = None
    for role in ("x", "x_kv", "past_k", "past_v"):
        if role in r:
            rank = b.g.shape_of(n.inputs[n.op.input_roles().index(role)]).rank
            t = _nan_of(b, r[role], list(range(1, rank)), dt)
            if rank < 4:
                t = b.op1("Unsqueeze", t, b.const(np.arange(rank, 4, dtype=np.int64)))
            fill = t if fill is None else b.op1("Add", fill, t)
    return fill


def _decode_step(b, n, r) -> list[str]:
    """A block with a KV cache: query, key, value sliced from the packed projection (+ b_qkv:
    added before the slices, the model imports back as the block's pattern), ORT
    MultiHeadAttention appending key / value to past_key / past_value: [y [B, S, Hq*D],
    present_key, present_value]."""
    op = n.op
    qkv = b.op1("MatMul", r["x"], r["w_qkv"])
    if op.has_qkv_bias:
        qkv = b.op1("Add", qkv, r["b_qkv"])
    parts = []
    for role in "qkv":
        _, start, h = op.slices()[role]
        parts.append(b.op1("Slice", qkv, b.const(np.asarray([start], np.int64)),
                           b.const(np.asarray([start + h * op.head_dim], np.int64)),
                           b.const(np.asarray([-1], np.int64))))
    mask = _block_mask(b, n, r, n.outputs[1].dims[2])[2:] or [""]
    outs = [b.fresh("mha"), b.fresh("present_key"), b.fresh("present_value")]
    b.op("MultiHeadAttention", [*parts, "", "", *mask, r["past_k"], r["past_v"]],
         outputs=outs, domain=MS, num_heads=op.num_heads,
         scale=float(op.attention_op.score_scale(op.head_dim)),
         unidirectional=int(op.mask is MaskKind.CAUSAL))
    return outs


def _block_mask(b, n, r, s_kv) -> list[str]:
    """The optional inputs after q, k, v (Attention: past, bias; MultiHeadAttention: bias,
    key_padding_mask) and the additive mask, or none."""
    op = n.op
    if not op.mask.takes_input:
        return []
    mask_v = n.inputs[op.input_roles().index("mask")]
    s = b.g.shape_of(n.inputs[0]).dims[1]
    return ["", "", attention_bias(b, mask_v, r["mask"], s, s_kv)]


def _self_attention(b, n, r) -> str:
    """ORT Attention on x with the packed QKV weight: [B, S, Hq*D]."""
    op = n.op
    bias = r.get("b_qkv") or b.const(np.zeros(op.qkv_width, n.outputs[0].dtype.np))
    s = b.g.shape_of(n.inputs[0]).dims[1]
    args = [r["x"], r["w_qkv"], bias] + _block_mask(b, n, r, s)
    return b.op1("Attention", *args, domain=MS, num_heads=op.num_heads,
                 scale=float(op.attention_op.score_scale(op.head_dim)),
                 unidirectional=int(op.mask is MaskKind.CAUSAL))


def _attention_of_two_inputs(b, n, r) -> str:
    """Cross-attention / a separate value input: each joined projection (+ bias), q, k, v
    sliced from them, ORT MultiHeadAttention: [B, S, Hq*D]."""
    op = n.op
    proj = {}
    for src, joined in op.qkv_inputs.projections:
        p = b.op1("MatMul", r[src], r[f"w_{joined}"])
        proj[joined] = b.op1("Add", p, r[f"b_{joined}"]) if op.has_qkv_bias else p
    qkv = []
    for role in "qkv":
        joined, start, h = op.slices()[role]
        t = proj[joined]
        if len(joined) > 1:
            t = b.op1("Slice", t, b.const(np.asarray([start], np.int64)),
                      b.const(np.asarray([start + h * op.head_dim], np.int64)),
                      b.const(np.asarray([-1], np.int64)))
        qkv.append(t)
    s_kv = b.g.shape_of(n.inputs[op.input_roles().index("x_kv")]).dims[1]
    return b.op1("MultiHeadAttention", *qkv, *_block_mask(b, n, r, s_kv), domain=MS,
                 num_heads=op.num_heads, scale=float(op.attention_op.score_scale(op.head_dim)),
                 unidirectional=int(op.mask is MaskKind.CAUSAL))


def _rope_ok(n, g, target):
    if not _ort(target) or not _ort_float(n):
        return False
    x, cos = g.shape_of(n.inputs[0]), g.shape_of(n.inputs[1])
    if x.rank != 4 or cos.rank < 2 or any(d != 1 for d in cos.dims[:-2]):
        return False
    return cos.dims[-2] == x.dims[2]


@exporter(Rope, accept=_rope_ok)
def rope(b, n, ins, target):
    op = n.op
    x_dims = b.g.shape_of(n.inputs[0]).dims
    cos_dims = b.g.shape_of(n.inputs[1]).dims
    s, half = cos_dims[-2], cos_dims[-1]
    cos = b.op1("Reshape", ins[1], b.dims_tensor((s, half)))
    sin = b.op1("Reshape", ins[2], b.dims_tensor((s, half)))
    pos = b.op1("Range", b.const(np.int64(0)), b.dim_scalar(s), b.const(np.int64(1)))
    pos = b.op1("Expand", b.op1("Unsqueeze", pos, b.const(np.asarray([0], np.int64))),
                b.dims_tensor((x_dims[0], s)))
    n_rot = op.n_rot or x_dims[3]
    return [b.op1("RotaryEmbedding", ins[0], pos, cos, sin, domain=MS,
                  interleaved=int(op.interleaved), rotary_embedding_dim=int(n_rot),
                  num_heads=int(x_dims[1]))]


# -- convolution ----------------------------------------------------------------------------------
_CONV_ACTS = {UnaryFn.RELU: "Relu", UnaryFn.SIGMOID: "Sigmoid", UnaryFn.TANH: "Tanh"}


@exporter(FusedConvBiasAct, accept=lambda n, g, t: True)
def conv_bias_act(b, n, ins, target):
    """FusedConv for ONNX Runtime (a residual as its Z input, added before the activation);
    else Conv (+ Add of the residual) + the activation."""
    op = n.op
    attrs = conv_attrs(op.conv)
    contrib = _ort(target) and _ort_float(n)
    if contrib and op.act in _CONV_ACTS:
        return [b.op1("FusedConv", *ins, domain=MS, activation=_CONV_ACTS[op.act], **attrs)]
    if contrib and op.act is UnaryFn.RELU6:
        return [b.op1("FusedConv", *ins, domain=MS, activation="Clip",
                      activation_params=[0.0, 6.0], **attrs)]
    y = b.op1("Conv", *ins[:3], **attrs)
    if op.residual:
        y = b.op1("Add", y, ins[3])
    return [y if op.act is None else unary_fn(b, op.act, y, n.outputs[0].dtype, target)]
