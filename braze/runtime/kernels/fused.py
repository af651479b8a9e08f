"""Kernels for fused and logical kinds: BLAS GEMM into the output buffer with the epilogue
applied in place (bias + activation), row norms with the residual add (and its sum), group
norm, safe softmax, activations, SwiGLU / GeGLU, RoPE. float32 uses the native C kernels
(native.py); anything else declines, and the node decomposes or runs its reference."""
from __future__ import annotations

import os
from dataclasses import replace

import numpy as np

from ...errors import InterpretError
from ...ir.ops.attention import Rope
from ...ir.ops.elementwise import Unary
from ...ir.ops.fused import (
    FusedMatMulBiasAct,
    FusedResidualLN,
    FusedResidualRmsNorm,
    FusedSwiGLU,
)
from ...ir.ops.fused_simple import leading_broadcast_axes
from ...ir.ops.linalg import MatMul
from ...ir.ops.norm import GroupNorm, LayerNorm, RmsNorm
from ...ir.ops.reduce import Softmax
from ..address import address
from . import bf16_batched, bf16_gemm, blas, c_snippets, gemm_choice, mkl_packed, native
from . import packed_gemm as pg
from .registry import Dispatch, Kernel, nbytes, register_kernel

__all__ = ["is_f32", "gemm_bias_act", "packed_weight", "prepared_gemm", "prepared_how",
           "gated_gemm"]


def is_f32(*shapes) -> bool:
    return all(s.dtype.name == "f32" for s in shapes)


def _numel(s) -> int:
    return int(np.prod(s.dims, dtype=np.int64)) if s.dims else 1


def _act_code(fn) -> int | None:
    return c_snippets.ACT_CODES.get(None if fn is None else fn.value)


def _c(a: np.ndarray) -> np.ndarray:
    """`a`, or a C-contiguous copy. Bind the result to a name before passing its
    address to C: a copy referenced only by the expression is freed at once."""
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def gemm_bias_act(lib, x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray | None,
                  act: int) -> bool:
    """out = act(x @ w + bias) in one native call (GEMM slabs per thread, the epilogue on each
    slab in cache) when MKL's sgemm is there and the operands allow it; False if not (nothing
    is written then)."""
    gemm = blas.sgemm_address()
    if gemm is None or w.ndim != 2 or not x.flags.c_contiguous or not out.flags.c_contiguous:
        return False
    if x.dtype != np.float32 or w.dtype != np.float32 or out.dtype != np.float32:
        return False
    k, n = w.shape
    s0, s1 = w.strides
    if s0 % 4 or s1 % 4:
        return False
    # the leading dimension is a stride; rows (or columns) must not overlap: a weight broadcast
    # along k (stride 0, an expand) is no BLAS operand
    if s1 == 4 or n == 1:
        if k > 1 and s0 < 4 * n:
            return False
        trans_b, ldb = 0, max(s0 // 4, n)
    elif s0 == 4 and s1 >= 4 * k:
        trans_b, ldb = 1, s1 // 4
    else:
        return False
    m = x.size // max(k, 1)
    lib.gemm_bias_act(gemm, blas.local_threads_address(), address(x), k, address(w), ldb,
                      trans_b, address(out), m, n, k,
                      None if bias is None else address(bias), act)
    return True


def packed_weight(node, ctx, position: int = 1, gate_first: bool | None = None, act: int = 0,
                  bias: bool = False) -> pg.PackedWeight | mkl_packed.MklPackedWeight | None:
    """The static 2-D float32 weight at input `position` of `node` packed once (cached in
    ctx.prepared, which update_weights empties) for the fp32 GEMM measured fastest for its
    shape on this machine (gemm_choice.py): braze's own kernel (packed_gemm.py) or MKL's packed
    sgemm (mkl_packed.py); None when that input is not static (fed at run time) or can't be
    packed, or when MKL's tiles won (or are forced: BRAZE_PACKED_GEMM=0). Run it with
    `prepared_gemm`. With `gate_first` set, packed by braze for the gated epilogue
    (pg.pack_gated: MKL has no gated epilogue), but None where MKL's packed sgemm is the
    measured choice for the plain product, or BRAZE_PACKED_GEMM=0: the gated MLP then runs as
    that product and the gated kernel after it. On LLaMA-small's 768 x 4096 gate / up weight
    (whole model, one process, alternating) those two steps took 0.86-0.93x the fused kernel's
    time at batch 1 and 0.76-0.87x at batch 8 with braze's old 12 x 16 micro-kernel: MKL's
    product (then 1.1-1.3x as fast) outran the pass the epilogue saves; with the 6 x 64 one
    braze's kernel wins that shape here and the step is fused. Either copy costs ~1.0x the GEMM
    weights in RSS (bench/gemm_kernels.py --model NAME --batch B). `act` (a c_snippets.ACT_CODES
    value) and `bias` are the epilogue the node runs: the choice is measured with them, since
    braze's kernel applies them per tile in cache where MKL's runs a pass over the output."""
    value = node.inputs[position]
    w = ctx.static.get(value)
    if w is None or w.ndim != 2 or w.dtype != np.float32:
        return None
    choice = gemm_choice.choose(*w.shape, _mkl_tiles, act, bias)
    if gate_first is not None:
        if choice == "mkl_packed" or gemm_choice.forced() == "tiles":
            return None
        choice = "packed"
    if choice == "tiles":
        return None
    key = (choice, value, w.shape, w.strides, gate_first)
    if key not in ctx.prepared:
        if choice == "mkl_packed":
            ctx.prepared[key] = mkl_packed.pack(w)
        else:
            ctx.prepared[key] = pg.pack(w) if gate_first is None else \
                pg.pack_gated(w, gate_first)
    return ctx.prepared[key]


def prepared_gemm(x: np.ndarray, prepared, out: np.ndarray, bias: np.ndarray | None,
                  act: int) -> bool:
    """out = act(x @ w + bias) on a weight prepared by `packed_weight`; False (nothing
    written) when the operands don't fit."""
    if isinstance(prepared, mkl_packed.MklPackedWeight):
        return mkl_packed.gemm(x, prepared, out, bias, act)
    return pg.gemm(x, prepared, out, bias, act)


def prepared_how(prepared, epilogue: bool = False) -> str:
    """Which GEMM multiplies a weight prepared by `packed_weight` (and where its epilogue
    runs), for dispatch reports."""
    if isinstance(prepared, mkl_packed.MklPackedWeight):
        return "MKL packed-weight sgemm" + " + C epilogue" * epilogue
    return "braze packed-weight GEMM" + ", epilogue per tile" * epilogue


def _mkl_tiles(x: np.ndarray, w: np.ndarray, out: np.ndarray, bias: np.ndarray | None = None,
               act: int = 0) -> None:
    gemm_bias_act(native.lib(), x, w, out, bias, act)


def gated_gemm(node, gated_node, ins, outs, ctx) -> Kernel | None:
    """One kernel for a matmul (or a FusedMatMulBiasAct with no activation) and the
    FusedSwiGLU `gated_node` reading its product: braze's packed-weight GEMM on the weight
    packed in gate / up panel pairs, writing act(gate) * up from each finished tile
    (pg.gemm_gated), so the [..., 2F] product never reaches memory. Under the bf16 policy,
    where the bf16 GEMM takes the product: braze's AMX kernel with the same gated epilogue
    (bf16_gemm.gemm_kernel with gate_first), whose `outs` may also be the bf16 rounding of the
    gated node's result for the next GEMM (the bf16 hand-off: the program passes the cast's
    type). `ins` are the GEMM node's input types, `outs` the gated node's output types. None
    when that does not apply: no static float32 2-D weight, an activation the native kernels
    lack, no C compiler, MKL's packed sgemm measured fastest for the plain product by this
    weight (see packed_weight), BRAZE_PACKED_GEMM=0, or BRAZE_GATED_GEMM=0 (the two nodes then
    run as two steps)."""
    op = node.op
    if isinstance(op, FusedMatMulBiasAct):
        if op.act is not None:
            return None
        has_bias = op.has_bias
    elif isinstance(op, MatMul):
        has_bias = False
    else:
        return None
    act = _act_code(gated_node.op.act)
    if os.environ.get("BRAZE_GATED_GEMM", "1") == "0" or not act or not is_f32(*ins):
        return None
    if ins[0].rank < 1 or ins[1].rank != 2:
        return None
    gate_first = bool(gated_node.op.gate_first)
    what = ("bias + " if has_bias else "") + f"gated {gated_node.op.act.value}"
    low = bf16_gemm.gemm_kernel(node, ins, outs, ctx, has_bias=has_bias, act=act, what=what,
                                gate_first=gate_first) if native.lib() is not None else None
    if low is not None:
        return low
    cols = int(ins[1].dims[-1])
    if not is_f32(*outs) or (has_bias and tuple(ins[2].dims) not in ((cols,), ())):
        return None
    if bf16_gemm.rounded_source(node, ctx, 0) is not None and \
            bf16_gemm.bf16_weight(node, ctx, 1) is not None:
        return None  # the bf16 GEMM runs the product, the gated kernel after it
    packed = packed_weight(node, ctx, gate_first=gate_first)
    if packed is None:
        return None
    static_bias = ctx.static.get(node.inputs[2]) if has_bias else None
    paired = None if static_bias is None else _gate_up_bias(static_bias, packed)

    def run(x, w, *rest):
        out = rest[-1]
        b = paired if paired is not None or not has_bias else _gate_up_bias(rest[0], packed)
        x = _c(x)  # held in a name: a temporary copy would be freed before the call
        if not pg.gemm_gated(x, packed, out, b, act):  # the types were checked above
            raise InterpretError(f"gated GEMM at node {node.label}: x {x.shape} / out "
                                 f"{out.shape} do not fit the packed weight {w.shape}")

    rows = _numel(outs[0]) // max(packed.out_cols, 1)
    return Kernel(run, Dispatch.NATIVE, f"braze packed-weight GEMM + {what}",
                  flops=2 * rows * cols * int(ins[1].dims[0]) + 4 * rows * packed.out_cols,
                  bytes=nbytes(ins) + nbytes(outs))


def rounded_output(node, cast_node, ins, outs, ctx) -> Kernel | None:
    """One kernel for a node and the cast to bf16 `cast_node` that is the only reader of its
    f32 result (the bf16 policy's rounding of the next GEMM's operand): the node's kernel
    writes its result rounded to bf16 (nearest even) into the cast's output, so the f32
    values never reach memory and the next GEMM reads half the bytes with no rounding pass
    (KernelContext.handoff). For a GEMM (matmul, FusedMatMulBiasAct) on braze's AMX bf16
    GEMM, rounded as each block leaves bias + activation, and a FusedSwiGLU (act(gate) * up).
    `ins` are the node's input types, `outs` the cast's. None where that does not apply
    (another op, MKL's bf16 GEMM, no bf16 GEMM for this weight): the two run as before."""
    op = node.op
    if not is_f32(*ins) or native.lib() is None:
        return None
    if isinstance(op, FusedSwiGLU):
        return gated(node, ins, outs, ctx)
    if isinstance(op, FusedMatMulBiasAct):
        has_bias, act, what = op.has_bias, _act_code(op.act), op.act.value if op.act else "bias"
    elif isinstance(op, MatMul):
        has_bias, act, what = False, 0, "matmul"
    else:
        return None
    if act is None:
        return None
    return bf16_gemm.gemm_kernel(node, ins, outs, ctx, has_bias=has_bias, act=act, what=what)


def _gate_up_bias(bias: np.ndarray, packed: pg.PackedWeight) -> np.ndarray:
    """A bias [2F] (or a scalar) in the gated weight's gate / up panel layout."""
    return pg.gemm_bias(bias, 2 * packed.out_cols, packed.gate_first)


def then_activation(k: Kernel | None, fn, out: int) -> Kernel | None:
    """`k` followed by the activation `fn` applied in place to its output (run argument
    `out`): an activation the C epilogues lack (exp, erf, abs, ...) runs NumPy's after the
    native GEMM or conv, instead of the whole node running its reference."""
    if k is None or fn is None:
        return k

    def run(*arrays):
        k.run(*arrays)
        np.copyto(arrays[out], fn.apply(arrays[out]))

    def bind(*arrays):
        call, y = k.bind(*arrays), arrays[out]

        def both():
            call()
            np.copyto(y, fn.apply(y))
        return both

    return replace(k, run=run, bind=None if k.bind is None else bind,
                   name=f"{k.name}, then NumPy {fn.value}")


@register_kernel(FusedMatMulBiasAct)
def matmul_bias_act(node, ins, outs, ctx):
    op = node.op
    code = _act_code(op.act)
    numpy_act = op.act if code is None else None  # one the C epilogues lack: NumPy's after
    k = _matmul_bias_act(node, ins, outs, ctx, code or 0)
    return then_activation(k, numpy_act, len(node.inputs))


def _matmul_bias_act(node, ins, outs, ctx, act: int) -> Kernel | None:
    """FusedMatMulBiasAct's kernel with the C epilogue `act` (a c_snippets.ACT_CODES code)."""
    op = node.op
    lib = native.lib()
    if lib is None or not is_f32(*ins):
        return None
    cols = int(outs[0].dims[-1]) if outs[0].rank else 1  # a dot of two vectors: one value
    if op.has_bias and not pg.bias_fits(ins[2], cols):
        return None
    rows = _numel(outs[0]) // max(cols, 1)
    what = op.act.value if act else "bias"
    low = bf16_gemm.gemm_kernel(node, ins, outs, ctx, has_bias=op.has_bias, act=act, what=what)
    if low is None:
        low = bf16_batched.batched_kernel(node, ins, outs, ctx, has_bias=op.has_bias, act=act,
                                          what=what)
    if low is not None:
        return low

    def run(x, w, *rest):
        out = rest[-1]
        b = pg.gemm_bias(rest[0], cols) if op.has_bias else None  # one value: spread
        if packed is not None and prepared_gemm(x, packed, out, b, act):
            return
        if w.ndim == 2 and gemm_bias_act(lib, x, w, out, b, act):
            return
        blas.matmul(x, w, out)
        if b is not None or act:
            lib.bias_act(address(out), None if b is None else address(b), rows, cols, act)

    k = int(ins[0].dims[-1])
    packed = packed_weight(node, ctx, act=act, bias=op.has_bias)
    if packed is not None:
        how = prepared_how(packed, epilogue=True)
    elif blas.sgemm_address() and ins[1].rank == 2:
        how = "MKL sgemm slabs + C epilogue in one region"
    else:
        how = "BLAS matmul + C epilogue"
    return Kernel(run, Dispatch.NATIVE, f"{how} ({what})",
                  flops=2 * rows * cols * k, bytes=nbytes(ins) + nbytes(outs))


def _norm_kernel(node, ins, outs, rms: bool, residual: bool, expose: bool):
    lib = native.lib()
    op = node.op
    if lib is None or not is_f32(*ins):
        return None
    x = ins[0]
    rank = x.rank
    axis = op.axis % rank if rank else 0
    cols = int(np.prod(x.dims[axis:], dtype=np.int64))
    rows = _numel(outs[0]) // max(cols, 1)
    name = ("residual " if residual else "") + ("RMSNorm" if rms else "LayerNorm")
    res_rows = rows
    if residual and ins[1].dims != x.dims:
        # a residual repeated over leading axes ([1, S, D] or [S, D] against [B, S, D]): row r
        # of the sum reads residual row r % res_rows; any other broadcast runs the reference
        lead = leading_broadcast_axes(x.dims, ins[1].dims)
        res_rows = _numel(ins[1]) // max(cols, 1)
        if lead is None or lead > axis or res_rows == 0 or rows % res_rows:
            return None
        name += f", residual repeated over {rows // res_rows} row blocks"
    run = _row_norm_run(lib, op, len(ins), rms, residual, expose, rows, cols, res_rows)
    return Kernel(run, Dispatch.NATIVE, f"C row {name}", bytes=nbytes(ins) + nbytes(outs),
                  flops=6 * _numel(outs[0]))


def _row_norm_run(lib, op, n_in: int, rms: bool, residual: bool, expose: bool, rows: int,
                  cols: int, res_rows: int):
    """The run function of one native row-norm call over `rows` rows of `cols` values (row r
    reading residual row r % res_rows)."""
    first_affine = 2 if residual else 1
    has_gamma, has_beta = op.has_gamma, op.has_beta
    eps = float(op.eps)

    def run(*arrays):
        x_a = _c(arrays[0])
        r_a = _c(arrays[1]) if residual else None
        it = iter(arrays[first_affine:n_in])
        gamma = _c(next(it)) if has_gamma else None
        beta = _c(next(it)) if has_beta else None
        y = arrays[n_in]
        s = arrays[n_in + 1] if expose else None
        lib.row_norm(address(x_a), None if r_a is None else address(r_a),
                     None if gamma is None else address(gamma),
                     None if beta is None else address(beta), address(y),
                     None if s is None else address(s), rows, cols, res_rows, eps, int(rms))

    return run


@register_kernel(LayerNorm)
def layer_norm(node, ins, outs, ctx):
    return _norm_kernel(node, ins, outs, rms=False, residual=False, expose=False)


@register_kernel(RmsNorm)
def rms_norm(node, ins, outs, ctx):
    return _norm_kernel(node, ins, outs, rms=True, residual=False, expose=False)


@register_kernel(GroupNorm)
def group_norm(node, ins, outs, ctx):
    """One C pass per group of one image for its statistics, one for the affine normalize
    (wav2vec2's GroupNorm(512, 512) over [1, 512, 8191] had run as 9 decomposed passes)."""
    lib = native.lib()
    if lib is None or not is_f32(*ins):
        return None
    op: GroupNorm = node.op
    dims = ins[0].dims
    n, c = int(dims[0]), int(dims[1])
    cg, spatial = c // op.num_groups, _numel(ins[0]) // max(n * c, 1)
    eps = float(op.eps)

    def run(*arrays):
        x, *affine = (_c(a) for a in arrays[:len(ins)])
        it = iter(affine)
        gamma = next(it) if op.has_gamma else None
        beta = next(it) if op.has_beta else None
        lib.group_norm(address(x), None if gamma is None else address(gamma),
                       None if beta is None else address(beta), address(arrays[len(ins)]),
                       n * op.num_groups, op.num_groups, cg, spatial, eps)

    return Kernel(run, Dispatch.NATIVE, "C group norm", bytes=nbytes(ins) + nbytes(outs),
                  flops=5 * _numel(outs[0]))


@register_kernel(FusedResidualLN)
def residual_ln(node, ins, outs, ctx):
    return _norm_kernel(node, ins, outs, rms=False, residual=True, expose=node.op.expose_sum)


@register_kernel(FusedResidualRmsNorm)
def residual_rms(node, ins, outs, ctx):
    return _norm_kernel(node, ins, outs, rms=True, residual=True, expose=node.op.expose_sum)


@register_kernel(Softmax)
def softmax(node, ins, outs, ctx):
    lib = native.lib()
    x = ins[0]
    if lib is None or not is_f32(x) or x.rank == 0:
        return None
    axis = node.op.axis % x.rank
    n = int(x.dims[axis])
    inner = int(np.prod(x.dims[axis + 1:], dtype=np.int64))
    outer = _numel(x) // max(n * inner, 1)
    cost = dict(bytes=nbytes(ins) + nbytes(outs), flops=5 * _numel(x))
    if inner == 1:
        def run(a, out):
            a = _c(a)  # held in a name: a temporary copy would be freed before the call
            lib.softmax_rows(address(a), address(out), outer, n)

        return Kernel(run, Dispatch.NATIVE, "C safe softmax rows", inplace=(0,), **cost)

    def run_strided(a, out):
        a = _c(a)
        lib.softmax_strided(address(a), address(out), outer, n, inner)

    return Kernel(run_strided, Dispatch.NATIVE, f"C safe softmax over axis {axis} of "
                  f"{x.rank} (vectors across the {inner} values after it)", inplace=(0,),
                  **cost)


@register_kernel(Unary)
def activation(node, ins, outs, ctx):
    lib = native.lib()
    act = _act_code(node.op.fn)
    if lib is None or not act or not is_f32(*ins):
        return None
    n = _numel(outs[0])

    def run(x, out):
        x = _c(x)
        lib.unary_act(address(x), address(out), n, act)

    return Kernel(run, Dispatch.NATIVE, f"C {node.op.fn.value}", inplace=(0,),
                  bytes=nbytes(ins) + nbytes(outs), flops=n)


@register_kernel(FusedSwiGLU)
def gated(node, ins, outs, ctx):
    lib = native.lib()
    act = _act_code(node.op.act)
    if lib is None or not act or not is_f32(*ins):
        return None
    half = int(outs[0].dims[-1])
    rows = _numel(outs[0]) // max(half, 1)
    gate_first = int(node.op.gate_first)
    out16 = outs[0].dtype.name == "bf16"  # rounded_output: the result rounded for a GEMM
    if not out16 and not is_f32(*outs):
        return None

    def run(h, out):
        h = _c(h)
        lib.gated(address(h), address(out), rows, half, gate_first, act, int(out16))

    return Kernel(run, Dispatch.NATIVE,
                  f"C gated {node.op.act.value}" + (", bf16 out" if out16 else ""),
                  bytes=nbytes(ins) + nbytes(outs), flops=4 * _numel(outs[0]))


@register_kernel(Rope)
def rope(node, ins, outs, ctx):
    lib = native.lib()
    x, cos, _ = ins
    if lib is None or not is_f32(*ins) or x.rank < 2:
        return None
    if any(d != 1 for d in cos.dims[:-2]) or cos.rank < 2 or cos.dims[-2] != x.dims[-2]:
        return None
    s, d = int(x.dims[-2]), int(x.dims[-1])
    outer = _numel(x) // max(s * d, 1)
    n_rot = node.op.n_rot or d
    inter = int(node.op.interleaved)

    def run(xa, ca, sa, out):
        xa, ca, sa = _c(xa), _c(ca), _c(sa)
        lib.rope(address(xa), address(ca), address(sa), address(out), outer, s, d,
                 n_rot, inter)

    return Kernel(run, Dispatch.NATIVE, "C rope", bytes=nbytes(ins) + nbytes(outs),
                  flops=3 * _numel(x))
