"""torch.export's symbolic sizes as braze dims.

torch names the dynamic sizes of an exported program with its own symbols (s0, s43) and writes
every size computed from them as a sympy expression (s0*s1, s1 + 1, FloorDiv(s0, 2)). Here those
become braze `SymDim` polynomials over the user's dim names ("batch", "seq"): `SymbolNames` maps
torch's symbols to names (from the `dynamic_shapes` the user gave, else `<input>_dim<axis>`),
`to_dim` translates one expression, and `torch_dynamic_shapes` turns braze's simple form
`{input: {axis: "name"}}` into what torch.export takes. Decisions that need an inequality (Max,
Min, comparisons) use braze's "every symbol is >= 2" assumption (braze.ir.symbolic)."""
from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import FrontendError
from ...ir.symbolic import SymDim
from ..clamps import clamp_choice

__all__ = ["SymbolNames", "NotRepresentable", "torch_dynamic_shapes", "decide_lt", "decide_eq",
           "scalar_value", "export_excludes"]


class NotRepresentable(Exception):
    """A torch size expression braze cannot write as a polynomial over named dims; `dims` are
    the braze names of the dynamic dims it depends on (importing them static avoids it)."""

    def __init__(self, message: str, dims: Sequence[str] = ()):
        super().__init__(message + static_hint(dims))
        self.dims = tuple(dims)


def static_hint(dims: Sequence[str]) -> str:
    """The hint to import `dims` static (empty when there are none), to end an error."""
    if not dims:
        return ""
    names = " and ".join(sorted(dims))
    which = "that dim" if len(dims) == 1 else "those dims"
    return (f"; import with {names} static: leave {which} out of dynamic_shapes (the graph then "
            "runs the example input's size only)")


def _multiple_hint(a: SymDim, b: SymDim) -> str:
    """For a division of one dim by a constant: how to declare that dim so it divides."""
    if not b.is_const or b.const < 2 or len(a.symbols) != 1:
        return ""
    (name,) = a.symbols
    return (f"; declare {name} a multiple of {b.const} in dynamic_shapes "
            f"({repr(f'{b.const}*{name}')}) so the division is exact")


def _sanitize(name: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return out if out.isidentifier() else f"d_{out}"


@dataclass
class SymbolNames:
    """torch symbol name ("s43") -> braze dim name ("seq")."""

    names: dict[str, str] = field(default_factory=dict)
    # expressions assumed >= 0 to resolve a clamp (Max(0, 64 - s)); see braze.frontends.clamps
    assumed: list[SymDim] = field(default_factory=list)
    # decisions taken for symbols >= 2: (symbols, holds(binding), what), checked at 0 and 1
    decisions: list[tuple] = field(default_factory=list)

    def take_decisions(self) -> list[tuple]:
        """The decisions recorded since the last call (braze.frontends.small_sizes)."""
        out, self.decisions = self.decisions, []
        return out

    def bind(self, symbol: str, name: str) -> None:
        self.names.setdefault(symbol, _sanitize(name))

    def sym(self, x) -> SymDim:
        """A SymDim for an int, a torch SymInt or a sympy expression."""
        if isinstance(x, SymDim):
            return x
        if isinstance(x, bool):
            raise NotRepresentable(f"{x!r} is a bool, not a size")
        if isinstance(x, int):
            return SymDim.of(x)
        expr = _expr(x)
        if expr is None:
            raise NotRepresentable(f"{x!r} is not a size")
        return self._convert(expr)

    def dim(self, x) -> int | str:
        """A Shape dim (int or canonical symbol string) for `x`."""
        return self.sym(x).to_dim()

    def show(self, e) -> str:
        """A torch size expression written with braze's dim names: `(seq - 3) % seq`."""
        return _size_printer(self.names).doprint(e)

    def unrepresentable(self, e, why: str) -> NotRepresentable:
        """NotRepresentable for `e`: `why` with `{}` standing for `e` as braze names it."""
        dims = {self.names[s.name] for s in getattr(e, "free_symbols", ())
                if s.name in self.names}
        return NotRepresentable(why.format(self.show(e)), sorted(dims))

    def _convert(self, e) -> SymDim:
        import sympy

        if e.is_Integer:
            return SymDim.of(int(e))
        if e.is_Symbol:
            name = self.names.get(e.name)
            if name is None:
                if e.name.startswith("u"):
                    raise NotRepresentable(f"size {e.name} depends on tensor data (an unbacked "
                                           "symbol); braze needs sizes known from the input "
                                           "shapes")
                raise NotRepresentable(f"symbol {e.name} is not a dim of any input")
            return SymDim.of(name)
        if isinstance(e, sympy.Add):
            out = SymDim.of(0)
            for a in e.args:
                out = out + self._convert(a)
            return out
        if isinstance(e, sympy.Mul):
            out = SymDim.of(1)
            for a in e.args:
                if a.is_Rational and not a.is_Integer:
                    raise self.unrepresentable(e, "the size {} has a fractional coefficient")
                out = out * self._convert(a)
            return out
        if isinstance(e, sympy.Pow) or type(e).__name__ == "PowByNatural":
            base, ex = e.args
            if not (ex.is_Integer and int(ex) >= 0):
                raise self.unrepresentable(e, "the size {} is not a polynomial")
            out = SymDim.of(1)
            for _ in range(int(ex)):
                out = out * self._convert(base)
            return out
        kind = type(e).__name__
        if kind in ("FloorDiv", "CleanDiv", "IntTrueDiv"):
            a, b = (self._convert(x) for x in e.args)
            split = a.divmod_int(b.const) if b.is_const and kind == "FloorDiv" else None
            if split is not None:  # (8*h + 3) // 2 = 4*h + 1
                return split[0]
            try:
                return a // b
            except ValueError:
                raise self.unrepresentable(e, "the size {} rounds a division down; braze "
                                                "writes sizes as polynomials in the input dims"
                                                + _multiple_hint(a, b)) from None
        if kind == "CeilDiv":
            a, b = (self._convert(x) for x in e.args)
            split = a.divmod_int(b.const) if b.is_const else None
            if split is not None:
                return split[0] + (1 if split[1] else 0)
            try:
                return a // b
            except ValueError:
                raise self.unrepresentable(e, "the size {} rounds a division up; braze writes "
                                                "sizes as polynomials in the input dims"
                                                + _multiple_hint(a, b)) from None
        if kind in ("TruncToInt", "FloorToInt"):
            scaled = self._scaled(e.args[0])
            if scaled is not None:
                return scaled
        if kind in ("Max", "Min") or isinstance(e, (sympy.Max, sympy.Min)):
            is_max = kind == "Max" or isinstance(e, sympy.Max)
            vals = [self._convert(x) for x in e.args]
            best = vals[0]
            for v in vals[1:]:
                lt = decide_lt(best, v)
                if lt is None:
                    best = self.clamp_choice(best, v, is_max, e)
                elif is_max == lt:
                    best = v
            pick = max if is_max else min
            self._decided(vals, lambda env: best.evaluate(env) == pick(
                v.evaluate(env) for v in vals), e)
            return best
        raise self.unrepresentable(e, "the size {} is not a polynomial in the input dims, "
                                       "which is how braze writes sizes")

    def _scaled(self, e) -> SymDim | None:
        """trunc(c * float(size)) (an interpolate by scale_factor c) as a polynomial
        (SymDim.scaled_floor: 0.5 of "32*h" is 16*h), else None."""
        import sympy

        coef, inner = 1.0, []
        for a in (e.args if isinstance(e, sympy.Mul) else (e,)):
            if a.is_Number:
                coef *= float(a)
            else:
                inner.append(a)
        if len(inner) != 1 or type(inner[0]).__name__ != "ToFloat":
            return None
        return self._convert(inner[0].args[0]).scaled_floor(coef)

    def clamp_choice(self, a: SymDim, b: SymDim, is_max: bool, e) -> SymDim:
        """Max / Min of a constant and a size no binding orders (MPT's `max(0, 64 - seq)`):
        the size, with the requirement recorded in `assumed` (braze.frontends.clamps)."""
        choice = clamp_choice(a, b, is_max)
        if choice is None:
            raise self.unrepresentable(e, "cannot decide {} for every size")
        value, need = choice
        if need not in self.assumed:
            self.assumed.append(need)
        return value

    def decide(self, x) -> bool:
        """A torch SymBool (or bool) as a Python bool, deciding relations between sizes under
        the "symbols >= 2" assumption; NotRepresentable when it depends on the sizes."""
        if isinstance(x, bool):
            return x
        import sympy

        e = _expr(x)
        if e is None:
            raise NotRepresentable(f"{x!r} is not a boolean")
        if e is sympy.true or e is sympy.false:
            return bool(e)
        rel = {sympy.Eq: "eq", sympy.Ne: "ne", sympy.Lt: "lt", sympy.Le: "le", sympy.Gt: "gt",
               sympy.Ge: "ge"}.get(type(e))
        if rel is None:
            raise self.unrepresentable(e, "cannot decide {}")
        a, b = (self._convert(v) for v in e.args)
        out = {"eq": lambda: decide_eq(a, b), "ne": lambda: _not(decide_eq(a, b)),
               "lt": lambda: decide_lt(a, b), "ge": lambda: _not(decide_lt(a, b)),
               "gt": lambda: decide_lt(b, a), "le": lambda: _not(decide_lt(b, a))}[rel]()
        if out is None:
            raise self.unrepresentable(e, "{} depends on the input sizes")
        test = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "ge": operator.ge,
                "gt": operator.gt, "le": operator.le}[rel]
        self._decided((a, b), lambda env: test(a.evaluate(env), b.evaluate(env)) == out, e)
        return out

    def _decided(self, dims: Sequence[SymDim], holds, e) -> None:
        """Record a decision about `dims` taken for symbols >= 2 (see `decisions`)."""
        syms = set().union(*(d.symbols for d in dims))
        if syms:
            self.decisions.append((syms, holds, self.show(e)))


_SHOW = {"FloorDiv": "{} // {}", "CleanDiv": "{} // {}", "CeilDiv": "ceil({} / {})",
         "PythonMod": "{} % {}", "Mod": "{} % {}", "IntTrueDiv": "{} / {}",
         "FloatTrueDiv": "{} / {}", "PowByNatural": "{} ** {}", "FloatPow": "{} ** {}",
         "ToFloat": "float({})", "TruncToInt": "trunc({})", "TruncToFloat": "trunc({})",
         "CeilToInt": "ceil({})", "FloorToInt": "floor({})", "RoundToInt": "round({})",
         "Identity": "{}"}


def _size_printer(names: Mapping[str, str]):
    """A sympy printer for torch's size functions (FloorDiv, PythonMod, ToFloat, ...) as Python
    operators, with braze's dim names for torch's symbols."""
    from sympy.printing.str import StrPrinter

    class SizePrinter(StrPrinter):
        printmethod = "_braze_str"  # not torch's `_sympystr`, so the table below applies

        def _print_Symbol(self, s):
            return names.get(s.name, s.name)

        def _print_Function(self, e):
            form = _SHOW.get(type(e).__name__)
            if form is None or form.count("{}") != len(e.args):
                return super()._print_Function(e)
            if len(e.args) == 1:
                return form.format(self._print(e.args[0]))
            return form.format(*(self._arg(a) for a in e.args))

        def _arg(self, a):
            text = self._print(a)
            return text if a.is_Atom or a.is_Function else f"({text})"

    return SizePrinter()


def _not(v: bool | None) -> bool | None:
    return None if v is None else not v


def _expr(x):
    """The sympy expression of a torch SymInt / SymBool / SymFloat, or `x` if it is one."""
    node = getattr(x, "node", None)
    if node is not None and hasattr(node, "expr"):
        return node.expr
    if hasattr(x, "free_symbols"):
        return x
    return None


def decide_eq(a: SymDim, b: SymDim) -> bool | None:
    """a == b for every binding (True / False), or None when it depends on the sizes."""
    if a == b:
        return True
    return False if a.known_ne(b) else None


def decide_lt(a: SymDim, b: SymDim) -> bool | None:
    """a < b for every binding with symbols >= 2, or None when it depends on them."""
    d = b - a
    if d.is_const:
        return d.const > 0
    lb = d.lower_bound()
    if lb is not None and lb > 0:
        return True
    ub = (-d).lower_bound()
    if ub is not None and ub >= 0:
        return False
    return None


def scalar_value(names: SymbolNames, x):
    """A Python scalar for a torch scalar value: ints stay ints (SymInts become SymDims, or ints
    when constant), floats and bools are kept; SymFloats must be constant."""
    if isinstance(x, (bool, int, float)) or x is None:
        return x
    import torch

    if isinstance(x, torch.SymBool):
        return names.decide(x)
    if isinstance(x, torch.SymInt):
        s = names.sym(x)
        return s.const if s.is_const else s
    if isinstance(x, torch.SymFloat):
        e = _expr(x)
        if e is not None and e.is_number:
            return float(e)
        raise names.unrepresentable(e, "{} is a float computed from the input sizes; braze "
                                        "folds size arithmetic at import time into integer "
                                        "sizes")
    raise NotRepresentable(f"{type(x).__name__} is not a scalar")


# -- dynamic_shapes: braze's simple form -> torch.export's ---------------------------------------
def torch_dynamic_shapes(spec, arg_names: Sequence[str]) -> tuple[Any, dict]:
    """(what torch.export takes, labels) for `spec`; labels map (input name, axis) to (dim
    name, whether the name is that of the root symbol of a derived dim such as 2*seq).

    `spec` is torch.export's own form (Dim objects; passed through) or braze's simple one:
    {input name: {axis: "name"}} or {input name: ("batch", None, ...)} (one entry per axis,
    None for static). Named axes become `Dim.AUTO`, so torch infers their ranges (a BERT's
    sequence stops at max_position_embeddings) and the names label the symbols it picks. A
    multiple of a name ("32*h": an image size a strided CNN divides) becomes torch's derived
    dim 32 * Dim("h")."""
    if spec is None:
        return None, {}
    labels: dict[tuple[str, int], tuple[str, bool]] = {}
    if isinstance(spec, Mapping):
        unknown = [k for k in spec if k not in arg_names]
        if unknown:
            raise FrontendError(f"dynamic_shapes names {unknown}, which are not inputs of the "
                                f"module (its inputs: {list(arg_names)})")
        roots: dict = {}
        out = {k: _axes(v, k, labels, roots) for k, v in spec.items()}
        return out, labels
    if isinstance(spec, (tuple, list)):
        if len(spec) > len(arg_names):
            raise FrontendError(f"dynamic_shapes has {len(spec)} entries for "
                                f"{len(arg_names)} inputs")
        roots = {}
        return type(spec)(_axes(v, arg_names[i], labels, roots)
                          for i, v in enumerate(spec)), labels
    raise FrontendError(f"dynamic_shapes must be a dict keyed by input name or a tuple, got "
                        f"{type(spec).__name__}")


def _axes(v, input_name: str, labels: dict, roots: dict):
    if v is None:
        return None
    if isinstance(v, Mapping):
        return {int(ax): _one(d, input_name, int(ax), labels, roots) for ax, d in v.items()}
    if isinstance(v, (tuple, list)):
        return type(v)(_one(d, input_name, ax, labels, roots) for ax, d in enumerate(v))
    raise FrontendError(f"dynamic_shapes[{input_name!r}] must map axes to dim names, got "
                        f"{v!r}")


def _one(d, input_name: str, axis: int, labels: dict, roots: dict):
    """One axis: a name ("seq": Dim.AUTO, labelled), a multiple of a name ("32*h": torch's
    derived dim 32 * Dim("h"), one root per name), a torch Dim (passed through) or None."""
    from torch.export import Dim

    if d is None:
        return None
    if isinstance(d, str):
        coef, _, root = d.replace(" ", "").rpartition("*")
        if coef.isdigit() and int(coef) >= 1 and _sanitize(root) == root:
            labels[(input_name, axis)] = (root, True)
            if root not in roots:
                roots[root] = Dim(_torch_root_name(root), min=1)
            return int(coef) * roots[root]
        if not _sanitize(d) == d:
            raise FrontendError(f"dynamic_shapes[{input_name!r}][{axis}] = {d!r}: dims must be "
                                "names such as 'batch' or 'seq', or a multiple of one such as "
                                "'32*h'")
        labels[(input_name, axis)] = (d, False)
        return Dim.AUTO
    name = dim_name(d)
    if name is not None:
        labels[(input_name, axis)] = (name, getattr(d, "root", None) is not None)
    return d


def _torch_root_name(root: str) -> str:
    """The name braze gives torch's Dim for the user's root `root` ("h" of "32*h"): torch reads
    it with sympy, which takes "len", "max", "N", "E" or "pi" for a builtin, function or
    constant (multiplying one then fails, or means something else), so such a name gets a
    suffix; `labels` keeps the user's."""
    import sympy

    try:
        parsed = sympy.sympify(root)
    except (sympy.SympifyError, SyntaxError, TypeError):
        parsed = None
    plain = isinstance(parsed, sympy.Symbol) and parsed.name == root
    return root if plain else f"{root}_dim"


def dim_name(d) -> str | None:
    """The user's name of a torch.export Dim (its root's for a derived dim), else None."""
    root = getattr(d, "root", None)
    if root is not None:
        return getattr(root, "__name__", None)
    name = getattr(d, "__name__", None)
    return name if isinstance(name, str) and name.isidentifier() else None


def export_excludes(ep, names: SymbolNames, sizes, seen: set[str]) -> tuple:
    """Input exclusions (braze.ir.ops.io.Input) for the size symbols of `sizes` whose range
    torch.export limited: above its upper bound, and below a lower bound past braze's own
    assumption (>= 2; torch's usual minimum of 2 is no limit here, braze runs sizes 0 and 1).
    The program is valid in that range only (a slice `x[:, :64]` under seq <= 64 exports as all
    of x), so a feed outside it is refused rather than run. Symbols in `seen` are skipped and
    the new ones added (one input carries each symbol's exclusions). A derived dim (`2 * x`)
    limits each of its symbols."""
    from torch.utils._sympy.numbers import int_oo

    out = []
    for expr in _size_symbols(sizes):
        name = names.names.get(expr.name)
        vr = ep.range_constraints.get(expr) if name is not None else None
        if vr is None or name in seen:
            continue
        hi = None if vr.upper == int_oo else int(vr.upper)
        lo = int(vr.lower) if int(vr.lower) > 2 else 0
        why = (f"torch.export made the program for {name} in {lo}.."
               f"{'' if hi is None else hi} (its range constraints); export with a wider "
               "Dim(min=, max=) to run other sizes")
        if hi is not None:
            out.append((name, hi + 1, None, why))
        if lo > 0:
            out.append((name, 0, lo - 1, why))
        seen.add(name)
    return tuple(out)


def _size_symbols(sizes) -> list:
    """The sympy symbols of the torch sizes `sizes`, in order (a derived dim's, by name)."""
    out = []
    for d in sizes:
        expr = getattr(getattr(d, "node", None), "expr", None)
        syms = sorted(getattr(expr, "free_symbols", ()), key=lambda s: s.name)
        out += [s for s in syms if getattr(s, "is_Symbol", False) and s not in out]
    return out
