"""Fused kinds built from a few ops: matmul + bias + activation, SwiGLU, residual add + norm
(optionally exposing the sum), per-head reshape + RMSNorm, and conv + bias + activation.

Each decomposes into the builder's simpler ops; the direct NumPy references here must agree
with those decompositions (tests check both)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ..op import Op, Value, require, same_dtype
from ..shapes import Dim, Shape, broadcast_dims
from .conv import Conv2d
from .elementwise import Unary, UnaryFn
from .linalg import MatMul
from .norm import LayerNorm, RmsNorm
from .shape import concrete_dims, resolve_reshape

if TYPE_CHECKING:
    from ..graph import Graph

__all__ = [
    "FusedOp", "FusedMatMulBiasAct", "FusedSwiGLU", "FusedResidualLN", "FusedResidualRmsNorm",
    "FusedRmsNormReshape", "FusedConvBiasAct", "leading_broadcast_axes",
]


@dataclass(frozen=True)
class FusedOp(Op):
    """Base of fused kinds whose inputs depend on their attributes (optional bias, gamma, ...).

    `input_roles()` names each input in order; arity follows from it. Fusion passes and
    exporters read the roles instead of counting positions."""

    arity = None
    composite = True
    fused = True

    def input_roles(self) -> tuple[str, ...]:
        raise NotImplementedError(f"{type(self).__name__}.input_roles")

    @property
    def n_inputs(self) -> int:
        return len(self.input_roles())

    def check_arity(self, n: int) -> None:
        roles = self.input_roles()
        require(n == len(roles), f"{self.kind} takes {len(roles)} inputs ({', '.join(roles)}), "
                                 f"got {n}")

    def named(self, ins: Sequence) -> dict:
        """Inputs (shapes, arrays or values) keyed by role; absent optional roles are missing."""
        self.check_arity(len(ins))
        return dict(zip(self.input_roles(), ins))


def _act_infer(act: UnaryFn | None, s: Shape) -> Shape:
    return s if act is None else Unary(act).infer((s,))


def _act_ref(act: UnaryFn | None, y: np.ndarray) -> np.ndarray:
    return y if act is None else Unary(act).reference(y)


def _check_vector(kind: str, role: str, v: Shape, dim: Dim, dtype) -> None:
    """A per-feature vector (bias, gamma, beta): rank <= 1 and broadcastable onto `dim`."""
    require(v.dtype == dtype, f"{kind} {role} must be {dtype}, got {v}")
    require(v.rank <= 1, f"{kind} {role} must have rank <= 1, got {v}")
    require(v.rank == 0 or v.dims[0] in (dim, 1), f"{kind} {role} {v} does not match the "
                                                 f"feature dim {dim}")


# -- matmul + bias + activation ------------------------------------------------------------------
@dataclass(frozen=True)
class FusedMatMulBiasAct(FusedOp):
    """`act(x @ w + b)`: inputs (x, w[, b]); `b` has rank <= 1. Any UnaryFn is accepted here;
    which activations a kernel fuses is the target's choice."""

    kind = "fused_matmul_bias_act"
    act: UnaryFn | None = None
    has_bias: bool = True

    def input_roles(self) -> tuple[str, ...]:
        return ("x", "w", "b") if self.has_bias else ("x", "w")

    def infer(self, ins):
        r = self.named(ins)
        y = MatMul().infer((r["x"], r["w"]))
        if self.has_bias:
            b = r["b"]
            require(b.rank <= 1, f"{self.kind} bias must have rank <= 1, got {b}")
            require(b.dtype == y.dtype, f"{self.kind} bias must be {y.dtype}, got {b}")
            require(broadcast_dims(y.dims, b.dims) == y.dims,
                    f"{self.kind} bias {b} does not broadcast onto the product {y}")
        return _act_infer(self.act, y)

    def reference(self, x, w, b=None):
        y = MatMul().reference(x, w)  # 16-bit floats: f32 accumulation, rounded to the dtype
        if b is not None:
            y = (y + b).astype(y.dtype, copy=False)
        return _act_ref(self.act, y)

    def decompose(self, g: Graph, ins: Sequence[Value]) -> Value:
        r = self.named(ins)
        y = g.matmul(r["x"], r["w"])
        if self.has_bias:
            y = g.add(y, r["b"])
        return y if self.act is None else g.activation(y, self.act)


# -- SwiGLU -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FusedSwiGLU(FusedOp):
    """`act(gate) * up` from one input h [..., 2N] holding both halves: the gate is the first
    half when `gate_first`, else the second. Output [..., N]. `act` is SiLU (SwiGLU) by default;
    GeGLU uses gelu / gelu_approx: any gated MLP is this kind."""

    kind = "fused_swiglu"
    gate_first: bool = True
    act: UnaryFn = UnaryFn.SILU

    def input_roles(self) -> tuple[str, ...]:
        return ("h",)

    def _half(self, h: Shape) -> int:
        require(h.rank >= 1, f"{self.kind} input must have rank >= 1, got {h}")
        d = h.dims[-1]
        require(isinstance(d, int), f"{self.kind} last dim must be static, got {h}")
        require(d % 2 == 0, f"{self.kind} last dim {d} must be even (gate and up halves)")
        return d // 2

    def infer(self, ins):
        (h,) = self.named(ins).values()
        require(h.dtype.is_float, f"{self.kind} needs a float input, got {h}")
        return h.with_dims(h.dims[:-1] + (self._half(h),))

    def reference(self, h):
        n = h.shape[-1] // 2
        a, b = h[..., :n], h[..., n:]
        gate, up = (a, b) if self.gate_first else (b, a)
        return (Unary(self.act).reference(gate) * up).astype(h.dtype, copy=False)

    def decompose(self, g: Graph, ins: Sequence[Value]) -> Value:
        (h,) = ins
        n = self._half(g.shape_of(h))
        first, second = g.narrow(h, -1, 0, n), g.narrow(h, -1, n, n)
        gate, up = (first, second) if self.gate_first else (second, first)
        return g.mul(g.activation(gate, self.act), up)


# -- residual add + norm ------------------------------------------------------------------------
def norm_op(rms: bool, eps: float, axis: int, has_gamma: bool, has_beta: bool) -> Op:
    """The RmsNorm (rms) or LayerNorm op a fused norm kind applies."""
    return (RmsNorm if rms else LayerNorm)(eps, axis, has_gamma, has_beta)


def leading_broadcast_axes(full: Sequence[Dim], res: Sequence[Dim]) -> int | None:
    """How many leading axes of `full` a residual with dims `res` repeats over: 0 for equal
    dims, k when `res` (left-padded with 1s) is 1 on the first k axes of `full` and equal to it
    on the rest ([1, S, D] or [S, D] against [B, S, D]: 1), None for any other broadcast
    ([B, 1, D], [B, S, 1], or a residual larger than `full`)."""
    if len(res) > len(full):
        return None
    padded = (1,) * (len(full) - len(res)) + tuple(res)
    k = len(full)
    while k > 0 and padded[k - 1] == full[k - 1]:
        k -= 1
    return k if all(d == 1 for d in padded[:k]) else None


@dataclass(frozen=True)
class _ResidualNorm(FusedOp):
    """Shared body of FusedResidualLN and FusedResidualRmsNorm. `x` carries the sum's full
    shape; `residual` broadcasts onto it (ViT's [1, S, D] position embeddings against the
    [B, S, D] patch embeddings), so the exposed sum always has x's shape."""

    rms: ClassVar[bool] = False
    eps: float = 1e-5
    axis: int = -1
    has_gamma: bool = True
    has_beta: bool = True
    expose_sum: bool = False

    def input_roles(self) -> tuple[str, ...]:
        return ("x", "residual") + ("gamma",) * self.has_gamma + ("beta",) * self.has_beta

    @property
    def norm(self) -> Op:
        return norm_op(self.rms, self.eps, self.axis, self.has_gamma, self.has_beta)

    def infer(self, ins):
        self.check_arity(len(ins))
        x, res, *affine = ins
        same_dtype(self, (x, res))
        s = x.with_dims(broadcast_dims(x.dims, res.dims))
        require(s.dims == x.dims, f"{self.kind} residual {res} would enlarge x {x}: x must "
                                  f"carry the sum's full shape (swap the operands)")
        y = self.norm.infer((s, *affine))
        return (y, s) if self.expose_sum else y

    def reference(self, x, residual, *affine):
        s = (x + residual).astype(x.dtype, copy=False)
        y = self.norm.reference(s, *affine)
        return (y, s) if self.expose_sum else y

    def decompose(self, g: Graph, ins: Sequence[Value]) -> Value | tuple[Value, Value]:
        r = self.named(ins)
        s = g.add(r["x"], r["residual"])
        norm = g.rms_norm if self.rms else g.layer_norm
        y = norm(s, r.get("gamma"), r.get("beta"), eps=self.eps, axis=self.axis)
        return (y, s) if self.expose_sum else y

    def param_init_hint(self, position: int) -> str | None:
        return "one" if self.input_roles()[position] == "gamma" else None


@dataclass(frozen=True)
class FusedResidualLN(_ResidualNorm):
    """`LayerNorm(x + residual)` over `axis`: inputs (x, residual[, gamma][, beta]); residual
    broadcasts onto x. With `expose_sum` a second output is the sum itself (pre-norm
    transformers reuse it)."""

    kind = "fused_residual_ln"


@dataclass(frozen=True)
class FusedResidualRmsNorm(_ResidualNorm):
    """`RMSNorm(x + residual)` over `axis`: inputs (x, residual[, gamma][, beta]); residual
    broadcasts onto x. With `expose_sum` a second output is the sum itself (pre-norm
    transformers reuse it)."""

    kind = "fused_residual_rms_norm"
    rms: ClassVar[bool] = True
    eps: float = 1e-6


# -- reshape + RMSNorm (per-head QK-norm) -------------------------------------------------------
@dataclass(frozen=True)
class FusedRmsNormReshape(FusedOp):
    """`rms_norm(reshape(x, dims))` over the new last axis: the per-head QK-norm pattern.

    Typical use: x [B, S, H*D], dims (B, S, H, D), gamma [D] -> [B, S, H, D] with each head's
    D values normalized on their own. Inputs (x[, gamma][, beta]). `dims` is the reshape target
    as the Reshape op stores it (may hold symbols and one -1)."""

    kind = "fused_rms_norm_reshape"
    needs_symbols: ClassVar[bool] = True
    eps: float
    has_gamma: bool
    has_beta: bool
    dims: tuple[Dim, ...]

    def input_roles(self) -> tuple[str, ...]:
        return ("x",) + ("gamma",) * self.has_gamma + ("beta",) * self.has_beta

    @property
    def norm(self) -> Op:
        return norm_op(True, self.eps, -1, self.has_gamma, self.has_beta)

    def infer(self, ins):
        self.check_arity(len(ins))
        x, *affine = ins
        require(self.dims, f"{self.kind} needs reshape dims")
        y = x.with_dims(resolve_reshape(x.dims, self.dims))
        return self.norm.infer((y, *affine))

    def reference(self, x, *affine, symbols: Mapping[str, int] | None = None):
        y = np.reshape(x, concrete_dims(self.kind, self.dims, symbols, x.size))
        return self.norm.reference(y, *affine)

    def decompose(self, g: Graph, ins: Sequence[Value]) -> Value:
        r = self.named(ins)
        y = g.reshape(r["x"], self.dims)
        return g.rms_norm(y, r.get("gamma"), r.get("beta"), eps=self.eps, axis=-1)

    def param_init_hint(self, position: int) -> str | None:
        return "one" if self.input_roles()[position] == "gamma" else None


# -- conv + bias + activation -------------------------------------------------------------------
@dataclass(frozen=True)
class FusedConvBiasAct(FusedOp):
    """`act(conv2d(x, w, b) + r)`, NCHW, attributes as `Conv2d`: inputs (x, w, b), and with
    `residual` the residual r (a ResNet block's shortcut: the conv's output shape and dtype),
    added before the activation."""

    kind = "fused_conv_bias_act"
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    act: UnaryFn | None = None
    residual: bool = False

    @property
    def conv(self) -> Conv2d:
        return Conv2d(self.stride, self.padding, self.dilation, self.groups, True)

    def input_roles(self) -> tuple[str, ...]:
        return ("x", "w", "b", "residual") if self.residual else ("x", "w", "b")

    def infer(self, ins):
        self.check_arity(len(ins))
        y = self.conv.infer(tuple(ins[:3]))
        if self.residual:
            r = ins[3]
            require(r.dtype == y.dtype and tuple(r.dims) == tuple(y.dims),
                    f"{self.kind} residual {r} must be the conv's output type {y}")
        return _act_infer(self.act, y)

    def reference(self, x, w, b, *residual):
        y = self.conv.reference(x, w, b)
        return _act_ref(self.act, y + residual[0] if residual else y)

    def decompose(self, g: Graph, ins: Sequence[Value]) -> Value:
        x, w, b = ins[:3]
        y = g.conv2d(x, w, b, self.stride, self.padding, self.dilation, self.groups)
        if self.residual:
            y = g.add(y, ins[3])
        return y if self.act is None else g.activation(y, self.act)
