"""Builder methods for bounded scans, under RLX's names: `scan`, `scan_with_xs`,
`scan_with_bcasts_and_xs`, `scan_trajectory`, `scan_checkpointed`, plus `scan_general` (several
carries, per-step outputs, reverse order), all one `Scan` op (braze/ir/ops/scan.py).

RLX's argument order is kept: `g.scan(init, body, length)`. `init` may be one value or a sequence
(several carries); the scan then returns one value or a tuple."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..op import Value
from ..ops._body import inline_body
from ..ops.scan import Scan

if TYPE_CHECKING:
    from ..graph import Graph

__all__ = ["ScanBuilder", "body_returning_carries_twice"]


def _values(v: Value | Sequence[Value]) -> tuple[Value, ...]:
    return (v,) if isinstance(v, Value) else tuple(v)


def _one_or_tuple(vals: Sequence[Value]) -> Value | tuple[Value, ...]:
    return vals[0] if len(vals) == 1 else tuple(vals)


def body_returning_carries_twice(body: Graph, n_carry: int) -> Graph:
    """A copy of `body` that also returns its new carries as per-step outputs (so a scan over
    it stacks the trajectory)."""
    from ..graph import Graph

    out = Graph(f"{body.name}_trajectory", record_provenance=False)
    ins = [out.input(body.nodes[i].op.name, body.nodes[i].op.shape) for i in body.input_ids]
    res = inline_body(out, body, ins)
    out.set_outputs([*res[:n_carry], *res[:n_carry], *res[n_carry:]])
    return out


class ScanBuilder:
    def scan_general(self, body: Graph, carries: Value | Sequence[Value], length: int, *,
                     bcasts: Sequence[Value] = (), xs: Sequence[Value] = (),
                     reverse: bool = False, num_checkpoints: int = 0) -> tuple[Value, ...]:
        """`lax.scan`: body(carries..., bcasts..., x_t...) -> (new carries..., y_t...); returns
        (final carries..., ys stacked [length, ...]). Each x in `xs` is `[length, ...]`."""
        cs = _values(carries)
        op = Scan(body, int(length), len(cs), len(bcasts), bool(reverse), int(num_checkpoints))
        return self.add_node(op, (*cs, *bcasts, *xs))

    def scan(self, init: Value | Sequence[Value], body: Graph, length: int
             ) -> Value | tuple[Value, ...]:
        """Apply `body` (carries -> new carries) `length` times to `init`; the final carry."""
        cs = _values(init)
        return _one_or_tuple(self.scan_general(body, cs, length)[:len(cs)])

    def scan_with_xs(self, init: Value | Sequence[Value], xs: Sequence[Value], body: Graph,
                     length: int) -> Value | tuple[Value, ...]:
        """Scan whose body also reads `xs[i][t]` at step t (body inputs: carries, then one
        slice per x); the final carry."""
        cs = _values(init)
        return _one_or_tuple(self.scan_general(body, cs, length, xs=xs)[:len(cs)])

    def scan_with_bcasts_and_xs(self, init: Value | Sequence[Value], bcasts: Sequence[Value],
                                xs: Sequence[Value], body: Graph, length: int
                                ) -> Value | tuple[Value, ...]:
        """Scan whose body reads (carries, bcasts whole, then xs[i][t]); the final carry."""
        cs = _values(init)
        out = self.scan_general(body, cs, length, bcasts=bcasts, xs=xs)
        return _one_or_tuple(out[:len(cs)])

    def scan_trajectory(self, init: Value | Sequence[Value], body: Graph, length: int
                        ) -> Value | tuple[Value, ...]:
        """The carries after every step, stacked: `[length, *init]`; row t is the carry after
        step t+1, so the last row equals `scan`'s result."""
        cs = _values(init)
        traj = body_returning_carries_twice(body, len(cs))
        return _one_or_tuple(self.scan_general(traj, cs, length)[len(cs):2 * len(cs)])

    def scan_checkpointed(self, init: Value | Sequence[Value], body: Graph, length: int,
                          num_checkpoints: int) -> Value | tuple[Value, ...]:
        """`scan`, but reverse mode keeps only `num_checkpoints` carries (it must divide
        `length`) and recomputes the others segment by segment in the backward pass."""
        cs = _values(init)
        out = self.scan_general(body, cs, length, num_checkpoints=num_checkpoints)
        return _one_or_tuple(out[:len(cs)])
