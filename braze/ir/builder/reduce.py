"""Builder methods for softmax, reduce (and its short names sum, mean, reduce_max, reduce_min,
prod), cumsum and argmax. Axes are normalized here: ops store non-negative, sorted axes."""
from __future__ import annotations

from collections.abc import Sequence

from ...errors import GraphError
from ..op import Value
from ..ops.reduce import ArgMax, Cumsum, LogSoftmax, Reduce, ReduceFn, Softmax
from ..shapes import Shape
from .rlx_args import check_shape
from .shape import axes_for, axis_for

__all__ = ["ReduceBuilder"]

Axes = int | Sequence[int] | None


def _reduce_fn(fn: ReduceFn | str) -> ReduceFn:
    if isinstance(fn, ReduceFn):
        return fn
    try:
        return ReduceFn(str(fn).lower())
    except ValueError:
        known = ", ".join(f.value for f in ReduceFn)
        raise GraphError(f"unknown ReduceFn {fn!r}; known: {known}") from None


class ReduceBuilder:
    def softmax(self, x: Value, axis: int = -1, shape=None) -> Value:
        """Numerically stable softmax along `axis` (RLX's output `shape`, if given, is
        checked)."""
        ax = axis_for("softmax", axis, self.shape_of(x).rank)
        out = self.add_node(Softmax(ax), (x,))[0]
        check_shape("softmax", self.shape_of(out), shape)
        return out

    sm = softmax

    def log_softmax(self, x: Value, axis: int = -1) -> Value:
        """`log(softmax(x))` along `axis`, computed stably."""
        ax = axis_for("log_softmax", axis, self.shape_of(x).rank)
        return self.add_node(LogSoftmax(ax), (x,))[0]

    def reduce(self, x: Value, fn: ReduceFn | str, axes: Axes = None,
               keepdims: bool = False, shape=None) -> Value:
        """`fn` ("sum", "mean", "max", "min", "prod") over `axes` (an int, a tuple, or None for
        every axis)."""
        fn = _reduce_fn(fn)
        rank = self.shape_of(x).rank
        label = f"reduce_{fn.value}"
        ax = tuple(range(rank)) if axes is None else axes_for(label, axes, rank)
        out = self.add_node(Reduce(fn, ax, bool(keepdims)), (x,))[0]
        check_shape(label, self.shape_of(out), shape)
        return out

    def sum(self, x: Value, axes: Axes = None, keepdims: bool = False) -> Value:
        return self.reduce(x, ReduceFn.SUM, axes, keepdims)

    def mean(self, x: Value, axes: Axes = None, keepdims: bool = False) -> Value:
        return self.reduce(x, ReduceFn.MEAN, axes, keepdims)

    def reduce_max(self, x: Value, axes: Axes = None, keepdims: bool = False) -> Value:
        return self.reduce(x, ReduceFn.MAX, axes, keepdims)

    def reduce_min(self, x: Value, axes: Axes = None, keepdims: bool = False) -> Value:
        return self.reduce(x, ReduceFn.MIN, axes, keepdims)

    def prod(self, x: Value, axes: Axes = None, keepdims: bool = False) -> Value:
        return self.reduce(x, ReduceFn.PROD, axes, keepdims)

    def cumsum(self, x: Value, axis: int, exclusive: bool = False,
               reverse: bool = False, shape=None) -> Value:
        """Running sum along `axis` (`exclusive`: start at 0; `reverse`: from the end). RLX's
        `cumsum(x, axis, exclusive, shape)` works too: a shape where `reverse` goes is checked
        against the inferred type, never taken as the flag."""
        if isinstance(reverse, (Shape, tuple, list)):
            reverse, shape = False, reverse
        ax = axis_for("cumsum", axis, self.shape_of(x).rank)
        out = self.add_node(Cumsum(ax, bool(exclusive), bool(reverse)), (x,))[0]
        check_shape("cumsum", self.shape_of(out), shape)
        return out

    def argmax(self, x: Value, axis: int, keepdims: bool = False) -> Value:
        """i64 index of the first maximum along `axis`."""
        ax = axis_for("argmax", axis, self.shape_of(x).rank)
        return self.add_node(ArgMax(ax, bool(keepdims)), (x,))[0]
