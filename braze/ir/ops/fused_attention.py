"""Fused attention block (QKV projection, heads, rope, attention, output projection) and the
fused transformer layer built on it (post-norm BERT style, pre-norm GPT-2 / LLaMA style).
The block covers self-attention, encoder-decoder cross-attention and MobileBERT's separate
value input (`QkvInputs`).

Both are named composites: their meaning is their decomposition (the layer decomposes through
the block's decomposition), and `input_roles()` says which input is which."""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..dtypes import DType
from ..op import Value, require, same_dtype
from ..shapes import Shape
from ..symbolic import SymDim
from .attention import Attention, MaskKind, Rope
from .elementwise import UnaryFn
from .fused_simple import FusedMatMulBiasAct, FusedOp, FusedSwiGLU, _check_vector, norm_op
from .linalg import MatMul
from .norm import LayerNorm, RmsNorm

if TYPE_CHECKING:
    from ..graph import Graph

__all__ = [
    "RopeMode", "QkvInputs", "FusedAttentionBlock", "LayerStyle", "NormKind", "MlpKind",
    "FusedTransformerLayer",
]


class RopeMode(enum.Enum):
    """Rotary embedding inside a fused attention block: none, rotate-half (NeoX), interleaved
    (GPT-J)."""

    NONE = "none"
    ROTATE_HALF = "rotate_half"
    INTERLEAVED = "interleaved"


class QkvInputs(enum.Enum):
    """Which input each of q, k, v projects: SELF (x, x, x), CROSS (x, x_kv, x_kv: an
    encoder-decoder decoder's queries over the encoder output), SEPARATE_V (x, x, x_kv:
    MobileBERT's values from the layer input while q and k read the bottleneck)."""

    SELF = "self"
    CROSS = "cross"
    SEPARATE_V = "separate_v"

    @property
    def sources(self) -> tuple[str, str, str]:
        """The input role ("x" or "x_kv") that q, k and v project, in that order."""
        return _SOURCES[self]

    @property
    def projections(self) -> tuple[tuple[str, str], ...]:
        """(input role, the roles it projects joined: "qkv", "q", "kv", "qk", "v") per
        projection, in input order; each has one weight w_<roles> (and bias b_<roles>)."""
        groups: dict[str, str] = {}
        for role, src in zip("qkv", self.sources):
            groups[src] = groups.get(src, "") + role
        return tuple(groups.items())

    @classmethod
    def of(cls, sources: Sequence) -> QkvInputs | None:
        """The layout whose q, k, v read `sources` (three values; equal entries are one
        input), or None when no layout reads inputs that way (q and v of one, k of another;
        three inputs)."""
        q, k, v = sources
        if k == v:
            return cls.SELF if k == q else cls.CROSS
        return cls.SEPARATE_V if k == q else None


_SOURCES = {QkvInputs.SELF: ("x", "x", "x"), QkvInputs.CROSS: ("x", "x_kv", "x_kv"),
            QkvInputs.SEPARATE_V: ("x", "x", "x_kv")}


# -- attention block ----------------------------------------------------------------------------
@dataclass(frozen=True)
class FusedAttentionBlock(FusedOp):
    """Multi-head attention with fused q/k/v and output projections: self-attention, or q over
    a second input x_kv (`qkv_inputs`, see QkvInputs).

    Inputs, in order: x [B, S, E], x_kv [B, S_kv, E_kv] (unless SELF), then per projection of
    `qkv_inputs.projections` its joined weight w_<roles> [E_in, width] and bias b_<roles>
    [width] (if `has_qkv_bias`) - self-attention: w_qkv [E, (Hq + 2*Hkv) * D]; cross: w_q
    [E, Hq*D], w_kv [E_kv, 2*Hkv*D]; separate v: w_qk [E, (Hq + Hkv) * D], w_v [E_kv, Hkv*D] -,
    w_o [Hq*D, E_out], b_o (if `has_out_bias`), the q and k norms' gamma / beta (if `qk_norm`
    has them: q_norm_gamma, q_norm_beta, k_norm_gamma, k_norm_beta, each [D] per head or
    [H*D] over the whole slice), cos and sin [S, n_rot // 2] (if `rope` is not NONE), mask (if
    `mask` is CUSTOM or BIAS; additive, broadcastable to [B, Hq, S, S_k]), past_k and past_v
    [B, Hkv, P, D] (if `kv_cache`).
    Output [B, S, E_out]; with `kv_cache` also present_k and present_v [B, Hkv, P + S, D].
    B, S, S_kv and P may be symbolic.

    Meaning: each projection is its input @ w (+ b); q, k, v are the consecutive slices of
    widths Hq*D, Hkv*D, Hkv*D (in q, k, v order) of the last axis of the projection of the
    input they read; `qk_norm` (a LayerNorm or RmsNorm over the last axis, if any) normalizes
    q and k, each head alone (`qk_norm_per_head`) or the whole slice; each is reshaped to
    [B, S_in, H, D] and transposed to [B, H, S_in, D]; rope (if any) rotates q and k (which
    must read one input); attention with `mask` / `window` / `scale` / `softcap` (GQA when
    Hkv < Hq; causal and sliding-window masks need k to read x); the result is transposed
    back, reshaped to [B, S, Hq*D], rounded to `round_attention` and back if set (the
    mixed-precision policy's rounding of the output projection's operand, see
    braze/passes/precision.py), and projected by w_o (+ b_o). `round_core` is the attention's
    `round_operands` (the policy's rounding of q, k, v and the probabilities)."""

    kind = "fused_attention_block"
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mask: MaskKind = MaskKind.NONE
    window: int = 0
    scale: float | None = None
    softcap: float | None = None
    rope: RopeMode = RopeMode.NONE
    n_rot: int | None = None
    has_qkv_bias: bool = True
    has_out_bias: bool = True
    qk_norm: LayerNorm | RmsNorm | None = None
    qk_norm_per_head: bool = True
    qkv_inputs: QkvInputs = QkvInputs.SELF
    round_attention: DType | None = None
    round_core: DType | None = None
    kv_cache: bool = False

    def input_roles(self) -> tuple[str, ...]:
        roles = ["x"] + ["x_kv"] * (self.qkv_inputs is not QkvInputs.SELF)
        for _, joined in self.qkv_inputs.projections:
            roles += [f"w_{joined}"] + [f"b_{joined}"] * self.has_qkv_bias
        roles += ["w_o"] + ["b_o"] * self.has_out_bias
        if self.qk_norm is not None:
            for t in ("q", "k"):
                roles += [f"{t}_norm_gamma"] * self.qk_norm.has_gamma
                roles += [f"{t}_norm_beta"] * self.qk_norm.has_beta
        if self.rope is not RopeMode.NONE:
            roles += ["cos", "sin"]
        if self.mask.takes_input:
            roles.append("mask")
        if self.kv_cache:
            roles += ["past_k", "past_v"]
        return tuple(roles)

    def role_width(self, roles: str) -> int:
        """Columns of the projection slices of `roles` together ("q" -> Hq*D, "kv" ->
        2*Hkv*D, ...)."""
        heads = {"q": self.num_heads, "k": self.num_kv_heads, "v": self.num_kv_heads}
        return sum(heads[r] for r in roles) * self.head_dim

    def slices(self) -> dict[str, tuple[str, int, int]]:
        """role -> (joined roles of its projection, start column, heads) for q, k and v."""
        out = {}
        for _, joined in self.qkv_inputs.projections:
            for i, role in enumerate(joined):
                out[role] = (joined, self.role_width(joined[:i]), self.role_width(role)
                             // self.head_dim)
        return out

    @property
    def qkv_width(self) -> int:
        """Columns of q, k and v together ((Hq + 2*Hkv) * D; w_qkv's width when SELF)."""
        return self.role_width("qkv")

    @property
    def attention_op(self) -> Attention:
        return Attention(self.mask, self.window, self.scale, self.softcap, self.round_core)

    @property
    def rope_op(self) -> Rope | None:
        if self.rope is RopeMode.NONE:
            return None
        return Rope(self.rope is RopeMode.INTERLEAVED, self.n_rot)

    def infer(self, ins):
        r = self.named(ins)
        x, w_o = r["x"], r["w_o"]
        same_dtype(self, ins)
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        require(hq > 0 and hkv > 0 and d > 0,
                f"{self.kind} heads and head dim must be > 0, got {hq}, {hkv}, {d}")
        require(hq % hkv == 0, f"{self.kind} kv heads {hkv} must divide query heads {hq}")
        require(self.rope is not RopeMode.NONE or self.n_rot is None,
                f"{self.kind} n_rot={self.n_rot} needs a rope mode")
        sources = self.qkv_inputs.sources
        require(self.rope is RopeMode.NONE or sources[0] == sources[1],
                f"{self.kind} rope rotates q and k by their positions in one input; with "
                f"qkv_inputs={self.qkv_inputs.value} they read different inputs (set rope "
                "'none')")
        require(sources[1] == "x" or not self.mask.is_causal,
                f"{self.kind} mask {self.mask.value} orders keys by the queries' positions, "
                f"but with qkv_inputs={self.qkv_inputs.value} the keys come from x_kv; use "
                "mask 'none', 'custom' or 'bias'")
        require(x.rank == 3, f"{self.kind} x must be [B, S, E], got {x}")
        for name in ("round_attention", "round_core"):
            dt = getattr(self, name)
            require(dt is None or dt.is_float, f"{self.kind} {name} must be a float dtype, "
                    f"got {dt}")
        b, s, _ = x.dims
        if "x_kv" in r:
            require(r["x_kv"].rank == 3 and r["x_kv"].dims[0] == b,
                    f"{self.kind} x_kv must be [B = {b}, S_kv, E_kv], got {r['x_kv']}")
        for src, joined in self.qkv_inputs.projections:
            width = self.role_width(joined)
            w, e = r[f"w_{joined}"], r[src].dims[-1]
            require(w.dims == (e, width), f"{self.kind} w_{joined} must be [{e}, {width}] "
                    f"({joined} of {hq} query / {hkv} kv heads x {d}), got {w}")
            if self.has_qkv_bias:
                _check_vector(self.kind, f"b_{joined}", r[f"b_{joined}"], width, x.dtype)
        require(w_o.rank == 2 and w_o.dims[0] == hq * d,
                f"{self.kind} w_o must be [Hq*D = {hq * d}, E_out], got {w_o}")
        e_out = w_o.dims[1]
        if self.has_out_bias:
            _check_vector(self.kind, "b_o", r["b_o"], e_out, x.dtype)
        seq = {src: r[src].dims[1] for src in set(sources)}
        q, k, v = (Shape((b, h, seq[src], d), x.dtype)
                   for h, src in zip((hq, hkv, hkv), sources))
        if self.qk_norm is not None:
            self._infer_qk_norm(r, b, seq)
        if self.rope_op is not None:
            self.rope_op.infer((q, r["cos"], r["sin"]))
            self.rope_op.infer((k, r["cos"], r["sin"]))
        if self.kv_cache:
            k = v = self._infer_present(r, b, seq["x"])
        extra = (r["mask"],) if self.mask.takes_input else ()
        self.attention_op.infer((q, k, v) + extra)
        y = Shape((b, s, e_out), x.dtype)
        return (y, k, v) if self.kv_cache else y

    def _infer_present(self, r: dict, b, s) -> Shape:
        """present_k / present_v [B, Hkv, P + S, D] from past_k / past_v [B, Hkv, P, D]."""
        require(self.qkv_inputs is QkvInputs.SELF,
                f"{self.kind} kv_cache needs qkv_inputs=self (a decode step's keys and values "
                f"extend a cache of the same input), got {self.qkv_inputs.value}")
        pk, pv = r["past_k"], r["past_v"]
        want = (b, self.num_kv_heads, pk.dims[2] if pk.rank == 4 else "P", self.head_dim)
        for name, p in (("past_k", pk), ("past_v", pv)):
            require(p.rank == 4 and p.dims == want and p.dtype == r["x"].dtype,
                    f"{self.kind} {name} must be {r['x'].dtype}[B, Hkv, P, D] = "
                    f"[{', '.join(map(str, want))}], got {p}")
        total = (SymDim.of(pk.dims[2]) + SymDim.of(s)).to_dim()
        return Shape((b, self.num_kv_heads, total, self.head_dim), r["x"].dtype)

    def _infer_qk_norm(self, r: dict, b, seq: dict) -> None:
        norm, d = self.qk_norm, self.head_dim
        require(isinstance(norm, (LayerNorm, RmsNorm)) and norm.axis == -1,
                f"{self.kind} qk_norm must be a LayerNorm or RmsNorm over axis -1, got {norm}")
        for t, h, src in zip("qk", (self.num_heads, self.num_kv_heads), self.qkv_inputs.sources):
            s = seq[src]
            dims = (b, s, h, d) if self.qk_norm_per_head else (b, s, h * d)
            params = tuple(r[k] for k in (f"{t}_norm_gamma", f"{t}_norm_beta") if k in r)
            norm.infer((Shape(dims, r["x"].dtype),) + params)

    def _normed(self, g: Graph, t: Value, r: dict, role: str) -> Value:
        params = [r[k] for k in (f"{role}_norm_gamma", f"{role}_norm_beta") if k in r]
        return g.add_node(self.qk_norm, [t, *params])[0]

    def decompose(self, g: Graph, ins: Sequence[Value]) -> Value | tuple[Value, ...]:
        r = self.named(ins)
        b, s, _ = g.shape_of(r["x"]).dims
        hq, d = self.num_heads, self.head_dim
        proj = {}
        for src, joined in self.qkv_inputs.projections:
            p = g.matmul(r[src], r[f"w_{joined}"])
            proj[joined] = g.add(p, r[f"b_{joined}"]) if self.has_qkv_bias else p

        def heads(role: str, src: str) -> Value:
            joined, start, h = self.slices()[role]
            t = proj[joined]
            if len(joined) > 1:
                t = g.narrow(t, -1, start, h * d)
            normed = self.qk_norm is not None and role != "v"
            if normed and not self.qk_norm_per_head:
                t = self._normed(g, t, r, role)
            t = g.reshape(t, (b, g.shape_of(r[src]).dims[1], h, d))
            if normed and self.qk_norm_per_head:
                t = self._normed(g, t, r, role)
            return g.transpose(t, (0, 2, 1, 3))

        q, k, v = (heads(role, src) for role, src in zip("qkv", self.qkv_inputs.sources))
        if self.rope is not RopeMode.NONE:
            inter = self.rope is RopeMode.INTERLEAVED
            q = g.rope(q, r["cos"], r["sin"], interleaved=inter, n_rot=self.n_rot)
            k = g.rope(k, r["cos"], r["sin"], interleaved=inter, n_rot=self.n_rot)
        if self.kv_cache:
            k, v = g.concat([r["past_k"], k], 2), g.concat([r["past_v"], v], 2)
        mask = [r["mask"]] if self.mask.takes_input else []
        o = g.add_node(self.attention_op, [q, k, v, *mask])[0]
        o = g.reshape(g.transpose(o, (0, 2, 1, 3)), (b, s, hq * d))
        if self.round_attention is not None:
            o = g.cast(g.cast(o, self.round_attention), g.shape_of(o).dtype)
        y = g.matmul(o, r["w_o"])
        y = g.add(y, r["b_o"]) if self.has_out_bias else y
        return (y, k, v) if self.kv_cache else y


# -- transformer layer --------------------------------------------------------------------------
class LayerStyle(enum.Enum):
    """Where the norms sit: after each residual add (BERT) or before each sublayer (GPT-2,
    LLaMA)."""

    POST_NORM = "post_norm"
    PRE_NORM = "pre_norm"


class NormKind(enum.Enum):
    LAYER = "layer"
    RMS = "rms"


class MlpKind(enum.Enum):
    """Feed-forward kind: act(h @ w1 + b1) @ w2 + b2, or SwiGLU (fused gate/up weight)."""

    GELU = "gelu"
    GELU_APPROX = "gelu_approx"
    RELU = "relu"
    SWIGLU = "swiglu"

    @property
    def act(self) -> UnaryFn | None:
        """The activation between the two projections (None for SWIGLU)."""
        return {MlpKind.GELU: UnaryFn.GELU, MlpKind.GELU_APPROX: UnaryFn.GELU_APPROX,
                MlpKind.RELU: UnaryFn.RELU}.get(self)


@dataclass(frozen=True)
class FusedTransformerLayer(FusedOp):
    """One transformer encoder/decoder layer: attention block + MLP + two norms.

    Inputs, in order (see `input_roles()`):
      x [B, S, E];
      the attention block's inputs after x ([x_kv], w_qkv, [b_qkv], w_o, [b_o], [cos, sin],
        [mask]; a cross-attention block reads x_kv and its two projections);
      norm1_gamma [E], norm1_beta [E] (if `has_norm_beta`);
      MLP: w1 [E, F], b1 [F], w2 [F, E], b2 [E] (biases if `has_mlp_bias`), or for SWIGLU
        w_gate_up [E, 2F] (gate half first) and w_down [F, E], never biases;
      norm2_gamma [E], norm2_beta [E] (if `has_norm_beta`).
    Output [B, S, E].

    POST_NORM: h = norm1(x + attn(x)); out = norm2(h + mlp(h)).
    PRE_NORM:  h = x + attn(norm1(x)); out = h + mlp(norm2(h)).
    mlp(h) = act(h @ w1 + b1) @ w2 + b2, or (silu(h @ wg) * (h @ wu)) @ w_down for SWIGLU.
    Norms are LayerNorm or RMSNorm (`norm`) over the last axis with `eps`."""

    kind = "fused_transformer_layer"
    style: LayerStyle
    attn: FusedAttentionBlock
    norm: NormKind = NormKind.LAYER
    eps: float = 1e-5
    mlp: MlpKind = MlpKind.GELU
    has_mlp_bias: bool = True
    has_norm_beta: bool = True

    def _norm_roles(self, i: int) -> tuple[str, ...]:
        return (f"norm{i}_gamma",) + (f"norm{i}_beta",) * self.has_norm_beta

    def _mlp_roles(self) -> tuple[str, ...]:
        if self.mlp is MlpKind.SWIGLU:
            return ("w_gate_up", "w_down")
        bias = self.has_mlp_bias
        return ("w1",) + ("b1",) * bias + ("w2",) + ("b2",) * bias

    def input_roles(self) -> tuple[str, ...]:
        return (("x",) + self.attn.input_roles()[1:] + self._norm_roles(1) + self._mlp_roles()
                + self._norm_roles(2))

    def _split(self, ins: Sequence) -> tuple[tuple, dict, tuple]:
        """(attention inputs after x, roles -> inputs, mlp inputs in mlp-op order)."""
        r = self.named(ins)
        attn = tuple(r[k] for k in self.attn.input_roles()[1:])
        return attn, r, tuple(r[k] for k in self._mlp_roles())

    def _mlp_ops(self) -> tuple[FusedMatMulBiasAct, FusedMatMulBiasAct]:
        return (FusedMatMulBiasAct(self.mlp.act, self.has_mlp_bias),
                FusedMatMulBiasAct(None, self.has_mlp_bias))

    def infer(self, ins):
        attn_ins, r, mlp_ins = self._split(ins)
        x = r["x"]
        require(not self.attn.kv_cache, f"{self.kind} has one output; its attention block "
                "cannot read a KV cache (kv_cache=True returns the present keys and values)")
        require(self.mlp is not MlpKind.SWIGLU or not self.has_mlp_bias,
                f"{self.kind} SWIGLU mlp takes no biases; set has_mlp_bias=False")
        a = self.attn.infer((x,) + attn_ins)
        require(a == x, f"{self.kind} attention output {a} must match x {x} for the residual")
        norm = norm_op(self.norm is NormKind.RMS, self.eps, -1, True, self.has_norm_beta)
        for i in (1, 2):
            norm.infer((x,) + tuple(r[k] for k in self._norm_roles(i)))
        if self.mlp is MlpKind.SWIGLU:
            gu, wd = mlp_ins
            h = FusedSwiGLU(True).infer((MatMul().infer((x, gu)),))
            y = MatMul().infer((h, wd))
        else:
            up, down = self._mlp_ops()
            n = len(mlp_ins) // 2
            y = down.infer((up.infer((x,) + mlp_ins[:n]),) + mlp_ins[n:])
        require(y == x, f"{self.kind} mlp output {y} must match x {x} for the residual")
        return x

    def _norm(self, g: Graph, x: Value, r: dict, i: int) -> Value:
        build = g.rms_norm if self.norm is NormKind.RMS else g.layer_norm
        return build(x, r[f"norm{i}_gamma"], r.get(f"norm{i}_beta"), eps=self.eps, axis=-1)

    def _mlp(self, g: Graph, h: Value, mlp_ins: tuple) -> Value:
        if self.mlp is MlpKind.SWIGLU:
            gu, wd = mlp_ins
            return g.matmul(FusedSwiGLU(True).decompose(g, (g.matmul(h, gu),)), wd)
        up, down = self._mlp_ops()
        n = len(mlp_ins) // 2
        return down.decompose(g, (up.decompose(g, (h,) + mlp_ins[:n]),) + mlp_ins[n:])

    def decompose(self, g: Graph, ins: Sequence[Value]) -> Value:
        attn_ins, r, mlp_ins = self._split(ins)
        x = r["x"]
        if self.style is LayerStyle.POST_NORM:
            h = self._norm(g, g.add(x, self.attn.decompose(g, (x,) + attn_ins)), r, 1)
            return self._norm(g, g.add(h, self._mlp(g, h, mlp_ins)), r, 2)
        h = g.add(x, self.attn.decompose(g, (self._norm(g, x, r, 1),) + attn_ins))
        return g.add(h, self._mlp(g, self._norm(g, h, r, 2), mlp_ins))

    def param_init_hint(self, position: int) -> str | None:
        return "one" if self.input_roles()[position].endswith("_gamma") else None
