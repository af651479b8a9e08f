"""Builder methods for the fusion-first builders (linear_fused, shared_matmul_pair, swiglu_ffn,
fused_swiglu_ffn) and one builder per fused kind. Optional inputs are given or left None; the
op's has_* attributes follow from what was given."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...errors import GraphError, ShapeError
from ..op import Value
from ..ops.attention import MaskKind
from ..ops.elementwise import UnaryFn
from ..ops.fused import (
    DynamicQuantMatMul,
    FusedAttentionBlock,
    FusedConvBiasAct,
    FusedMatMulBiasAct,
    FusedResidualLN,
    FusedResidualRmsNorm,
    FusedRmsNormReshape,
    FusedSwiGLU,
    FusedTransformerLayer,
    LayerStyle,
    MlpKind,
    NormKind,
    QkvInputs,
    RopeMode,
)
from ..ops.region import ElementwiseRegion
from ..ops.shape import resolve_reshape
from ..shapes import Dim
from .conv import _padding4, _pair
from .elementwise import _enum

__all__ = ["FusedBuilder"]


def _act(act: UnaryFn | str | None) -> UnaryFn | None:
    return None if act is None else _enum(UnaryFn, act)


def _present(*vals: Value | None) -> tuple[Value, ...]:
    return tuple(v for v in vals if v is not None)


def _one(vals: tuple[Value, ...]) -> Value | tuple[Value, ...]:
    return vals[0] if len(vals) == 1 else vals


class FusedBuilder:
    # -- fusion-first builders ------------------------------------------------------------------
    def linear_fused(self, x: Value, w: Value, b: Value | None = None,
                     act: UnaryFn | str | None = None) -> Value:
        """`act(x @ w + b)` as one FusedMatMulBiasAct node (bias and act optional)."""
        op = FusedMatMulBiasAct(_act(act), b is not None)
        return self.add_node(op, _present(x, w, b))[0]

    fused_matmul_bias_act = linear_fused

    def dynamic_quant_matmul(self, x: Value, w_q: Value, w_scale: Value, b: Value | None = None,
                             act: UnaryFn | str | None = None) -> Value:
        """`act(x @ dequantize(w_q, w_scale) + b)` with x quantized per row to u8 when it runs:
        one DynamicQuantMatMul node (w_q i8 [K, N], w_scale f32 [N]; bz.quantize_dynamic
        writes them for a graph's linear layers)."""
        op = DynamicQuantMatMul(_act(act), b is not None)
        return self.add_node(op, _present(x, w_q, w_scale, b))[0]

    def shared_matmul_pair(self, x: Value, w1: Value, w2: Value) -> tuple[Value, Value]:
        """(x @ w1, x @ w2) as two plain matmuls on one input: what the shared-input pass
        fuses into one wider matmul."""
        return self.matmul(x, w1), self.matmul(x, w2)

    def swiglu_ffn(self, x: Value, w_gate: Value, w_up: Value, w_down: Value) -> Value:
        """`(silu(x @ w_gate) * (x @ w_up)) @ w_down` written as primitives."""
        gate, up = self.shared_matmul_pair(x, w_gate, w_up)
        return self.matmul(self.mul(self.silu(gate), up), w_down)

    def fused_swiglu_ffn(self, x: Value, w_gate_up: Value, w_down: Value,
                         gate_first: bool = True) -> Value:
        """`FusedSwiGLU(x @ w_gate_up) @ w_down`; `gate_first` says which half of w_gate_up's
        columns is the gate."""
        return self.matmul(self.fused_swiglu(self.matmul(x, w_gate_up), gate_first), w_down)

    # -- one builder per fused kind -------------------------------------------------------------
    def fused_swiglu(self, h: Value, gate_first: bool = True,
                     act: UnaryFn | str = UnaryFn.SILU) -> Value:
        """`act(gate) * up` from h [..., 2N] holding both halves (SiLU: SwiGLU; gelu: GeGLU)."""
        return self.add_node(FusedSwiGLU(bool(gate_first), _enum(UnaryFn, act)), (h,))[0]

    def fused_residual_ln(self, x: Value, residual: Value, gamma: Value | None = None,
                          beta: Value | None = None, eps: float = 1e-5, axis: int = -1,
                          expose_sum: bool = False) -> Value | tuple[Value, Value]:
        """`layer_norm(x + residual)`; with `expose_sum` returns (normed, sum)."""
        op = FusedResidualLN(float(eps), int(axis), gamma is not None, beta is not None,
                             bool(expose_sum))
        return _one(self.add_node(op, _present(x, residual, gamma, beta)))

    def fused_residual_rms_norm(self, x: Value, residual: Value, gamma: Value | None = None,
                                beta: Value | None = None, eps: float = 1e-6, axis: int = -1,
                                expose_sum: bool = False) -> Value | tuple[Value, Value]:
        """`rms_norm(x + residual)`; with `expose_sum` returns (normed, sum)."""
        op = FusedResidualRmsNorm(float(eps), int(axis), gamma is not None, beta is not None,
                                  bool(expose_sum))
        return _one(self.add_node(op, _present(x, residual, gamma, beta)))

    def fused_rms_norm_reshape(self, x: Value, dims: Sequence[Dim], gamma: Value | None = None,
                               beta: Value | None = None, eps: float = 1e-6) -> Value:
        """`rms_norm(reshape(x, dims))` over the new last axis (per-head QK-norm); one -1 in
        `dims` is resolved here as `reshape` does."""
        try:
            resolved = resolve_reshape(self.shape_of(x).dims, tuple(dims))
        except ShapeError:
            resolved = tuple(dims)  # add_node reports the error with node context
        op = FusedRmsNormReshape(float(eps), gamma is not None, beta is not None, resolved)
        return self.add_node(op, _present(x, gamma, beta))[0]

    def fused_attention_block(
        self, x: Value, w_qkv: Value, w_o: Value, b_qkv: Value | None = None,
        b_o: Value | None = None, *, num_heads: int, num_kv_heads: int | None = None,
        head_dim: int | None = None, mask: Value | None = None,
        mask_kind: MaskKind | str | None = None, window: int = 0, scale: float | None = None,
        softcap: float | None = None, cos: Value | None = None, sin: Value | None = None,
        rope: RopeMode | str | None = None, n_rot: int | None = None,
        x_kv: Value | None = None, w_x_kv: Value | None = None, b_x_kv: Value | None = None,
        qkv_inputs: QkvInputs | str | None = None, past_k: Value | None = None,
        past_v: Value | None = None,
    ) -> Value | tuple[Value, Value, Value]:
        """One FusedAttentionBlock node (see the op for the meaning).

        Self-attention: w_qkv (+ b_qkv) projects x to q, k, v. With `x_kv`, w_qkv (+ b_qkv)
        projects x to the roles it reads (q for "cross", the default then; q and k for
        "separate_v") and w_x_kv (+ b_x_kv) projects x_kv to the others.
        `head_dim` defaults to w_o's rows / num_heads, `num_kv_heads` to what the projection
        widths imply; `mask_kind` to CUSTOM when `mask` is given, else NONE; `rope` to
        rotate-half when cos/sin are given, else NONE. With a KV cache `past_k` / `past_v`
        [B, Hkv, P, D] (a decode step) it returns (y, present_k, present_v)."""
        layout = _enum(QkvInputs, qkv_inputs) if qkv_inputs is not None else (
            QkvInputs.SELF if x_kv is None else QkvInputs.CROSS)
        if (layout is QkvInputs.SELF) != (x_kv is None) or (x_kv is None) != (w_x_kv is None):
            raise GraphError(f"fused_attention_block qkv_inputs {layout.value!r} needs x_kv and "
                             "w_x_kv exactly when it is not 'self'")
        if (b_qkv is None) != (b_x_kv is None) and x_kv is not None:
            raise GraphError("fused_attention_block takes projection biases for both inputs or "
                             "for neither (b_qkv and b_x_kv)")
        hq = int(num_heads)
        d = int(head_dim) if head_dim is not None else self._dim(w_o, 0) // hq
        if num_kv_heads is None:
            num_kv_heads = {QkvInputs.SELF: lambda: (self._dim(w_qkv, -1) // d - hq) // 2,
                            QkvInputs.CROSS: lambda: self._dim(w_x_kv, -1) // d // 2,
                            QkvInputs.SEPARATE_V: lambda: self._dim(w_x_kv, -1) // d}[layout]()
        mk = _enum(MaskKind, mask_kind) if mask_kind is not None else (
            MaskKind.CUSTOM if mask is not None else MaskKind.NONE)
        if mk.takes_input != (mask is not None):
            raise GraphError(f"fused_attention_block mask kind {mk.value!r} "
                             f"{'needs' if mk.takes_input else 'takes no'} mask input")
        rm = _enum(RopeMode, rope) if rope is not None else (
            RopeMode.ROTATE_HALF if cos is not None else RopeMode.NONE)
        if (rm is not RopeMode.NONE) != (cos is not None and sin is not None):
            raise GraphError(f"fused_attention_block rope {rm.value!r} needs cos and sin "
                             "exactly when rope is not 'none'")
        op = FusedAttentionBlock(
            hq, int(num_kv_heads), d, mk, int(window), None if scale is None else float(scale),
            None if softcap is None else float(softcap), rm,
            None if n_rot is None else int(n_rot), b_qkv is not None, b_o is not None,
            qkv_inputs=layout, kv_cache=past_k is not None)
        if (past_k is None) != (past_v is None):
            raise GraphError("fused_attention_block takes a KV cache as past_k and past_v "
                             "together")
        ins = _present(x, x_kv, w_qkv, b_qkv, w_x_kv, b_x_kv, w_o, b_o, cos, sin, mask, past_k,
                       past_v)
        outs = self.add_node(op, ins)
        return outs if op.kv_cache else outs[0]

    def fused_transformer_layer(
        self, x: Value, inputs: Mapping[str, Value], *, attn: FusedAttentionBlock,
        style: LayerStyle | str = LayerStyle.PRE_NORM, norm: NormKind | str = NormKind.LAYER,
        eps: float = 1e-5, mlp: MlpKind | str = MlpKind.GELU,
    ) -> Value:
        """One FusedTransformerLayer node. `inputs` maps each role after "x" (see
        `FusedTransformerLayer.input_roles()`) to its value; `has_mlp_bias` and
        `has_norm_beta` follow from whether "b1" and "norm1_beta" are given."""
        op = FusedTransformerLayer(_enum(LayerStyle, style), attn, _enum(NormKind, norm),
                                   float(eps), _enum(MlpKind, mlp), "b1" in inputs,
                                   "norm1_beta" in inputs)
        roles = op.input_roles()[1:]
        missing = [r for r in roles if r not in inputs]
        extra = sorted(set(inputs) - set(roles))
        if missing or extra:
            raise GraphError(f"fused_transformer_layer inputs: missing {missing}, unexpected "
                             f"{extra}; expected roles {list(roles)}")
        return self.add_node(op, (x,) + tuple(inputs[r] for r in roles))[0]

    def fused_conv_bias_act(self, x: Value, w: Value, b: Value, stride=1, padding=0,
                            dilation=1, groups: int = 1,
                            act: UnaryFn | str | None = None,
                            residual: Value | None = None) -> Value:
        """`act(conv2d(x, w, b) + residual)` as one node (no residual: `act(conv2d(x, w,
        b))`); attributes as `conv2d`."""
        op = FusedConvBiasAct(_pair(stride, "stride"), _padding4(padding),
                              _pair(dilation, "dilation"), int(groups), _act(act),
                              residual is not None)
        return self.add_node(op, (x, w, b) + ((residual,) if residual is not None else ()))[0]

    def elementwise_region(self, body, inputs: Sequence[Value]) -> Value | tuple[Value, ...]:
        """An ElementwiseRegion running `body` (a Graph with inputs in0, in1, ...) on `inputs`;
        one value per body output."""
        return _one(self.add_node(ElementwiseRegion(body), tuple(inputs)))

    def _dim(self, v: Value, axis: int) -> int:
        d = self.shape_of(v).dims[axis]
        if not isinstance(d, int):
            raise GraphError(f"fused_attention_block cannot derive head sizes from symbolic dim "
                             f"{d!r}; pass num_kv_heads and head_dim")
        return d
