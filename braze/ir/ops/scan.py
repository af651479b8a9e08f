"""`Scan`: a bounded loop of `length` steps over a body graph (JAX `lax.scan`), the op behind
RLX's `scan`, `scan_with_xs`, `scan_with_bcasts_and_xs`, `scan_trajectory` and
`scan_checkpointed` (see braze/ir/builder/scan.py).

Inputs are `(carries..., bcasts..., xs...)`: `n_carry` loop-carried values, `n_bcast` values every
step reads whole, and per-step inputs of shape `[length, *per_step]`. The body takes
`(carries..., bcasts..., x_t...)` (x_t = xs[t]) and returns `(new carries..., y_t...)`. The op's
outputs are the final carries, then each y stacked over the steps (`[length, *y]`, row t from
step t). `reverse` runs t = length-1 .. 0. `num_checkpoints` > 0 asks autodiff to keep only that
many carries and recompute the others in the backward pass (forward meaning unchanged)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...errors import GraphError
from ..equality import ops_equal
from ..op import Op, Value, require
from ..shapes import Shape
from ._body import body_key, body_out_types, check_closed, check_takes, inline_body, run_body

if TYPE_CHECKING:
    from ..graph import Graph

__all__ = ["Scan"]


@dataclass(frozen=True, eq=False)
class Scan(Op):
    """A bounded scan; see the module docstring for the input/output layout."""

    kind = "scan"
    arity = None
    min_arity = 1
    composite = True
    body: Graph
    length: int
    n_carry: int = 1
    n_bcast: int = 0
    reverse: bool = False
    num_checkpoints: int = 0

    def __post_init__(self):
        check_closed(self.body, "scan body")
        for name in ("length", "n_carry", "n_bcast", "num_checkpoints"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise GraphError(f"scan: {name} must be a non-negative int, got {v!r}")
        if self.length < 1:
            raise GraphError("scan: length must be at least 1")
        if self.n_carry < 1:
            raise GraphError("scan: needs at least one carry")
        if self.num_checkpoints and (self.num_checkpoints >= self.length
                                     or self.length % self.num_checkpoints):
            raise GraphError(f"scan: num_checkpoints={self.num_checkpoints} must divide "
                             f"length={self.length} and be smaller than it (each checkpoint "
                             "starts a segment of equal length)")

    def __eq__(self, other) -> bool:
        return isinstance(other, Scan) and ops_equal(self, other)

    def __hash__(self) -> int:
        return hash(("scan", body_key(self.body), self.length, self.n_carry, self.n_bcast,
                     self.reverse, self.num_checkpoints))

    def __repr__(self) -> str:
        return (f"Scan({self.body.name!r}, length={self.length}, n_carry={self.n_carry}, "
                f"n_bcast={self.n_bcast}, reverse={self.reverse}, "
                f"num_checkpoints={self.num_checkpoints})")

    @property
    def n_ys(self) -> int:
        return len(self.body.outputs) - self.n_carry

    def step_types(self, ins: Sequence[Shape]) -> tuple[Shape, ...]:
        """The body's input types for op input types `ins`."""
        head = self.n_carry + self.n_bcast
        require(len(ins) >= head, f"scan takes {self.n_carry} carries and {self.n_bcast} "
                                  f"broadcast inputs first, got {len(ins)} inputs")
        steps = []
        for i, s in enumerate(ins[head:]):
            require(s.rank >= 1 and s.dims[0] == self.length, f"scan per-step input {i} must "
                    f"have the leading dim length={self.length}, got {s}")
            steps.append(Shape(s.dims[1:], s.dtype))
        return tuple(ins[:head]) + tuple(steps)

    def infer(self, ins):
        check_takes(self.body, "scan body", self.step_types(ins),
                    "(carries, broadcasts, per-step slices)")
        outs = body_out_types(self.body)
        require(len(outs) >= self.n_carry, f"scan body returns {len(outs)} values but carries "
                                           f"{self.n_carry}")
        for i, (o, c) in enumerate(zip(outs[:self.n_carry], ins)):
            require(o.dtype == c.dtype and o.dims == c.dims, f"scan body output {i} is {o}, "
                    f"but carry {i} is {c}; a carry keeps its type")
        ys = tuple(Shape((self.length, *y.dims), y.dtype) for y in outs[self.n_carry:])
        res = tuple(ins[:self.n_carry]) + ys
        return res[0] if len(res) == 1 else res

    def _steps(self):
        return range(self.length - 1, -1, -1) if self.reverse else range(self.length)

    def reference(self, *xs):
        head = self.n_carry + self.n_bcast
        carry = [np.asarray(x) for x in xs[:self.n_carry]]
        bcasts, per_step = list(xs[self.n_carry:head]), xs[head:]
        ys: list[list[np.ndarray]] = [[None] * self.length for _ in range(self.n_ys)]
        for t in self._steps():
            out = run_body(self.body, carry + bcasts + [x[t] for x in per_step])
            carry = [np.asarray(o).astype(c.dtype, copy=False)
                     for o, c in zip(out[:self.n_carry], carry)]
            for k, y in enumerate(out[self.n_carry:]):
                ys[k][t] = np.asarray(y)
        res = carry + [np.stack(y) if self.length else np.zeros((0,)) for y in ys]
        return res[0] if len(res) == 1 else tuple(res)

    def decompose(self, g: Graph, ins: Sequence[Value]) -> Value | tuple[Value, ...]:
        """The loop unrolled: `length` copies of the body, per-step slices by narrow +
        reshape, the ys stacked by concat."""
        head = self.n_carry + self.n_bcast
        carry, bcasts = list(ins[:self.n_carry]), list(ins[self.n_carry:head])
        ys: list[list[Value]] = [[None] * self.length for _ in range(self.n_ys)]
        for t in self._steps():
            x_t = [g.reshape(g.narrow(x, 0, t, 1), g.shape_of(x).dims[1:]) for x in ins[head:]]
            out = inline_body(g, self.body, carry + bcasts + x_t)
            carry = out[:self.n_carry]
            for k, y in enumerate(out[self.n_carry:]):
                ys[k][t] = g.reshape(y, (1, *g.shape_of(y).dims))
        stacked = [y[0] if len(y) == 1 else g.concat(y, 0) for y in ys]
        res = carry + stacked
        return res[0] if len(res) == 1 else tuple(res)
