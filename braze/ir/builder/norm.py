"""Builder methods for layer_norm, rms_norm, group_norm and batch_norm. Optional gamma / beta
become inputs after x (gamma first); the op records which are present. Axes are stored
non-negative."""
from __future__ import annotations

from ..op import Value
from ..ops.norm import BatchNorm, GroupNorm, LayerNorm, RmsNorm
from .shape import axis_for

__all__ = ["NormBuilder"]


def _affine(x: Value, gamma: Value | None, beta: Value | None) -> tuple[Value, ...]:
    return (x,) + tuple(v for v in (gamma, beta) if v is not None)


class NormBuilder:
    def layer_norm(self, x: Value, gamma: Value | None = None, beta: Value | None = None,
                   eps: float = 1e-5, axis: int = -1) -> Value:
        """Normalize over axes `axis..rank-1`; gamma / beta have those trailing dims."""
        ax = axis_for("layer_norm", axis, self.shape_of(x).rank)
        op = LayerNorm(float(eps), ax, gamma is not None, beta is not None)
        return self.add_node(op, _affine(x, gamma, beta))[0]

    def rms_norm(self, x: Value, gamma: Value | None = None, beta: Value | None = None,
                 eps: float = 1e-6, axis: int = -1) -> Value:
        """`x / sqrt(mean(x^2) + eps) * gamma (+ beta)` over axes `axis..rank-1`."""
        ax = axis_for("rms_norm", axis, self.shape_of(x).rank)
        op = RmsNorm(float(eps), ax, gamma is not None, beta is not None)
        return self.add_node(op, _affine(x, gamma, beta))[0]

    def group_norm(self, x: Value, num_groups: int, gamma: Value | None = None,
                   beta: Value | None = None, eps: float = 1e-5) -> Value:
        """Group norm of x `[N, C, *spatial]` with `num_groups` groups; gamma / beta `[C]`."""
        op = GroupNorm(int(num_groups), float(eps), gamma is not None, beta is not None)
        return self.add_node(op, _affine(x, gamma, beta))[0]

    def batch_norm(self, x: Value, gamma: Value, beta: Value, mean: Value, var: Value,
                   eps: float = 1e-5) -> Value:
        """Inference batch norm over channel axis 1 with running `mean` / `var` (all `[C]`)."""
        return self.add_node(BatchNorm(float(eps)), (x, gamma, beta, mean, var))[0]
