"""Gradient clipping by global norm, with `torch.nn.utils.clip_grad_norm_`'s semantics: the
norm of all gradients taken together; when it exceeds `max_norm`, every gradient is scaled in
place by max_norm / (norm + 1e-6); the norm before clipping is returned."""
from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from ..errors import BrazeError

__all__ = ["clip_grad_norm", "global_grad_norm"]


def global_grad_norm(grads: Iterable[np.ndarray], norm_type: float = 2.0) -> float:
    """The `norm_type`-norm (a p >= 1, or inf) of all arrays in `grads` as one vector."""
    grads = list(grads)
    if norm_type == math.inf:
        return max((float(np.max(np.abs(a))) for a in grads if a.size), default=0.0)
    if not norm_type >= 1.0:
        raise BrazeError(f"clip_grad_norm: norm_type must be >= 1 or inf, got {norm_type!r}")
    if norm_type == 2.0:
        total = sum(float(np.vdot(a, a).real) for a in grads)
    else:
        total = sum(float(np.sum(np.abs(a, dtype=np.float64) ** norm_type)) for a in grads)
    return total ** (1.0 / norm_type)


def clip_grad_norm(grads: Iterable[np.ndarray], max_norm: float,
                   norm_type: float = 2.0) -> float:
    """Scale the arrays in `grads` in place so their global norm is at most `max_norm`; returns
    the global norm before clipping (as torch.nn.utils.clip_grad_norm_)."""
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or max_norm < 0:
        raise BrazeError(f"clip_grad_norm: max_norm must be a number >= 0, got {max_norm!r}")
    grads = list(grads)
    total = global_grad_norm(grads, norm_type)
    scale = max_norm / (total + 1e-6)
    if scale < 1.0:
        for a in grads:
            a *= scale
    return total
