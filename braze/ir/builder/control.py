"""Builder methods for control flow, shaped like JAX's `lax.cond` and `lax.while_loop`: the
bodies are braze Graphs whose inputs are the operands (or loop-carried values), in order."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import GraphError
from ..op import Value
from ..ops.control import If, While

if TYPE_CHECKING:
    from ..graph import Graph

__all__ = ["ControlFlowBuilder"]


def _result(vals: tuple[Value, ...]) -> Value | tuple[Value, ...]:
    return vals[0] if len(vals) == 1 else vals


def _check_graph(g, what: str) -> None:
    from ..graph_core import GraphCore

    if not isinstance(g, GraphCore):
        raise GraphError(f"{what} must be a bz.Graph, got {type(g).__name__}")


class ControlFlowBuilder:
    def cond(self, pred: Value, then_graph: Graph, else_graph: Graph, *operands: Value
             ) -> Value | tuple[Value, ...]:
        """`then_graph(*operands)` if `pred` (a bool scalar) else `else_graph(*operands)`.
        Both graphs take the operands' types in order and return the same types. Returns the
        output value, or a tuple when the branches return several."""
        _check_graph(then_graph, "then_graph")
        _check_graph(else_graph, "else_graph")
        ins = (self._coerce(pred), *(self._coerce(x) for x in operands))
        return _result(self.add_node(If(then_graph, else_graph), ins))

    def while_loop(self, cond_graph: Graph, body_graph: Graph, *carried: Value,
                   max_iterations: int | None = None) -> Value | tuple[Value, ...]:
        """Run `carried = body_graph(*carried)` while `cond_graph(*carried)` (a bool scalar)
        holds; returns the final carried value(s). `max_iterations` is a static bound on the
        body runs: lowering unrolls that many steps, and running past it is an error. Without
        it the loop interprets but cannot be lowered."""
        _check_graph(cond_graph, "cond_graph")
        _check_graph(body_graph, "body_graph")
        if not carried:
            raise GraphError("while_loop needs at least one carried value")
        ins = tuple(self._coerce(x) for x in carried)
        return _result(self.add_node(While(cond_graph, body_graph, max_iterations), ins))
