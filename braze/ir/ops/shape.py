"""Data-movement ops that change shape, not values: reshape, transpose, narrow, concat, expand,
gather, pad and the multi-output split. Axes are stored non-negative (builders normalize them);
symbolic dims are kept wherever the result can still be written as a tuple of dims."""
from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ...errors import ShapeError
from ..op import Op, require, same_dtype
from ..shapes import Dim, normalize_axis
from ..symbolic import SymDim, canonical_dim, eval_dim, monomial_factors

__all__ = [
    "Reshape", "Transpose", "Narrow", "Concat", "Expand", "Gather", "Pad", "PadMode", "Split",
    "resolve_reshape", "concrete_dims",
]


def _split_dims(dims: Sequence[Dim]) -> tuple[int, Counter]:
    """(product of the static factors, multiset of the symbolic ones). A product such as
    "4*batch*seq" contributes 4 and {batch, seq}; a sum such as "past+seq" is one factor."""
    n, syms = 1, Counter()
    for d in dims:
        if isinstance(d, int):
            n *= d
            continue
        split = monomial_factors(d)
        if split is None:
            syms[d] += 1
        else:
            coef, factors = split
            n *= coef
            syms.update(factors)
    return n, syms


def _plain_split(src: Sequence[Dim], target: Sequence[Dim]) -> tuple[int, int] | None:
    """(static element counts of src and target) when both hold the same plain symbol names
    as whole dims in the same order (the common reshape: ("b", 128, 768) -> ("b", 128, 12,
    64)); None otherwise (_split_dims then compares the symbol multisets)."""
    n_src = n_tgt = 1
    s_src, s_tgt = [], []
    for d in src:
        if type(d) is int:
            n_src *= d
        else:
            s_src.append(d)
    for d in target:
        if type(d) is int:
            n_tgt *= d
        else:
            s_tgt.append(d)
    if s_src != s_tgt or not all(type(d) is str and d.isidentifier() for d in s_src):
        return None
    return n_src, n_tgt


def _product(dims: Sequence[Dim]) -> SymDim:
    out = SymDim.of(1)
    for d in dims:
        out = out * SymDim.of(d)
    return out


def _by_product(src: Sequence[Dim], target: tuple, known: list, holes: list
                ) -> tuple[Dim, ...] | None:
    """`target` (its -1 solved) when the element counts agree as polynomials, where the
    dims' atoms do not line up; None when they do not agree (or the -1 is no polynomial)."""
    whole = _product(src)
    if not holes:
        return target if whole == _product(known) else None
    try:
        fill = whole // _product(known)
    except ValueError:
        return None
    if fill * _product(known) != whole:
        return None
    h = holes[0]
    return target[:h] + (fill.to_dim(),) + target[h + 1:]


def _fmt(dims: Sequence[Dim]) -> str:
    body = ", ".join(str(d) for d in dims)
    return f"({body},)" if len(dims) == 1 else f"({body})"


def resolve_reshape(src: Sequence[Dim], target: Sequence[Dim]) -> tuple[Dim, ...]:
    """The dims of reshaping `src` to `target`, with one optional -1 resolved.

    Static parts must have equal element counts and the symbols must match as a multiset, so
    ("b", 4, 8) -> ("b", -1) gives ("b", 32) and -> (-1, 32) gives ("b", 32). ShapeError when the
    counts differ or the -1 cannot be written as one dim (e.g. ("b", 4) -> (-1,) is "b*4")."""
    target = tuple(target)
    for d in target:  # messages are built only on failure: this runs for every reshape built
        if not (isinstance(d, str) or (isinstance(d, int) and d >= -1)):
            raise ShapeError(f"reshape target dim {d!r} must be a non-negative int, -1 or a "
                             "symbol")
    holes = [i for i, d in enumerate(target) if d == -1]
    if len(holes) > 1:
        raise ShapeError(f"reshape target {_fmt(target)} has more than one -1")
    known = [d for d in target if d != -1]
    plain = _plain_split(src, known)
    cannot = "reshape cannot turn {} into {}: "
    left: Counter = Counter()
    if plain is not None:  # the symbols appear alike in both: only the static counts matter
        n_src, n_tgt = plain
    else:
        n_src, s_src = _split_dims(src)
        n_tgt, s_tgt = _split_dims(known)
        if (s_tgt - s_src if holes else s_src != s_tgt):
            # the atoms differ, but the products may still agree as polynomials:
            # (batch, past+seq) -> (batch*past+batch*seq,), (batch, seq+1) -> (batch*seq+batch,)
            by_product = _by_product(src, target, known, holes)
            if by_product is not None:
                return by_product
            if not holes:
                raise ShapeError(cannot.format(_fmt(src), _fmt(target)) + f"symbolic dims "
                                 f"{sorted(s_src.elements())} vs {sorted(s_tgt.elements())} "
                                 "differ")
            raise ShapeError(f"reshape target {_fmt(target)} has symbols "
                             f"{sorted((s_tgt - s_src).elements())} that input {_fmt(src)} "
                             "lacks")
        left = s_src - s_tgt
    if not holes:
        if n_src != n_tgt:
            raise ShapeError(cannot.format(_fmt(src), _fmt(target)) +
                             f"element counts {n_src} vs {n_tgt} differ")
        return target
    if n_tgt == 0 or n_src % n_tgt:
        raise ShapeError(cannot.format(_fmt(src), _fmt(target)) +
                         f"{n_src} elements do not divide by {n_tgt}")
    fill: Dim = n_src // n_tgt
    if left:
        expr = SymDim.of(fill)
        for name in left.elements():
            expr = expr * SymDim.of(name)
        fill = expr.to_dim()
    h = holes[0]
    return target[:h] + (fill,) + target[h + 1:]


def concrete_dims(op: str, dims: Sequence[Dim], symbols: Mapping[str, int] | None,
                  solve_one: bool = False) -> tuple[int, ...]:
    """Integer dims for running an op whose target holds symbols.

    Symbols (and expressions over them) are evaluated with `symbols` (the interpreter's
    bindings); a single dim that cannot be evaluated becomes -1 when `solve_one` (reshape: NumPy
    solves it from the element count). Otherwise ValueError."""
    out: list[int] = []
    unknown = []
    for i, d in enumerate(dims):
        if isinstance(d, int):
            out.append(d)
            continue
        try:
            out.append(eval_dim(d, symbols or {}))
        except KeyError:
            unknown.append(i)
            out.append(-1)
    if not unknown:
        return tuple(out)
    if len(unknown) == 1 and solve_one:
        return tuple(out)
    raise ValueError(f"{op} target {_fmt(dims)} needs values for symbols "
                     f"{[dims[i] for i in unknown]}; pass symbols=")


@dataclass(frozen=True)
class Reshape(Op):
    """View the input with new dims (row-major order), `dims` fully resolved (no -1). Symbols
    in `dims` are bound at run time: the interpreter passes its bindings as `symbols=`."""

    kind = "reshape"
    arity = 1
    needs_symbols: ClassVar[bool] = True
    dims: tuple[Dim, ...]

    def infer(self, ins):
        (x,) = ins
        return x.with_dims(resolve_reshape(x.dims, self.dims))

    def reference(self, x, *, symbols: Mapping[str, int] | None = None):
        return np.reshape(x, concrete_dims("reshape", self.dims, symbols, solve_one=True))


@dataclass(frozen=True)
class Transpose(Op):
    """Permute axes: output axis i is input axis `perm[i]`."""

    kind = "transpose"
    arity = 1
    perm: tuple[int, ...]

    def infer(self, ins):
        (x,) = ins
        require(sorted(self.perm) == list(range(x.rank)),
                f"transpose perm {self.perm} is not a permutation of {x.rank} axes")
        return x.with_dims(x.dims[p] for p in self.perm)

    def reference(self, x):
        return np.transpose(x, self.perm)


@dataclass(frozen=True)
class Narrow(Op):
    """Slice `[start, start + length)` along `axis`. `length` may be symbolic ("seq": the first
    seq rows of a position table), bound at run time like Reshape's dims."""

    kind = "narrow"
    arity = 1
    needs_symbols: ClassVar[bool] = True
    axis: int
    start: int
    length: Dim

    def __post_init__(self):
        if isinstance(self.length, str):
            object.__setattr__(self, "length", canonical_dim(self.length))

    def infer(self, ins):
        (x,) = ins
        ax = normalize_axis(self.axis, x.rank)
        require(self.start >= 0, f"narrow start {self.start} must be >= 0")
        require(not isinstance(self.length, int) or self.length >= 0,
                f"narrow length {self.length} must be >= 0")
        d = x.dims[ax]
        if isinstance(self.length, int):
            require(not isinstance(d, int) or self.start + self.length <= d,
                    f"narrow [{self.start}, {self.start + self.length}) is out of bounds for "
                    f"axis {ax} of size {d}")
        else:
            require(d != self.length or self.start == 0,
                    f"narrow [{self.start}, {self.start}+{self.length}) is out of bounds for "
                    f"axis {ax} of size {d}")
        return x.with_dims(x.dims[:ax] + (self.length,) + x.dims[ax + 1:])

    def reference(self, x, *, symbols: Mapping[str, int] | None = None):
        ax = normalize_axis(self.axis, x.ndim)
        (length,) = concrete_dims("narrow", (self.length,), symbols)
        if length < 0:
            raise ValueError(f"narrow length {self.length} is {length} < 0 for this binding: "
                             "feed sizes for which the slice stays inside its axis")
        if self.start + length > x.shape[ax]:
            raise ValueError(f"narrow [{self.start}, {self.start + length}) is out of "
                             f"bounds for axis {ax} of size {x.shape[ax]}")
        idx = [slice(None)] * x.ndim
        idx[ax] = slice(self.start, self.start + length)
        return x[tuple(idx)]


@dataclass(frozen=True)
class Concat(Op):
    """Join inputs along `axis`; every other dim must agree."""

    kind = "concat"
    arity = None
    min_arity = 1
    axis: int

    def infer(self, ins):
        same_dtype(self, ins)
        first = ins[0]
        require(all(s.rank == first.rank for s in ins),
                f"concat inputs must share a rank, got {', '.join(str(s) for s in ins)}")
        ax = normalize_axis(self.axis, first.rank)
        for s in ins[1:]:
            for i, (a, b) in enumerate(zip(first.dims, s.dims)):
                require(i == ax or a == b, f"concat inputs differ at axis {i} ({a} vs {b}); only "
                        f"the concat axis {ax} may differ")
        total = SymDim.of(0)
        for s in ins:
            total = total + SymDim.of(s.dims[ax])
        total = total.to_dim()
        return first.with_dims(first.dims[:ax] + (total,) + first.dims[ax + 1:])

    def reference(self, *xs):
        return np.concatenate(xs, axis=normalize_axis(self.axis, xs[0].ndim))


@dataclass(frozen=True)
class Expand(Op):
    """Broadcast the input to `dims` (NumPy `broadcast_to`): trailing-aligned, size-1 input
    dims stretch, new leading dims are added. Symbols bind at run time as for Reshape."""

    kind = "expand"
    arity = 1
    needs_symbols: ClassVar[bool] = True
    dims: tuple[Dim, ...]

    def infer(self, ins):
        (x,) = ins
        require(len(self.dims) >= x.rank,
                f"expand target {_fmt(self.dims)} has lower rank than input {x}")
        off = len(self.dims) - x.rank
        for i, d in enumerate(x.dims):
            t = self.dims[off + i]
            require(d == t or d == 1, f"expand cannot stretch input dim {i} of size {d} to {t}")
        return x.with_dims(self.dims)

    def reference(self, x, *, symbols: Mapping[str, int] | None = None):
        off = len(self.dims) - x.ndim
        known = dict(symbols or {})
        for i, t in enumerate(self.dims[off:]):
            if isinstance(t, str) and x.shape[i] != 1:
                known.setdefault(t, x.shape[i])
        return np.broadcast_to(x, concrete_dims("expand", self.dims, known)).copy()


@dataclass(frozen=True)
class Gather(Op):
    """NumPy `take` along `axis`: output dims are x[:axis] + indices + x[axis+1:]."""

    kind = "gather"
    arity = 2
    axis: int = 0

    def infer(self, ins):
        x, idx = ins
        require(idx.dtype.is_int, f"gather indices must be integers, got {idx.dtype}")
        ax = normalize_axis(self.axis, x.rank)
        return x.with_dims(x.dims[:ax] + idx.dims + x.dims[ax + 1:])

    def reference(self, x, idx):
        return np.take(x, idx, axis=normalize_axis(self.axis, x.ndim))


class PadMode(enum.Enum):
    CONSTANT = "constant"
    REFLECT = "reflect"
    EDGE = "edge"


@dataclass(frozen=True)
class Pad(Op):
    """Padding: `pads[i] = (before, after)` elements added on axis i. `mode` says what fills
    them: `value` (constant), the mirror image without the edge element (reflect: each amount
    must be below the axis length) or copies of the edge element (edge)."""

    kind = "pad"
    arity = 1
    pads: tuple[tuple[int, int], ...]
    value: float = 0.0
    mode: PadMode = PadMode.CONSTANT

    def infer(self, ins):
        (x,) = ins
        require(len(self.pads) == x.rank,
                f"pad needs one (before, after) pair per axis: {len(self.pads)} for rank {x.rank}")
        out: list[Dim] = []
        for i, (d, pair) in enumerate(zip(x.dims, self.pads)):
            require(len(pair) == 2 and all(isinstance(p, int) and p >= 0 for p in pair),
                    f"pad amounts on axis {i} must be two ints >= 0, got {pair}")
            before, after = pair
            if self.mode is not PadMode.CONSTANT and (before or after):
                # a symbolic axis qualifies when its smallest length does ("32*h": 64)
                least = d if isinstance(d, int) else SymDim.of(d).lower_bound()
                need = max(before, after) + 1 if self.mode is PadMode.REFLECT else 1
                require(least is not None and least >= need,
                        f"{self.mode.value} pad of {pair} on axis {i} needs the axis at least "
                        f"{need} long, got {d!r}" + ("" if isinstance(d, int) else
                                                      " (fix or bound the symbol)"))
            out.append((SymDim.of(d) + before + after).to_dim())
        return x.with_dims(out)

    def reference(self, x):
        if self.mode is PadMode.CONSTANT:
            return np.pad(x, self.pads, mode="constant",
                          constant_values=np.asarray(self.value).astype(x.dtype))
        return np.pad(x, self.pads, mode=self.mode.value)


@dataclass(frozen=True)
class Split(Op):
    """Cut the input along `axis` into consecutive pieces of `sizes`: one output per piece."""

    kind = "split"
    arity = 1
    axis: int
    sizes: tuple[int, ...]

    def infer(self, ins):
        (x,) = ins
        ax = normalize_axis(self.axis, x.rank)
        require(len(self.sizes) >= 1 and all(s >= 0 for s in self.sizes),
                f"split sizes {self.sizes} must be one or more ints >= 0")
        d = x.dims[ax]
        require(isinstance(d, int), f"split axis {ax} is symbolic ({d!r}); it must be static")
        require(sum(self.sizes) == d,
                f"split sizes {self.sizes} sum to {sum(self.sizes)}, axis {ax} has {d}")
        return tuple(x.with_dims(x.dims[:ax] + (s,) + x.dims[ax + 1:]) for s in self.sizes)

    def reference(self, x):
        ax = normalize_axis(self.axis, x.ndim)
        cuts = np.cumsum(self.sizes)[:-1]
        return tuple(np.split(x, cuts, axis=ax))

