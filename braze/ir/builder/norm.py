"""Builder methods for layer_norm (and RLX's short name `ln`), layer_norm2d, rms_norm,
group_norm and batch_norm. Optional gamma / beta become inputs after x (gamma first); the op
records which are present. Axes are stored non-negative."""
from __future__ import annotations

from ...errors import GraphError, ShapeError
from ..op import Value
from ..ops.norm import BatchNorm, GroupNorm, LayerNorm, RmsNorm
from .rlx_args import check_shape
from .shape import axis_for

__all__ = ["NormBuilder"]


def _affine(x: Value, gamma: Value | None, beta: Value | None) -> tuple[Value, ...]:
    return (x,) + tuple(v for v in (gamma, beta) if v is not None)


class _Required:
    def __repr__(self) -> str:
        return "<required>"


_REQUIRED: Value | None = _Required()  # type: ignore[assignment]


class NormBuilder:
    def layer_norm(self, x: Value, gamma: Value | None = None, beta: Value | None = None,
                   eps: float = 1e-5, axis: int = -1, shape=None) -> Value:
        """Normalize over axes `axis..rank-1`; gamma / beta have those trailing dims. RLX's
        order `layer_norm(x, gamma, beta, axis, eps, shape)` works too (an int where eps goes
        and a float where axis goes); `shape` is checked against the inferred type."""
        if isinstance(eps, int) and not isinstance(eps, bool) and isinstance(axis, float):
            eps, axis = axis, eps
        ax = axis_for("layer_norm", axis, self.shape_of(x).rank)
        op = LayerNorm(float(eps), ax, gamma is not None, beta is not None)
        out = self.add_node(op, _affine(x, gamma, beta))[0]
        check_shape("layer_norm", self.shape_of(out), shape)
        return out

    def ln(self, x: Value, gamma: Value | None = _REQUIRED, beta: Value | None = _REQUIRED,
           eps: float = 1e-5) -> Value:
        """LayerNorm over the trailing axis, RLX's `ln(x, gamma, beta, eps)`. gamma and beta are
        required as in RLX (pass None explicitly to leave one out). The natural logarithm is
        `log`."""
        if gamma is _REQUIRED or beta is _REQUIRED:
            raise GraphError("ln(x, gamma, beta, eps=1e-5) is LayerNorm, as in RLX, and needs "
                             "gamma and beta (None to leave one out); for the natural logarithm "
                             "use g.log(x)")
        return self.layer_norm(x, gamma, beta, eps)

    def layer_norm2d(self, x: Value, gamma: Value | None = None, beta: Value | None = None,
                     eps: float = 1e-5) -> Value:
        """LayerNorm across the channels of x `[N, C, *spatial]` at each position (ConvNeXt,
        SAM); gamma / beta `[C]`. Built as channels-last transpose, `layer_norm`, transpose
        back, so norm fusions and kernels see an ordinary trailing-axis LayerNorm."""
        rank = self.shape_of(x).rank
        if rank < 3:
            raise ShapeError(f"layer_norm2d needs x [N, C, *spatial] of rank >= 3, got "
                             f"{self.shape_of(x)}")
        to_last = (0, *range(2, rank), 1)
        back = (0, rank - 1, *range(1, rank - 1))
        y = self.layer_norm(self.transpose(x, to_last), gamma, beta, eps)
        return self.transpose(y, back)

    def rms_norm(self, x: Value, gamma: Value | None = None, beta: Value | None = None,
                 eps: float = 1e-6, axis: int = -1) -> Value:
        """`x / sqrt(mean(x^2) + eps) * gamma (+ beta)` over axes `axis..rank-1`."""
        ax = axis_for("rms_norm", axis, self.shape_of(x).rank)
        op = RmsNorm(float(eps), ax, gamma is not None, beta is not None)
        return self.add_node(op, _affine(x, gamma, beta))[0]

    def group_norm(self, x: Value, num_groups: int, gamma: Value | None = None,
                   beta: Value | None = None, eps: float = 1e-5) -> Value:
        """Group norm of x `[N, C, *spatial]` with `num_groups` groups; gamma / beta `[C]`.
        RLX's argument order `group_norm(x, gamma, beta, num_groups, eps)` is accepted too (told
        apart by gamma being a value)."""
        if isinstance(num_groups, Value):  # RLX order: (x, gamma, beta, num_groups, eps)
            num_groups, gamma, beta = beta, num_groups, gamma
            if not isinstance(num_groups, int) or isinstance(num_groups, bool):
                raise GraphError("group_norm(x, gamma, beta, num_groups, eps) (RLX order) needs "
                                 f"an int num_groups, got {num_groups!r}")
        op = GroupNorm(int(num_groups), float(eps), gamma is not None, beta is not None)
        return self.add_node(op, _affine(x, gamma, beta))[0]

    def batch_norm(self, x: Value, gamma: Value, beta: Value, mean: Value, var: Value,
                   eps: float = 1e-5) -> Value:
        """Inference batch norm over channel axis 1 with running `mean` / `var` (all `[C]`)."""
        return self.add_node(BatchNorm(float(eps)), (x, gamma, beta, mean, var))[0]
