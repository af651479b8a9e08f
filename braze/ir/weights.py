"""Stored weights (`Graph.weights`): a dict from param name to its array, where an entry may be
deferred - computed from other stored values the first time anyone reads it.

A fusion that joins stored weights (Q/K/V side by side for one packed projection) would copy
tens of megabytes while the graph is being rewritten, although many fused graphs are only
inspected, or are exported or compiled once later. `DeferredWeight` records the computation
instead (with the result's shape and dtype); `WeightStore` hands out arrays only: indexing,
`get`, `items`, `values`, `dict(store)`, `{**store}` and `np.asarray(entry)` all compute a
deferred entry (once; the array is kept) and return the array, so every reader - interpreter,
exporter, executor, save, equality - sees ordinary values. Passes that merely carry weights
from one graph to the next use `carry` / `raw_items`, which keep entries deferred."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

__all__ = ["DeferredWeight", "WeightStore", "joined_weight"]


class DeferredWeight:
    """A weight computed on first read: `compute()` must return an array of `shape` and
    `dtype` (NumPy); `what` says how it is made, for errors and reprs."""

    __slots__ = ("shape", "dtype", "what", "_compute", "_value")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, compute: Callable[[], Any],
                 what: str = "deferred weight"):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.what = what
        self._compute: Callable[[], Any] | None = compute
        self._value: np.ndarray | None = None

    @property
    def ready(self) -> bool:
        """Whether the value has been computed already."""
        return self._value is not None

    def value(self) -> np.ndarray:
        """The array (computed the first time; what it was computed from is then released)."""
        if self._value is None:
            arr = np.asarray(self._compute()).astype(self.dtype, copy=False)
            if arr.shape != self.shape:
                raise ValueError(f"{self.what} computed shape {arr.shape}, declared {self.shape}")
            self._value, self._compute = arr, None
        return self._value

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        arr = self.value()
        return arr if dtype is None else arr.astype(dtype, copy=False)

    def __repr__(self) -> str:
        state = "computed" if self.ready else "not computed yet"
        return f"<DeferredWeight {self.what} {self.shape} {self.dtype} ({state})>"


def joined_weight(parts: Iterable[Any], axis: int, dtype: np.dtype,
                  what: str = "joined weight") -> DeferredWeight:
    """`np.concatenate(parts, axis)` as `dtype`, deferred; a part may itself be deferred."""
    parts = tuple(parts)
    shapes = [tuple(np.shape(p)) if not isinstance(p, DeferredWeight) else p.shape
              for p in parts]
    rank = len(shapes[0])
    ax = axis % rank
    dims = list(shapes[0])
    dims[ax] = sum(s[ax] for s in shapes)

    def compute() -> np.ndarray:
        return np.concatenate([np.asarray(p) for p in parts], axis=ax)

    return DeferredWeight(tuple(dims), dtype, compute, what)


class WeightStore(dict):
    """`dict[str, np.ndarray]` whose entries may be `DeferredWeight`s; every read returns the
    array (see the module docstring). `raw_items` and `carry` keep deferred entries deferred."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        for k, v in dict(*args, **kwargs).items():  # a WeightStore argument is read computed
            dict.__setitem__(self, k, v)

    # -- reads compute ------------------------------------------------------------------------
    def __getitem__(self, name: str) -> np.ndarray:
        v = dict.__getitem__(self, name)
        if isinstance(v, DeferredWeight):
            v = v.value()
            dict.__setitem__(self, name, v)
        return v

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def __iter__(self) -> Iterator[str]:
        # overriding __iter__ makes dict(store), {**store} and dict.update read through
        # __getitem__ (CPython copies a plain dict's entries raw)
        return iter(dict.keys(self))

    def items(self):
        return [(k, self[k]) for k in dict.keys(self)]

    def values(self):
        return [self[k] for k in dict.keys(self)]

    def pop(self, name: str, *default: Any) -> Any:
        if name in self:
            v = self[name]
            dict.__delitem__(self, name)
            return v
        return dict.pop(self, name, *default)

    def setdefault(self, name: str, default: Any = None) -> Any:
        if name not in self:
            dict.__setitem__(self, name, default)
        return self[name]

    def popitem(self) -> tuple[str, np.ndarray]:
        k = next(reversed(dict.keys(self)))
        return k, self.pop(k)

    def copy(self) -> WeightStore:
        """A shallow copy that keeps deferred entries deferred."""
        return self.carry()

    def __eq__(self, other) -> bool:
        if not isinstance(other, dict) or set(dict.keys(self)) != set(dict.keys(other)):
            return False
        return all(np.array_equal(self[k], other[k]) for k in dict.keys(self))

    __hash__ = None  # a dict is unhashable

    # -- carrying weights between graphs (no computation) -------------------------------------
    def raw_items(self) -> Iterator[tuple[str, Any]]:
        """(name, array or DeferredWeight) pairs, without computing anything."""
        return iter(dict.items(self))

    def raw(self, name: str, default: Any = None) -> Any:
        """`name`'s array or DeferredWeight as stored (nothing computed), else `default`."""
        return dict.get(self, name, default)

    def is_deferred(self, name: str) -> bool:
        """Whether `name`'s value has not been computed yet."""
        v = dict.get(self, name)
        return isinstance(v, DeferredWeight) and not v.ready

    def carry(self, keep: Callable[[str], bool] | Iterable[str] | None = None) -> WeightStore:
        """A new store with the entries whose names `keep` admits (a predicate or a collection
        of names; None keeps all), deferred ones still deferred."""
        out = WeightStore()
        if keep is None:
            dict.update(out, dict.items(self))
            return out
        test = keep if callable(keep) else set(keep).__contains__
        for k, v in dict.items(self):
            if test(k):
                dict.__setitem__(out, k, v)
        return out

    def update_raw(self, other: dict) -> None:
        """Add `other`'s entries, deferred ones (of a WeightStore) still deferred."""
        items = other.raw_items() if isinstance(other, WeightStore) else other.items()
        for k, v in items:
            dict.__setitem__(self, k, v)
