"""Control flow: `If` (lax.cond) and `While` (lax.while_loop). Their bodies are braze Graphs held
as attributes; a body's inputs are the op's operands (or loop-carried values), in order.

Bodies are closed: whatever a body reads from outside comes in as an operand. A param inside a
body is the body's own weight (its value lives in `body.weights`, which save/load keeps).

The reference runs a body with the reference interpreter: `If` evaluates only the branch `pred`
picks; `While` runs `body` while `cond` holds and fails once the loop wants more than
`max_iterations` body runs. The decomposition (the lowering every backend and the ONNX exporter
use) evaluates both branches and selects with `where`, and unrolls a bounded loop into
`max_iterations` guarded steps (braze/passes/lower/control_flow.py explains it); autodiff
differentiates only what ran (braze/autodiff/control.py)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...errors import GraphError
from ..dtypes import bool_
from ..equality import ops_equal
from ..inline import inline_graph
from ..op import Op, Value, require
from ..shapes import Shape
from ._body import (
    body_key,
    body_out_types,
    check_takes,
    run_body,
    single,
)

if TYPE_CHECKING:
    from ..graph import Graph

__all__ = ["If", "While", "LoopBoundError", "UNBOUNDED_LOOP_FIX"]


class LoopBoundError(RuntimeError):
    """A While's cond still holds after `max_iterations` body runs (the interpreter reports it
    as an InterpretError naming the node)."""


def _is_bool_scalar(s: Shape) -> bool:
    return s.dtype == bool_ and s.rank == 0


def _run_body(g: Graph, what: str, xs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """`run_body`, with a failure inside the body named by the body's role."""
    try:
        return run_body(g, xs)
    except Exception as e:
        raise RuntimeError(f"in {what} {g.name!r}: {e}") from e


UNBOUNDED_LOOP_FIX = (
    "pass max_iterations=N (a static bound on the body runs) to g.while_loop; an ONNX LSTM / "
    "GRU / RNN imported over a symbolic sequence length is such a loop: import it with that "
    "length static (import_onnx(path, input_shapes={name: (..., length, ...)})) and it becomes "
    "a scan")


@dataclass(frozen=True, eq=False)
class If(Op):
    """`then_graph(*operands)` if `pred` else `else_graph(*operands)`; inputs are
    `(pred, *operands)` with `pred` a bool scalar. Both branches take the operands' types, in
    order, and return the same output types."""

    kind = "if"
    arity = None
    min_arity = 1
    composite = True
    then_graph: Graph
    else_graph: Graph

    def __post_init__(self):
        for what, g in (("then_graph", self.then_graph), ("else_graph", self.else_graph)):
            if not g.outputs:
                raise GraphError(f"if: {what} {g.name!r} has no outputs")

    def __eq__(self, other) -> bool:
        return isinstance(other, If) and ops_equal(self, other)

    def __hash__(self) -> int:
        return hash(("if", body_key(self.then_graph), body_key(self.else_graph)))

    def __repr__(self) -> str:
        return f"If(then={self.then_graph.name!r}, else={self.else_graph.name!r})"

    def infer(self, ins):
        require(len(ins) >= 1, "if takes a predicate and the operands")
        pred, operands = ins[0], tuple(ins[1:])
        require(_is_bool_scalar(pred), f"if predicate must be a bool scalar, got {pred}")
        check_takes(self.then_graph, "then_graph", operands, "the operands")
        check_takes(self.else_graph, "else_graph", operands, "the operands")
        then_out, else_out = body_out_types(self.then_graph), body_out_types(self.else_graph)
        require(then_out == else_out, "if branches must return the same types: then_graph "
                f"returns {', '.join(map(str, then_out))}, else_graph returns "
                f"{', '.join(map(str, else_out))}")
        return single(then_out)

    def reference(self, pred, *operands):
        taken = "then_graph" if bool(np.asarray(pred)) else "else_graph"
        return single(_run_body(getattr(self, taken), taken, operands))

    def decompose(self, g: Graph, ins: Sequence[Value]) -> Value | tuple[Value, ...]:
        return self.lower_into(g, ins)

    def lower_into(self, g: Graph, ins: Sequence[Value], **inline_opts
                   ) -> Value | tuple[Value, ...]:
        """Both branches inlined into `g` (`inline_opts` go to `inline_graph`), then
        `where(pred, then_out, else_out)` per output."""
        pred, operands = ins[0], list(ins[1:])
        then_out = inline_graph(g, self.then_graph, operands, **inline_opts)
        else_out = inline_graph(g, self.else_graph, operands, **inline_opts)
        return single([g.where(pred, t, e) for t, e in zip(then_out, else_out)])


@dataclass(frozen=True, eq=False)
class While(Op):
    """Loop-carried values start as the inputs; while `cond_graph(*carried)` (a bool scalar)
    holds, `carried = body_graph(*carried)`. The outputs are the final carried values.

    `max_iterations` bounds the body runs: the reference fails when the loop would run more
    often, and the lowering unrolls exactly that many guarded steps. None means unbounded:
    the interpreter runs it, but it cannot be lowered (pass max_iterations)."""

    kind = "while"
    arity = None
    min_arity = 1
    composite = True
    cond_graph: Graph
    body_graph: Graph
    max_iterations: int | None = None

    def __post_init__(self):
        for what, g in (("cond_graph", self.cond_graph), ("body_graph", self.body_graph)):
            if not g.outputs:
                raise GraphError(f"while: {what} {g.name!r} has no outputs")
        m = self.max_iterations
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 0):
            raise GraphError(f"while: max_iterations must be a non-negative int or None, got "
                             f"{m!r}")

    def __eq__(self, other) -> bool:
        return isinstance(other, While) and ops_equal(self, other)

    def __hash__(self) -> int:
        return hash(("while", body_key(self.cond_graph), body_key(self.body_graph),
                     self.max_iterations))

    def __repr__(self) -> str:
        return (f"While(cond={self.cond_graph.name!r}, body={self.body_graph.name!r}, "
                f"max_iterations={self.max_iterations})")

    def infer(self, ins):
        carried = tuple(ins)
        check_takes(self.cond_graph, "cond_graph", carried, "the carried values")
        check_takes(self.body_graph, "body_graph", carried, "the carried values")
        c = body_out_types(self.cond_graph)
        require(len(c) == 1 and _is_bool_scalar(c[0]), f"while cond_graph "
                f"{self.cond_graph.name!r} must return one bool scalar, got "
                f"{', '.join(map(str, c))}")
        out = body_out_types(self.body_graph)
        require(out == carried, f"while body_graph {self.body_graph.name!r} must return the "
                f"carried types {', '.join(map(str, carried))}, got {', '.join(map(str, out))}")
        return single(carried)

    def reference(self, *carried):
        vals = [np.asarray(x) for x in carried]
        runs = 0
        while bool(_run_body(self.cond_graph, "cond_graph", vals)[0]):
            if self.max_iterations is not None and runs >= self.max_iterations:
                raise LoopBoundError(f"while loop still running after max_iterations="
                                     f"{self.max_iterations} iterations (its cond_graph "
                                     f"{self.cond_graph.name!r} still holds); raise "
                                     "max_iterations or check the loop condition")
            out = _run_body(self.body_graph, "body_graph", vals)
            vals = [np.asarray(o).astype(v.dtype, copy=False) for o, v in zip(out, vals)]
            runs += 1
        return single(vals)

    def decompose(self, g: Graph, ins: Sequence[Value]) -> Value | tuple[Value, ...]:
        return self.lower_into(g, ins)

    def lower_into(self, g: Graph, ins: Sequence[Value], **inline_opts
                   ) -> Value | tuple[Value, ...]:
        """`max_iterations` guarded steps in `g`: `active = active & cond(carried)`, then
        `carried = where(active, body(carried), carried)` per value, so a finished loop keeps
        its values (`inline_opts` go to `inline_graph`)."""
        if self.max_iterations is None:
            raise GraphError(f"while loop (cond_graph {self.cond_graph.name!r}) has no "
                             f"max_iterations, so it cannot be unrolled; {UNBOUNDED_LOOP_FIX}")
        carried = list(ins)
        active = None
        for _ in range(self.max_iterations):
            c = inline_graph(g, self.cond_graph, carried, **inline_opts)[0]
            active = c if active is None else g.logical_and(active, c)
            new = inline_graph(g, self.body_graph, carried, **inline_opts)
            carried = [g.where(active, n, old) for n, old in zip(new, carried)]
        return single(carried)
