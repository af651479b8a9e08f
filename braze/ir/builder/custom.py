"""Builder method for custom functions: `custom_fn(inputs, fwd_body, vjp_body, jvp_body)`, a
function given as a body graph with optional derivative overrides (JAX custom_vjp /
custom_jvp; the body conventions are in braze/ir/ops/custom.py)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..op import Value
from ..ops.custom import CustomFn

if TYPE_CHECKING:
    from ..graph import Graph

__all__ = ["CustomBuilder"]


class CustomBuilder:
    def custom_fn(self, inputs: Sequence[Value] | Value, fwd_body: Graph,
                  vjp_body: Graph | None = None, jvp_body: Graph | None = None
                  ) -> Value | tuple[Value, ...]:
        """`fwd_body(*inputs)` as one op whose gradients come from the overrides:
        `vjp_body(*inputs, *outputs, *cotangents) -> one cotangent per input` and
        `jvp_body(*inputs, *tangents) -> one tangent per output`. Returns the output value, or a
        tuple of them when `fwd_body` has several outputs. Bodies read only their inputs and
        constants."""
        ins = (inputs,) if isinstance(inputs, Value) else tuple(inputs)
        outs = self.add_node(CustomFn(fwd_body, vjp_body, jvp_body), ins)
        return outs[0] if len(outs) == 1 else outs
