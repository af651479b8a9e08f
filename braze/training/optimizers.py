"""Optimizers for compiled training: SGD (momentum, dampening, Nesterov, weight decay), Adam
(bias-corrected, L2 weight decay) and AdamW (Adam with decoupled weight decay), with PyTorch's
`torch.optim` update rules.

An optimizer is a small frozen config. `init(weights)` makes its state for one flat weight
array (momentum / moment buffers of the same size); `apply(weights, grads, state, lr=None)`
updates the weights in place with whole-array NumPy ops and preallocated scratch, so one call
updates every param of a weight region and no array is reallocated. `lr` overrides the
config's learning rate for this one update (a learning-rate schedule passes it)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import BrazeError

__all__ = ["Optimizer", "SGD", "Adam", "AdamW"]


class Optimizer:
    """Base class: `init(weights) -> state`, `apply(weights, grads, state, lr=None)` in place;
    `lr` is the config's base learning rate."""

    lr: float

    def init(self, weights: np.ndarray) -> dict:
        raise NotImplementedError

    def apply(self, weights: np.ndarray, grads: np.ndarray, state: dict,
              lr: float | None = None) -> None:
        raise NotImplementedError


def _check_nonnegative(owner: str, **values: float) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise BrazeError(f"{owner}: {name} must be a number >= 0, got {v!r}")
        if not v >= 0.0:
            raise BrazeError(f"{owner}: {name} must be >= 0, got {v}")


@dataclass(frozen=True)
class SGD(Optimizer):
    """p -= lr * d, where d = g + weight_decay * p, then with momentum
    b = momentum * b + (1 - dampening) * d (b = d on the first step) and d = b
    (or d + momentum * b when `nesterov`)."""

    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _check_nonnegative("SGD", lr=self.lr, momentum=self.momentum,
                           weight_decay=self.weight_decay)
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise BrazeError("SGD: nesterov needs momentum > 0 and dampening 0")

    def init(self, weights: np.ndarray) -> dict:
        state = {"step": 0, "scratch": np.empty_like(weights)}
        if self.momentum:
            state["buf"] = np.zeros_like(weights)
        return state

    def apply(self, weights: np.ndarray, grads: np.ndarray, state: dict,
              lr: float | None = None) -> None:
        d = state["scratch"]
        np.copyto(d, grads)
        if self.weight_decay:
            d += self.weight_decay * weights
        if self.momentum:
            buf = state["buf"]
            if state["step"] == 0:
                np.copyto(buf, d)
            else:
                buf *= self.momentum
                buf += (1.0 - self.dampening) * d
            if self.nesterov:
                d += self.momentum * buf
            else:
                np.copyto(d, buf)
        d *= self.lr if lr is None else lr
        weights -= d
        state["step"] += 1


@dataclass(frozen=True)
class Adam(Optimizer):
    """Adam with bias correction (torch.optim.Adam, amsgrad off): d = g + weight_decay * p,
    m = b1 m + (1 - b1) d, v = b2 v + (1 - b2) d^2, p -= lr / (1 - b1^t) * m /
    (sqrt(v) / sqrt(1 - b2^t) + eps)."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0

    decoupled_weight_decay = False  # AdamW: decay the weights, not the gradient

    def __post_init__(self) -> None:
        owner = type(self).__name__
        _check_nonnegative(owner, lr=self.lr, eps=self.eps, weight_decay=self.weight_decay)
        if not all(0.0 <= b < 1.0 for b in self.betas) or len(self.betas) != 2:
            raise BrazeError(f"{owner}: betas must be two numbers in [0, 1), got {self.betas}")

    def init(self, weights: np.ndarray) -> dict:
        return {"step": 0, "m": np.zeros_like(weights), "v": np.zeros_like(weights),
                "d": np.empty_like(weights), "scratch": np.empty_like(weights)}

    def apply(self, weights: np.ndarray, grads: np.ndarray, state: dict,
              lr: float | None = None) -> None:
        lr = self.lr if lr is None else lr
        b1, b2 = self.betas
        state["step"] += 1
        t = state["step"]
        m, v, tmp = state["m"], state["v"], state["scratch"]
        d = grads
        if self.weight_decay and self.decoupled_weight_decay:
            weights *= 1.0 - lr * self.weight_decay
        elif self.weight_decay:
            d = state["d"]
            np.multiply(weights, self.weight_decay, out=d)
            d += grads
        m *= b1
        np.multiply(d, 1.0 - b1, out=tmp)
        m += tmp
        v *= b2
        np.multiply(d, d, out=tmp)
        tmp *= 1.0 - b2
        v += tmp
        np.sqrt(v, out=tmp)
        tmp /= math.sqrt(1.0 - b2 ** t)
        tmp += self.eps
        np.divide(m, tmp, out=tmp)
        tmp *= lr / (1.0 - b1 ** t)
        weights -= tmp


@dataclass(frozen=True)
class AdamW(Adam):
    """Adam with decoupled weight decay (torch.optim.AdamW, amsgrad off): first
    p *= 1 - lr * weight_decay, then Adam's update on the plain gradient. torch's defaults
    (weight_decay 0.01)."""

    weight_decay: float = 1e-2

    decoupled_weight_decay = True
