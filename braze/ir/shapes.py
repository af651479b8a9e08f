"""Tensor types: a tuple of dims (ints, named symbols such as "batch", or polynomials over them
such as "batch*seq"; see `symbolic`) plus a dtype, and the NumPy broadcasting rule over them.
Symbols survive passes and are bound at run time."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Union

from ..errors import ShapeError
from .dtypes import DType, f32
from .symbolic import SymDim, canonical_dim, dim_symbols

Dim = Union[int, str]


MAX_DIM = 2**62  # past this no tensor fits in memory (NumPy refuses dims past int64)


@dataclass(frozen=True)
class Shape:
    """Dims plus element type. `Shape((4, "seq", 384))` is float32 with a symbolic sequence dim."""

    dims: tuple[Dim, ...]
    dtype: DType = f32

    def __init__(self, dims: Iterable[Dim] = (), dtype: DType = f32):
        norm = []
        for d in dims:
            if isinstance(d, SymDim):
                d = d.to_dim()
            if isinstance(d, bool) or not isinstance(d, (int, str)):
                if hasattr(d, "__index__"):
                    d = int(d)
                else:
                    raise ShapeError(f"dim {d!r} must be an int or a symbol name")
            if isinstance(d, int) and d < 0:
                raise ShapeError(f"dim {d} is negative in {tuple(dims)}")
            if isinstance(d, int) and d > MAX_DIM:
                raise ShapeError(f"dim {d} in {tuple(dims)} is larger than any array can be "
                                 f"(2**62)")
            if isinstance(d, str) and not d.isidentifier():
                try:
                    d = canonical_dim(d)
                except ValueError as e:
                    raise ShapeError(f"symbolic dim {d!r}: {e}") from None
                if isinstance(d, int) and d < 0:
                    raise ShapeError(f"dim {d} is negative in {tuple(dims)}")
            norm.append(d)
        if not isinstance(dtype, DType):
            raise ShapeError(f"dtype must be a braze DType (bz.f32, ...), got {dtype!r}")
        object.__setattr__(self, "dims", tuple(norm))
        object.__setattr__(self, "dtype", dtype)

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.dims)

    @property
    def symbols(self) -> tuple[str, ...]:
        """The symbolic dims as written ("seq", "batch*seq")."""
        return tuple(d for d in self.dims if isinstance(d, str))

    @property
    def symbol_names(self) -> frozenset[str]:
        """Every name the dims mention ("batch*seq" mentions batch and seq)."""
        out: frozenset[str] = frozenset()
        for d in self.dims:
            out |= dim_symbols(d)
        return out

    def numel(self) -> int | None:
        """Element count, or None when a dim is symbolic."""
        if not self.is_static:
            return None
        n = 1
        for d in self.dims:
            n *= d
        return n

    def nbytes(self) -> int | None:
        n = self.numel()
        return None if n is None else n * self.dtype.itemsize

    def with_dims(self, dims: Iterable[Dim]) -> Shape:
        return Shape(tuple(dims), self.dtype)

    def with_dtype(self, dtype: DType) -> Shape:
        return Shape(self.dims, dtype)

    def axis(self, axis: int) -> int:
        """Normalize a possibly negative axis against this rank."""
        return normalize_axis(axis, self.rank)

    def __len__(self) -> int:
        return len(self.dims)

    def __getitem__(self, i):
        return self.dims[i]

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.dims)}]"

    def __repr__(self) -> str:
        return f"Shape({self.dims!r}, {self.dtype.name})"


def normalize_axis(axis: int, rank: int) -> int:
    """`axis` in [0, rank), accepting negative values; ShapeError when out of range."""
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def broadcast_dims(a: tuple[Dim, ...], b: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """NumPy broadcasting of two dim tuples. Two different symbols (or a symbol against an int
    other than 1) are a ShapeError: braze does not guess that they agree at run time."""
    out: list[Dim] = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            why = "" if isinstance(x, int) or isinstance(y, int) else \
                ": symbolic dims braze does not assume equal"
            raise ShapeError(f"dims {tuple(a)} and {tuple(b)} do not broadcast ({x} vs {y}{why})")
    return tuple(reversed(out))


def broadcast_shapes(*shapes: tuple[Dim, ...]) -> tuple[Dim, ...]:
    out: tuple[Dim, ...] = ()
    for s in shapes:
        out = broadcast_dims(out, s)
    return out


def static_numel(dims: Iterable[Dim]) -> int | None:
    n = 1
    for d in dims:
        if not isinstance(d, int):
            return None
        n *= d
    return n
