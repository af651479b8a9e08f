"""`CustomFn`: a function given as a body graph, with optional derivative overrides (JAX
`custom_vjp` / `custom_jvp`). Its meaning is `fwd_body`; autodiff uses the overrides.

Conventions (n inputs, m outputs):
  fwd_body  -- inputs (x_1..x_n), outputs (y_1..y_m): the value of the function;
  vjp_body  -- inputs (x_1..x_n, y_1..y_m, ct_y_1..ct_y_m), outputs (ct_x_1..ct_x_n): one
               cotangent per input, of that input's type (return zeros for integer inputs);
  jvp_body  -- inputs (x_1..x_n, t_x_1..t_x_n), outputs (t_y_1..t_y_m): the output tangents,
               linear in the t_x (reverse mode transposes it when there is no vjp_body).
Bodies are closed (inputs and constants only). Without overrides the op is inlined before
autodiff, so it differentiates like the plain function."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..equality import ops_equal
from ..op import Op, Value
from ._body import (
    body_in_types,
    body_key,
    body_out_types,
    check_closed,
    check_returns,
    check_takes,
    inline_body,
    run_body,
    single,
)

if TYPE_CHECKING:
    from ..graph import Graph

__all__ = ["CustomFn"]


@dataclass(frozen=True, eq=False)
class CustomFn(Op):
    """`fwd_body(*inputs)`, with an optional `vjp_body` and `jvp_body` (see the module
    docstring for their inputs and outputs)."""

    kind = "custom_fn"
    arity = None
    min_arity = 1
    composite = True
    fwd_body: Graph
    vjp_body: Graph | None = None
    jvp_body: Graph | None = None

    def __post_init__(self):
        check_closed(self.fwd_body, "custom_fn fwd_body")
        for what in ("vjp_body", "jvp_body"):
            body = getattr(self, what)
            if body is not None:
                check_closed(body, f"custom_fn {what}")
                self._check_override(what, body)

    def _check_override(self, what: str, body: Graph) -> None:
        xs, ys = body_in_types(self.fwd_body), body_out_types(self.fwd_body)
        if what == "vjp_body":
            check_takes(body, what, xs + ys + ys, "(primals, outputs, cotangents)")
            check_returns(body, what, xs, "one cotangent per input")
        else:
            check_takes(body, what, xs + xs, "(primals, tangents)")
            check_returns(body, what, ys, "one tangent per output")

    @property
    def has_overrides(self) -> bool:
        return self.vjp_body is not None or self.jvp_body is not None

    def __eq__(self, other) -> bool:
        return isinstance(other, CustomFn) and ops_equal(self, other)

    def __hash__(self) -> int:
        return hash(("custom_fn", body_key(self.fwd_body),
                     None if self.vjp_body is None else body_key(self.vjp_body),
                     None if self.jvp_body is None else body_key(self.jvp_body)))

    def __repr__(self) -> str:
        overrides = [w for w in ("vjp_body", "jvp_body") if getattr(self, w) is not None]
        return f"CustomFn({self.fwd_body.name!r}, overrides={overrides})"

    def infer(self, ins):
        check_takes(self.fwd_body, "custom_fn fwd_body", ins, "the op's inputs")
        return single(body_out_types(self.fwd_body))

    def reference(self, *xs):
        return single(run_body(self.fwd_body, xs))

    def decompose(self, g: Graph, ins: Sequence[Value]) -> Value | tuple[Value, ...]:
        """`fwd_body` inlined (the overrides only matter to autodiff)."""
        return single(inline_body(g, self.fwd_body, ins))
