"""Builder methods for the backward ops (closed-form gradients; see ops/backward*.py). Each takes
the output cotangent `dy` first, then the forward inputs the gradient reads, then the forward
op's attributes under the same names as the forward builder."""
from __future__ import annotations

from ..op import Value
from ..ops.backward import (
    ActivationBackward,
    CumsumBackward,
    GatherBackward,
    GroupNormBackwardBeta,
    GroupNormBackwardGamma,
    GroupNormBackwardInput,
    LayerNormBackwardGamma,
    LayerNormBackwardInput,
    ReluBackward,
    RmsNormBackwardBeta,
    RmsNormBackwardGamma,
    RmsNormBackwardInput,
    RopeBackward,
)
from ..ops.backward_attention import AttentionBackward, AttentionBackwardAll, AttentionGrad
from ..ops.backward_conv import Conv2dBackwardInput, Conv2dBackwardWeight, MaxPool2dBackward
from ..ops.elementwise import UnaryFn
from .attention import _mask_kind
from .conv import _padding4, _pair
from .elementwise import _enum
from .shape import axis_for

__all__ = ["BackwardBuilder"]


def _opt(v, cast):
    return None if v is None else cast(v)


class BackwardBuilder:
    # -- activations -----------------------------------------------------------------------------
    def relu_backward(self, dy: Value, x: Value) -> Value:
        """`dy * (x > 0)`."""
        return self.add_node(ReluBackward(), (dy, x))[0]

    def activation_backward(self, dy: Value, x: Value, fn: UnaryFn | str) -> Value:
        """`dy * fn'(x)` for gelu, gelu_approx, silu, sigmoid, tanh, quick_gelu."""
        return self.add_node(ActivationBackward(_enum(UnaryFn, fn)), (dy, x))[0]

    # -- norms -----------------------------------------------------------------------------------
    def layer_norm_backward_input(self, dy: Value, x: Value, gamma: Value | None = None,
                                  eps: float = 1e-5, axis: int = -1) -> Value:
        """d x of `layer_norm(x, gamma, ., eps, axis)`."""
        ax = axis_for("layer_norm_backward_input", axis, self.shape_of(x).rank)
        op = LayerNormBackwardInput(float(eps), ax, gamma is not None)
        return self.add_node(op, (dy, x) if gamma is None else (dy, x, gamma))[0]

    def layer_norm_backward_gamma(self, dy: Value, x: Value, eps: float = 1e-5,
                                  axis: int = -1) -> Value:
        """d gamma of `layer_norm`: `sum(dy * xhat)` over the leading axes."""
        ax = axis_for("layer_norm_backward_gamma", axis, self.shape_of(x).rank)
        return self.add_node(LayerNormBackwardGamma(float(eps), ax), (dy, x))[0]

    def rms_norm_backward_input(self, dy: Value, x: Value, gamma: Value | None = None,
                                eps: float = 1e-6, axis: int = -1) -> Value:
        """d x of `rms_norm(x, gamma, ., eps, axis)`."""
        ax = axis_for("rms_norm_backward_input", axis, self.shape_of(x).rank)
        op = RmsNormBackwardInput(float(eps), ax, gamma is not None)
        return self.add_node(op, (dy, x) if gamma is None else (dy, x, gamma))[0]

    def rms_norm_backward_gamma(self, dy: Value, x: Value, eps: float = 1e-6,
                                axis: int = -1) -> Value:
        """d gamma of `rms_norm`: `sum(dy * x / rms(x))` over the leading axes."""
        ax = axis_for("rms_norm_backward_gamma", axis, self.shape_of(x).rank)
        return self.add_node(RmsNormBackwardGamma(float(eps), ax), (dy, x))[0]

    def rms_norm_backward_beta(self, dy: Value, axis: int = -1) -> Value:
        """d beta of `rms_norm` / `layer_norm`: `sum(dy)` over the leading axes."""
        ax = axis_for("rms_norm_backward_beta", axis, self.shape_of(dy).rank)
        return self.add_node(RmsNormBackwardBeta(ax), (dy,))[0]

    def group_norm_backward_input(self, dy: Value, x: Value, num_groups: int,
                                  gamma: Value | None = None, eps: float = 1e-5) -> Value:
        """d x of `group_norm(x, num_groups, gamma, ., eps)`."""
        op = GroupNormBackwardInput(int(num_groups), float(eps), gamma is not None)
        return self.add_node(op, (dy, x) if gamma is None else (dy, x, gamma))[0]

    def group_norm_backward_gamma(self, dy: Value, x: Value, num_groups: int,
                                  eps: float = 1e-5) -> Value:
        """d gamma [C] of `group_norm`."""
        return self.add_node(GroupNormBackwardGamma(int(num_groups), float(eps)), (dy, x))[0]

    def group_norm_backward_beta(self, dy: Value, num_groups: int) -> Value:
        """d beta [C] of `group_norm`: `sum(dy)` over N and the spatial axes."""
        return self.add_node(GroupNormBackwardBeta(int(num_groups)), (dy,))[0]

    # -- rope, cumsum, gather --------------------------------------------------------------------
    def rope_backward(self, dy: Value, cos: Value, sin: Value, interleaved: bool = False,
                      n_rot: int | None = None) -> Value:
        """d x of `rope(x, cos, sin, interleaved, n_rot)`: the inverse rotation of dy."""
        op = RopeBackward(bool(interleaved), _opt(n_rot, int))
        return self.add_node(op, (dy, cos, sin))[0]

    def cumsum_backward(self, dy: Value, axis: int, exclusive: bool = False,
                        reverse: bool = False) -> Value:
        """d x of `cumsum(x, axis, exclusive, reverse)`."""
        ax = axis_for("cumsum_backward", axis, self.shape_of(dy).rank)
        return self.add_node(CumsumBackward(ax, bool(exclusive), bool(reverse)), (dy,))[0]

    def gather_backward(self, dy: Value, indices: Value, axis: int, size: int) -> Value:
        """d table of `gather(table, indices, axis)` where the table's `axis` has `size`
        entries: dy scatter-added by index. `axis` is the table's (non-negative) axis."""
        return self.add_node(GatherBackward(int(axis), int(size)), (dy, indices))[0]

    # -- conv and pool ---------------------------------------------------------------------------
    def conv2d_backward_input(self, dy: Value, w: Value, input_hw: tuple[int, int], stride=1,
                              padding=0, dilation=1, groups: int = 1) -> Value:
        """d x of `conv2d(x, w, ., stride, padding, dilation, groups)`, x spatial `input_hw`."""
        op = Conv2dBackwardInput(_pair(stride, "stride"), _padding4(padding),
                                 _pair(dilation, "dilation"), int(groups),
                                 tuple(int(d) for d in input_hw))
        return self.add_node(op, (dy, w))[0]

    def conv2d_backward_weight(self, dy: Value, x: Value, kernel, stride=1, padding=0,
                               dilation=1, groups: int = 1) -> Value:
        """d w of `conv2d(x, w, ...)` for a `kernel` (kh, kw) weight."""
        op = Conv2dBackwardWeight(_pair(stride, "stride"), _padding4(padding),
                                  _pair(dilation, "dilation"), int(groups),
                                  _pair(kernel, "kernel"))
        return self.add_node(op, (dy, x))[0]

    def maxpool2d_backward(self, dy: Value, x: Value, kernel, stride=None, padding=0) -> Value:
        """d x of `max_pool2d(x, kernel, stride, padding)` (stride defaults to the kernel)."""
        k = _pair(kernel, "kernel")
        op = MaxPool2dBackward(k, k if stride is None else _pair(stride, "stride"),
                               _padding4(padding))
        return self.add_node(op, (dy, x))[0]

    # -- attention -------------------------------------------------------------------------------
    def _attention_backward_op(self, cls, mask, kind, window, scale, softcap, **extra):
        mk = _mask_kind(kind) if kind is not None else (
            _mask_kind("custom") if mask is not None else _mask_kind("none"))
        return cls(mask=mk, window=int(window), scale=_opt(scale, float),
                   softcap=_opt(softcap, float), **extra)

    def attention_backward(self, dy: Value, q: Value, k: Value, v: Value,
                           mask: Value | None = None, *, wrt: AttentionGrad | str = "q",
                           kind=None, window: int = 0, scale: float | None = None,
                           softcap: float | None = None) -> Value:
        """One cotangent (`wrt` = "q", "k", "v" or "mask") of `attention(q, k, v, mask, ...)`;
        the keyword attributes are the forward call's."""
        op = self._attention_backward_op(AttentionBackward, mask, kind, window, scale, softcap,
                                         wrt=_enum(AttentionGrad, wrt))
        return self.add_node(op, (dy, q, k, v) if mask is None else (dy, q, k, v, mask))[0]

    def attention_backward_all(self, dy: Value, q: Value, k: Value, v: Value,
                               mask: Value | None = None, *, kind=None, window: int = 0,
                               scale: float | None = None, softcap: float | None = None
                               ) -> tuple[Value, Value, Value]:
        """(d q, d k, d v) of `attention(q, k, v, mask, ...)` in one op."""
        op = self._attention_backward_op(AttentionBackwardAll, mask, kind, window, scale,
                                         softcap)
        return tuple(self.add_node(op, (dy, q, k, v) if mask is None else
                                   (dy, q, k, v, mask)))
