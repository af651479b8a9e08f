"""Symbolic dims: named sizes ("seq") and integer polynomials over them ("batch*seq",
"past+seq", "2*seq-1"). A symbolic dim is stored in a Shape as its canonical string, so equal
expressions compare equal as plain strings; `SymDim` does the arithmetic.

Importers fold shape computations (Shape -> Gather -> Mul -> Reshape, ...) with these, and the
interpreter evaluates them once the graph inputs bind the names. Division is exact only: a
quotient that is not a polynomial with integer coefficients raises ValueError.

Like torch.export, braze assumes every named dim is at least 2 when it must decide something at
import time (a symbol is never a broadcasting 1 and never equal to a negative number)."""
from __future__ import annotations

import fractions
import functools
import re
from collections import Counter
from collections.abc import Mapping
from typing import Union

__all__ = ["SymDim", "canonical_dim", "is_symbolic", "dim_symbols", "eval_dim", "as_sym",
           "to_dim", "monomial_factors", "MIN_SYMBOL_VALUE"]

MIN_SYMBOL_VALUE = 2
Monomial = tuple[str, ...]  # sorted symbol names, repeats allowed ("seq", "seq") = seq^2
_TERM = re.compile(r"\s*([+-]?)\s*([^+-]+)")


class SymDim:
    """An integer polynomial over named dims, immutable. `SymDim.of("batch") * 4` is
    "4*batch"; `str()` gives the canonical text stored in shapes."""

    __slots__ = ("terms", "_text")

    def __init__(self, terms: Mapping[Monomial, int]):
        clean = {m: c for m, c in terms.items() if c != 0}
        self.terms: dict[Monomial, int] = dict(sorted(clean.items(), key=_term_order))
        self._text = _format(self.terms)

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def of(cls, d: int | str | SymDim) -> SymDim:
        if isinstance(d, SymDim):
            return d
        if isinstance(d, bool):
            raise ValueError(f"dim {d!r} must be an int or a symbolic expression")
        if isinstance(d, int):
            return cls({(): d})
        if isinstance(d, str):
            return _parse_cached(d)
        if hasattr(d, "__index__"):
            return cls({(): int(d)})
        raise ValueError(f"dim {d!r} must be an int or a symbolic expression")

    # -- views ----------------------------------------------------------------------------------
    @property
    def is_const(self) -> bool:
        return all(not m for m in self.terms)

    @property
    def const(self) -> int:
        return self.terms.get((), 0)

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(s for m in self.terms for s in m)

    def to_dim(self) -> int | str:
        """An int when constant, else the canonical string."""
        return self.const if self.is_const else self._text

    def evaluate(self, env: Mapping[str, int]) -> int:
        total = 0
        for mono, coef in self.terms.items():
            v = coef
            for s in mono:
                if s not in env:
                    raise KeyError(s)
                v *= int(env[s])
            total += v
        return total

    # -- arithmetic -----------------------------------------------------------------------------
    def __add__(self, other) -> SymDim:
        o = SymDim.of(other)
        out = dict(self.terms)
        for m, c in o.terms.items():
            out[m] = out.get(m, 0) + c
        return SymDim(out)

    __radd__ = __add__

    def __neg__(self) -> SymDim:
        return SymDim({m: -c for m, c in self.terms.items()})

    def __sub__(self, other) -> SymDim:
        return self + (-SymDim.of(other))

    def __rsub__(self, other) -> SymDim:
        return SymDim.of(other) - self

    def __mul__(self, other) -> SymDim:
        o = SymDim.of(other)
        out: dict[Monomial, int] = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in o.terms.items():
                m = tuple(sorted(m1 + m2))
                out[m] = out.get(m, 0) + c1 * c2
        return SymDim(out)

    __rmul__ = __mul__

    def __floordiv__(self, other) -> SymDim:
        """Exact division by an int or by a monomial that divides every term."""
        o = SymDim.of(other)
        if len(o.terms) != 1:
            raise ValueError(f"cannot divide {self} by {o}: braze divides only by a monomial")
        ((m2, c2),) = o.terms.items()
        out: dict[Monomial, int] = {}
        for m1, c1 in self.terms.items():
            left = Counter(m1)
            left.subtract(Counter(m2))
            if any(v < 0 for v in left.values()) or c1 % c2:
                raise ValueError(f"{self} is not divisible by {o}")
            out[tuple(sorted(left.elements()))] = c1 // c2
        return SymDim(out)

    def __rfloordiv__(self, other) -> SymDim:
        return SymDim.of(other) // self

    def divmod_int(self, m: int) -> tuple[SymDim, int] | None:
        """(q, r) with self == m*q + r and 0 <= r < m for every binding, when every non-constant
        coefficient is a multiple of m ("32*h+3" by 2 is (16*h+1, 1)); else None. This is how a
        strided window over a dim declared a multiple of its stride keeps a symbolic size."""
        if m < 1 or any(c % m for mono, c in self.terms.items() if mono):
            return None
        r = self.const % m
        return SymDim({mono: c // m for mono, c in self.terms.items() if mono}
                      | {(): (self.const - r) // m}), r

    def scaled_floor(self, factor: float) -> SymDim | None:
        """floor(factor * self) as a polynomial, for a size >= 0 and a factor >= 0 whose
        denominator is a power of two (exact in floating point) dividing the scaled size's
        symbolic coefficients: 0.5 of "32*h" is 16*h, 1.5 of it 48*h; else None. An
        interpolation's output length (ONNX Resize scales, torch's scale_factor)."""
        c = fractions.Fraction(factor)
        low = self.lower_bound()
        if c < 0 or c.denominator & (c.denominator - 1) or low is None or low < 0:
            return None
        split = (self * c.numerator).divmod_int(c.denominator)
        return None if split is None else split[0]

    def __eq__(self, other) -> bool:
        try:
            return self.terms == SymDim.of(other).terms
        except ValueError:
            return False

    def __hash__(self) -> int:
        return hash(self._text)

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"SymDim({self._text!r})"

    # -- decisions under the "symbols are >= 2" assumption -------------------------------------
    def lower_bound(self) -> int | None:
        """A lower bound when every coefficient is >= 0 (symbols >= MIN_SYMBOL_VALUE), else
        None."""
        if any(c < 0 for m, c in self.terms.items() if m):
            return None
        return sum(c * MIN_SYMBOL_VALUE ** len(m) for m, c in self.terms.items())

    def known_ne(self, other) -> bool:
        """True when the two can be shown to differ for every binding."""
        diff = self - SymDim.of(other)
        if diff.is_const:
            return diff.const != 0
        lb = diff.lower_bound()
        if lb is not None and lb > 0:
            return True
        lb = (-diff).lower_bound()
        return lb is not None and lb > 0


def _term_order(item: tuple[Monomial, int]):
    mono, _ = item
    return (-len(mono), mono) if mono else (1, ())


def _format(terms: Mapping[Monomial, int]) -> str:
    if not terms:
        return "0"
    parts = []
    for mono, coef in terms.items():
        if not mono:
            body = str(abs(coef))
        else:
            names = "*".join(mono)
            body = names if abs(coef) == 1 else f"{abs(coef)}*{names}"
        sign = "-" if coef < 0 else "+"
        parts.append((sign, body))
    text = "".join(f"{s}{b}" for s, b in parts)
    return text[1:] if text.startswith("+") else text


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str) -> SymDim:
    return _parse(text)


def _parse(text: str) -> SymDim:
    s = text.replace(" ", "")
    if not s:
        raise ValueError("empty symbolic dim")
    pos = 0
    total = SymDim({})
    while pos < len(s):
        m = _TERM.match(s, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"bad symbolic dim {text!r}")
        sign, body = m.groups()
        if pos and not sign:
            raise ValueError(f"bad symbolic dim {text!r}")
        coef, mono = 1, []
        for factor in body.split("*"):
            if factor.isdigit():
                coef *= int(factor)
            elif factor.isidentifier():
                mono.append(factor)
            else:
                raise ValueError(f"bad factor {factor!r} in symbolic dim {text!r}; use names, "
                                 "ints, '*', '+' and '-'")
        total = total + SymDim({tuple(sorted(mono)): -coef if sign == "-" else coef})
        pos = m.end()
    return total


# -- helpers over plain dims (int | str) ---------------------------------------------------------
def canonical_dim(d) -> int | str:
    """The canonical form of a dim: an int, or a symbol / expression string ("4*batch")."""
    return SymDim.of(d).to_dim()


def is_symbolic(d) -> bool:
    return isinstance(d, (str, SymDim))


def dim_symbols(d) -> frozenset[str]:
    """The names a dim mentions (empty for an int)."""
    return frozenset() if isinstance(d, int) else SymDim.of(d).symbols


def eval_dim(d, env: Mapping[str, int]) -> int:
    """The int value of dim `d` under `env`; KeyError naming a missing symbol."""
    return d if isinstance(d, int) else SymDim.of(d).evaluate(env)


def as_sym(d) -> SymDim:
    return SymDim.of(d)


def to_dim(d) -> int | str:
    """A SymDim (or int / str) as a plain dim for a Shape."""
    return SymDim.of(d).to_dim()


@functools.lru_cache(maxsize=4096)
def _factors_of(d: str) -> tuple[int, tuple[str, ...]] | None:
    p = SymDim.of(d)
    if len(p.terms) != 1:
        return None
    ((mono, coef),) = p.terms.items()
    return coef, mono


def monomial_factors(d) -> tuple[int, Counter] | None:
    """(integer coefficient, multiset of symbol factors) when `d` is a single term, e.g.
    "4*batch*seq" -> (4, {batch, seq}); None for a sum such as "past+seq"."""
    if isinstance(d, int):
        return d, Counter()
    split = _factors_of(d) if isinstance(d, str) else _factors_of(str(d))
    return None if split is None else (split[0], Counter(split[1]))


Dim = Union[int, str]
