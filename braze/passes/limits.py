"""`FusionLimits`: per-backend caps on fused regions (steps, inputs), and a context manager that
overrides them for a block of code."""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import PassError


@dataclass(frozen=True)
class FusionLimits:
    """Caps on one fused region. None means unbounded (CPU)."""

    max_steps: int | None = None
    max_inputs: int | None = None

    def __post_init__(self):
        for name in ("max_steps", "max_inputs"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise PassError(f"FusionLimits {name} must be a whole number >= 1 or None "
                                f"(unbounded), got {v!r}")

    def allows(self, steps: int, inputs: int) -> bool:
        return (self.max_steps is None or steps <= self.max_steps) and (
            self.max_inputs is None or inputs <= self.max_inputs)


_ACTIVE: contextvars.ContextVar[FusionLimits | None] = contextvars.ContextVar(
    "braze_fusion_limits", default=None)


def active_fusion_limits(default: FusionLimits) -> FusionLimits:
    """The limits set by an enclosing `with_fusion_limits`, else `default` (the target's)."""
    override = _ACTIVE.get()
    return override if override is not None else default


@contextlib.contextmanager
def with_fusion_limits(limits: FusionLimits | None = None, *, max_steps: int | None = None,
                       max_inputs: int | None = None) -> Iterator[FusionLimits]:
    """Override region limits inside the block: `with with_fusion_limits(max_steps=8): ...`."""
    lim = limits or FusionLimits(max_steps, max_inputs)
    token = _ACTIVE.set(lim)
    try:
        yield lim
    finally:
        _ACTIVE.reset(token)
