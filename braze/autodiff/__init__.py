"""Automatic differentiation on braze graphs: VJP / JVP rules registered against op classes
(`registry`, `rules/`), reverse mode (`grad_with_loss`), forward mode (`jvp`), and the higher-order
forms built on them (`hvp`, `nth_order_grad`). Results are ordinary braze graphs."""
from .registry import (
    differentiability,
    get_jvp,
    get_vjp,
    jvp_rule,
    non_differentiable,
    unbroadcast,
    vjp_rule,
)

__all__ = ["vjp_rule", "jvp_rule", "non_differentiable", "get_vjp", "get_jvp",
           "differentiability", "unbroadcast"]
