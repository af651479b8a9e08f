"""Ops that make a tensor from dims alone, no inputs: `range` (start + i * delta for i below a
possibly symbolic length: position ids, mask rows) and `sym_const` (a small integer tensor whose
entries are dims: a shape computed at run time). Both read the symbol bindings, so a graph with a
symbolic sequence length keeps one meaning for every length."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..dtypes import DType, i64
from ..op import Op, require
from ..shapes import Dim, Shape
from ..symbolic import canonical_dim, eval_dim

__all__ = ["Range", "SymConst"]


def _bound(op: str, d: Dim, symbols: Mapping[str, int] | None) -> int:
    try:
        return eval_dim(d, symbols or {})
    except KeyError as e:
        raise ValueError(f"{op} needs a value for symbol {e}; pass symbols=") from None


@dataclass(frozen=True)
class Range(Op):
    """`start + i * delta` for i in [0, length), as `dtype`; `length` may be symbolic."""

    kind = "range"
    arity = 0
    needs_symbols: ClassVar[bool] = True
    length: Dim
    start: float = 0
    delta: float = 1
    dtype: DType = i64

    def __post_init__(self):
        object.__setattr__(self, "length", canonical_dim(self.length))
        object.__setattr__(self, "start", float(self.start))
        object.__setattr__(self, "delta", float(self.delta))

    def infer(self, ins):
        require(not isinstance(self.length, int) or self.length >= 0,
                f"range length {self.length} must be >= 0")
        require(self.dtype.is_int or self.dtype.is_float,
                f"range dtype must be numeric, got {self.dtype}")
        return Shape((self.length,), self.dtype)

    def reference(self, *, symbols: Mapping[str, int] | None = None):
        n = _bound("range", self.length, symbols)
        return (self.start + np.arange(n, dtype=np.float64) * self.delta).astype(self.dtype.np)


@dataclass(frozen=True)
class SymConst(Op):
    """A tensor of `shape` (static) whose row-major entries are `values`: ints or symbolic dims
    evaluated at run time. What a shape computation (Shape -> Gather -> Concat) folds to when a
    value reaches the data path."""

    kind = "sym_const"
    arity = 0
    needs_symbols: ClassVar[bool] = True
    values: tuple[Dim, ...]
    shape: tuple[int, ...] = ()
    dtype: DType = i64

    def __post_init__(self):
        object.__setattr__(self, "values", tuple(canonical_dim(v) for v in self.values))

    def infer(self, ins):
        n = 1
        for d in self.shape:
            require(isinstance(d, int) and d >= 0, f"sym_const shape {self.shape} must be static")
            n *= d
        require(len(self.values) == n, f"sym_const has {len(self.values)} values for shape "
                f"{self.shape} ({n} elements)")
        require(self.dtype.is_int or self.dtype.is_float,
                f"sym_const dtype must be numeric, got {self.dtype}")
        return Shape(self.shape, self.dtype)

    def reference(self, *, symbols: Mapping[str, int] | None = None):
        vals = [_bound("sym_const", v, symbols) for v in self.values]
        return np.asarray(vals, dtype=self.dtype.np).reshape(self.shape)
