"""The state of one torch import and what converters (ops/) see: the braze graph, what each FX
node became (a braze value, a Python scalar or SymDim, a tuple of those), the current node with
its arguments bound to the ATen schema's names, and helpers for dtypes, scalars and errors.

A converter is `fn(ctx, call) -> result`, registered with `@converter("aten.add.Tensor", ...)`
under the ATen overload's name (or "operator.add" for Python functions on sizes)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import FrontendError
from ...ir.dtypes import DType, bool_, i64
from ...ir.graph import Graph
from ...ir.op import Value
from ...ir.shapes import Shape
from ...ir.symbolic import SymDim
from ..small_sizes import exclude_binding, failing_small_bindings
from .dtypes import braze_dtype
from .symbolic import NotRepresentable, SymbolNames, static_hint

__all__ = ["Call", "TorchContext", "Converter", "CONVERTERS", "converter", "target_key",
           "LazyParam", "Lazy"]

Converter = Callable[["TorchContext", "Call"], Any]
CONVERTERS: dict[str, Converter] = {}


def converter(*keys: str):
    """Register `fn(ctx, call)` for ATen overloads ("aten.add.Tensor") or Python functions
    ("operator.mul")."""

    def deco(fn: Converter) -> Converter:
        for k in keys:
            if k in CONVERTERS:
                raise TypeError(f"torch op {k} has two converters")
            CONVERTERS[k] = fn
        return fn

    return deco


def target_key(target) -> str:
    """The registry name of an FX call target: "aten.add.Tensor", "operator.getitem"."""
    if hasattr(target, "_schema") or type(target).__name__ == "OpOverload":
        return str(target)
    if hasattr(target, "name") and callable(getattr(target, "name", None)):
        return str(target.name())  # higher-order ops
    mod = getattr(target, "__module__", None) or ""
    mod = {"_operator": "operator", "builtins": "builtins"}.get(mod, mod)
    return f"{mod}.{getattr(target, '__name__', repr(target))}"


@dataclass
class LazyParam:
    """A parameter, buffer or lifted constant: a braze param made on first use (so a weight
    only read as a linear layer's matrix is stored once, transposed)."""

    name: str
    array: np.ndarray
    provenance: str


class Lazy:
    """An output of a multi-output op computed only when read (native_layer_norm's mean,
    max_pool2d's indices): unsupported extras fail only if the model uses them."""

    def __init__(self, fn: Callable[[], Any]):
        self._fn = fn
        self._done = False
        self._value = None

    def get(self):
        if not self._done:
            self._value = self._fn()
            self._done = True
        return self._value


@dataclass
class Call:
    """One FX node being converted: `args` holds its arguments by ATen schema name (defaults
    filled in, FX nodes replaced by what they became); Python functions get a0, a1, ..."""

    node: Any
    key: str
    args: dict[str, Any]

    def __getitem__(self, name: str):
        return self.args[name]

    def get(self, name: str, default=None):
        v = self.args.get(name, default)
        return default if v is None else v


@dataclass
class TorchContext:
    g: Graph
    names: SymbolNames
    label: str = "module"
    env: dict = field(default_factory=dict)
    made: dict = field(default_factory=dict)
    node: Any = None
    provenance: str | None = None

    # -- reading arguments ----------------------------------------------------------------------
    def bind(self, node) -> Call:
        """`node`'s arguments by schema name, resolved through `env`."""
        key = target_key(node.target)
        schema = getattr(node.target, "_schema", None)
        if schema is None:
            args = {f"a{i}": self.resolve(a) for i, a in enumerate(node.args)}
            args.update({k: self.resolve(v) for k, v in node.kwargs.items()})
            return Call(node, key, args)
        args: dict[str, Any] = {}
        pos = list(node.args)
        for i, a in enumerate(schema.arguments):
            if i < len(pos) and not a.kwarg_only:
                raw = pos[i]
            elif a.name in node.kwargs:
                raw = node.kwargs[a.name]
            elif a.has_default_value():
                raw = a.default_value
            else:
                raw = None
            args[a.name] = self.resolve(raw)
        return Call(node, key, args)

    def resolve(self, a):
        import torch.fx

        if isinstance(a, torch.fx.Node):
            try:
                v = self.env[a]
            except KeyError:
                raise self.fail(f"reads {a.name}, which was not computed before it") from None
            return v.get() if isinstance(v, Lazy) else v
        if isinstance(a, (list, tuple)):
            return [self.resolve(x) for x in a]
        return a

    # -- values ---------------------------------------------------------------------------------
    def value(self, x, dtype: DType | None = None) -> Value:
        """A braze value for a tensor argument; Python numbers and SymDims become constants of
        `dtype` (default: i64 for ints, f32 for floats, bool for bools)."""
        if isinstance(x, LazyParam):
            x = self._param(x)
        if isinstance(x, Value):
            return x if dtype is None else self.cast(x, dtype)
        if isinstance(x, SymDim) and not x.is_const:
            dt = dtype or i64
            if not (dt.is_int or dt.is_float):
                raise self.fail(f"size {x} cannot become a {dt} tensor")
            return self.g.sym_const((x.to_dim(),), (), dt)
        if isinstance(x, SymDim):
            x = x.const
        if isinstance(x, (bool, int, float, np.number)):
            from ...ir.dtypes import f32

            dt = dtype or (bool_ if isinstance(x, bool) else i64 if isinstance(x, int) else f32)
            return self.g.constant(np.asarray(x).astype(dt.np), dt)
        raise self.fail(f"expected a tensor, got {type(x).__name__} {x!r}")

    def _param(self, p: LazyParam) -> Value:
        v = self.made.get(p.name)
        if v is None:
            from ...ir.dtypes import dtype_from_numpy

            with self.g.provenance_scope(p.provenance):
                v = self.g.param(p.name, Shape(p.array.shape, dtype_from_numpy(p.array.dtype)),
                                 value=p.array)
            self.made[p.name] = v
        return v

    def weight_t(self, x) -> Value:
        """`x` transposed ([out, in] -> [in, out]): for a 2-D stored weight a param named
        `<name>.T` holding the transposed value (made once, here, so fusions see stored
        weights), else a transpose node."""
        if isinstance(x, LazyParam) and x.array.ndim == 2:
            name = f"{x.name}.T"
            if name not in self.made:
                self.made[name] = self._param(LazyParam(name, np.ascontiguousarray(x.array.T),
                                                        x.provenance))
            return self.made[name]
        v = self.value(x)
        rank = self.rank(v)
        if rank < 2:
            return v
        return self.g.transpose(v, tuple(range(rank - 2)) + (rank - 1, rank - 2))

    def is_tensor(self, x) -> bool:
        return isinstance(x, (Value, LazyParam))

    def cast(self, v: Value, dtype: DType) -> Value:
        return v if self.dtype(v) == dtype else self.g.cast(v, dtype)

    def dims(self, v) -> tuple:
        if isinstance(v, LazyParam):
            return tuple(v.array.shape)
        return self.g.shape_of(v).dims

    def rank(self, v) -> int:
        return len(self.dims(v))

    def dtype(self, v) -> DType:
        if isinstance(v, LazyParam):
            from ...ir.dtypes import dtype_from_numpy

            return dtype_from_numpy(v.array.dtype)
        return self.g.shape_of(v).dtype

    def axis(self, axis: int, rank: int) -> int:
        if not -max(rank, 1) <= axis < max(rank, 1):
            raise self.fail(f"dim {axis} is out of range for rank {rank}")
        return axis % rank if rank else 0

    # -- what torch says the current node produces ----------------------------------------------
    def meta(self, index: int | None = None):
        val = self.node.meta.get("val")
        if index is not None and isinstance(val, (list, tuple)):
            val = val[index]
        return val

    def out_dtype(self, index: int | None = None) -> DType:
        val = self.meta(index)
        if val is None or not hasattr(val, "dtype"):
            raise self.fail("torch.export recorded no output type for this node")
        return braze_dtype(val.dtype, self.where())

    def out_dims(self, index: int | None = None) -> tuple:
        val = self.meta(index)
        if val is None or not hasattr(val, "shape"):
            raise self.fail("torch.export recorded no output shape for this node")
        return tuple(self.dim(d) for d in val.shape)

    def dim(self, d) -> int | str:
        """A braze dim for an int, SymDim or torch SymInt."""
        try:
            return self.names.dim(d)
        except NotRepresentable as e:
            raise self.fail(str(e)) from None

    def sym(self, d) -> SymDim:
        try:
            return self.names.sym(d)
        except NotRepresentable as e:
            raise self.fail(str(e)) from None

    def static_int(self, x, what: str) -> int:
        if isinstance(x, SymDim):
            if not x.is_const:
                raise self.fail(f"{what} is {x}, which depends on the input sizes; braze needs "
                                f"it static{static_hint(sorted(x.symbols))}")
            return x.const
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
            raise self.fail(f"{what} must be an int, got {x!r}")
        return int(x)

    def static_ints(self, xs, what: str) -> list[int]:
        if isinstance(xs, (int, SymDim)):
            xs = [xs]
        return [self.static_int(x, what) for x in xs]

    # -- errors ---------------------------------------------------------------------------------
    def where(self) -> str:
        if self.node is None:
            return self.label
        target = target_key(self.node.target) if self.node.op == "call_function" else \
            self.node.op
        prov = f" in module {self.provenance!r}" if self.provenance else ""
        return f"{self.label}: node {self.node.name} ({target}){prov}"

    def fail(self, message: str) -> FrontendError:
        return FrontendError(f"{self.where()}: {message}")

    # -- decisions for sizes >= 2 ---------------------------------------------------------------
    def exclude_small(self, symbols, holds, why: str) -> None:
        """Refuse (`Input.excludes`) each binding of a symbol to 0 or 1 where `holds(binding)`
        is False: a decision this node took for sizes >= 2 (braze.frontends.small_sizes);
        `why` may name `{sym}` and `{value}`."""
        for sym, value in failing_small_bindings(symbols, holds):
            exclude_binding(self.g, sym, value,
                            f"{self.where()}: {why.format(sym=sym, value=value)}")

    def exclude_decided(self) -> None:
        """`exclude_small` for the size decisions SymbolNames took while converting the node."""
        for symbols, holds, what in self.names.take_decisions():
            self.exclude_small(symbols, holds, f"{what} was decided for {{sym}} >= 2 and "
                                               "differs at {sym} = {value}; feed another size")
