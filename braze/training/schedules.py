"""Learning-rate schedules for compiled training: a schedule is a small frozen config whose
`factor(step)` multiplies the optimizer's base learning rate at (0-based) step `step`, as
`torch.optim.lr_scheduler.LambdaLR` does with one `scheduler.step()` after each optimizer step.

`StepDecay` is torch's `StepLR`; `WarmupCosine` (with `warmup_steps=0`, torch's
`CosineAnnealingLR`) and `WarmupLinear` are Hugging Face's `get_cosine_schedule_with_warmup`
and `get_linear_schedule_with_warmup`, with an optional floor `min_factor`."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import BrazeError

__all__ = ["LRSchedule", "StepDecay", "WarmupCosine", "WarmupLinear"]


class LRSchedule:
    """Base class: `factor(step) -> float`, the multiplier of the base lr at step `step`."""

    def factor(self, step: int) -> float:
        raise NotImplementedError

    def lr(self, base_lr: float, step: int) -> float:
        """The learning rate at `step` for an optimizer whose base rate is `base_lr`."""
        return base_lr * self.factor(step)


def _check_steps(owner: str, **values: int) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise BrazeError(f"{owner}: {name} must be an int >= 0, got {v!r}")


@dataclass(frozen=True)
class StepDecay(LRSchedule):
    """gamma ** (step // step_size): torch.optim.lr_scheduler.StepLR."""

    step_size: int
    gamma: float = 0.1

    def __post_init__(self) -> None:
        _check_steps("StepDecay", step_size=self.step_size)
        if self.step_size < 1 or not self.gamma >= 0:
            raise BrazeError(f"StepDecay: needs step_size >= 1 and gamma >= 0, got "
                             f"{self.step_size}, {self.gamma}")

    def factor(self, step: int) -> float:
        return self.gamma ** (step // self.step_size)


@dataclass(frozen=True)
class _WarmupDecay(LRSchedule):
    """Linear warmup from 0 over `warmup_steps`, then a decay from 1 to `min_factor` at
    `total_steps` (and `min_factor` after it) whose shape `decay(progress)` gives (1 at
    progress 0, 0 at progress 1)."""

    total_steps: int
    warmup_steps: int = 0
    min_factor: float = 0.0

    def __post_init__(self) -> None:
        owner = type(self).__name__
        _check_steps(owner, total_steps=self.total_steps, warmup_steps=self.warmup_steps)
        if self.warmup_steps > self.total_steps or not 0.0 <= self.min_factor <= 1.0:
            raise BrazeError(f"{owner}: needs warmup_steps <= total_steps and min_factor in "
                             f"[0, 1], got {self.warmup_steps}, {self.total_steps}, "
                             f"{self.min_factor}")

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps)
                       / max(1, self.total_steps - self.warmup_steps))
        return self.min_factor + (1.0 - self.min_factor) * self.decay(progress)

    def decay(self, progress: float) -> float:
        raise NotImplementedError


@dataclass(frozen=True)
class WarmupCosine(_WarmupDecay):
    """Linear warmup from 0 over `warmup_steps`, then a half cosine from 1 down to `min_factor`
    at `total_steps` (and `min_factor` after it)."""

    def decay(self, progress: float) -> float:
        return 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class WarmupLinear(_WarmupDecay):
    """Linear warmup from 0 over `warmup_steps`, then linear decay from 1 to `min_factor` at
    `total_steps` (and `min_factor` after it)."""

    def decay(self, progress: float) -> float:
        return 1.0 - progress
