"""AxonML-style `FusedElementwise`: a chain of `ElementwiseOp`s (scalar add/mul, activations,
math, clamp) evaluated as ONE braze ElementwiseRegion whose body holds braze's own elementwise
ops, plus the fluent builder and the AxonML convenience constructors."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from ...interpret import interpret
from ...ir.dtypes import DType, dtype_from_numpy
from ...ir.graph import Graph
from ...ir.op import Value
from ...ir.ops.region import ElementwiseRegion, region_input_name
from ...ir.shapes import Shape
from .linear import numeric_array

__all__ = ["ElementwiseOp", "FusedElementwise", "FusedElementwiseBuilder", "fused_add_relu",
           "fused_mul_add", "fused_scale_bias_relu", "fuse_elementwise"]

# name -> (AxonML variant name, how to emit it into a braze graph)
_EMIT: dict[str, tuple[str, Callable[..., Value]]] = {
    "add_const": ("AddConst", lambda g, x, c: g.add(x, c)),
    "mul_const": ("MulConst", lambda g, x, c: g.mul(x, c)),
    "relu": ("Relu", lambda g, x: g.relu(x)),
    "leaky_relu": ("LeakyRelu", lambda g, x, a: g.leaky_relu(x, a)),
    "sigmoid": ("Sigmoid", lambda g, x: g.sigmoid(x)),
    "tanh": ("Tanh", lambda g, x: g.tanh(x)),
    "exp": ("Exp", lambda g, x: g.exp(x)),
    "log": ("Log", lambda g, x: g.log(x)),
    "sqrt": ("Sqrt", lambda g, x: g.sqrt(x)),
    "square": ("Square", lambda g, x: g.square(x)),
    "clamp": ("Clamp", lambda g, x, lo, hi: g.clamp(x, lo, hi)),
    "neg": ("Neg", lambda g, x: g.neg(x)),
    "abs": ("Abs", lambda g, x: g.abs(x)),
}


@dataclass(frozen=True)
class ElementwiseOp:
    """One step of a fused chain. Build with the AxonML variant names: `ElementwiseOp.Relu`,
    `ElementwiseOp.AddConst(1.0)`, `ElementwiseOp.LeakyRelu(0.1)`, `ElementwiseOp.Clamp(0, 6)`.
    Log is the natural log."""

    name: str
    args: tuple[float, ...] = ()

    def __post_init__(self):
        if self.name not in _EMIT:
            raise ValueError(f"unknown elementwise op {self.name!r}; known: {', '.join(_EMIT)}")
        object.__setattr__(self, "args", tuple(float(a) for a in self.args))

    def emit(self, g: Graph, x: Value) -> Value:
        """Append this step to braze graph `g`, reading `x`."""
        return _EMIT[self.name][1](g, x, *self.args)

    def __repr__(self) -> str:
        variant = _EMIT[self.name][0]
        args = f"({', '.join(map(repr, self.args))})" if self.args else ""
        return f"ElementwiseOp.{variant}{args}"

    # parameterized variants (the unit variants are attached below as class attributes)
    @staticmethod
    def AddConst(c: float) -> ElementwiseOp:
        return ElementwiseOp("add_const", (c,))

    @staticmethod
    def MulConst(c: float) -> ElementwiseOp:
        return ElementwiseOp("mul_const", (c,))

    @staticmethod
    def LeakyRelu(alpha: float = 0.01) -> ElementwiseOp:
        return ElementwiseOp("leaky_relu", (alpha,))

    @staticmethod
    def Clamp(lo: float, hi: float) -> ElementwiseOp:
        if lo > hi:
            raise ValueError(f"Clamp needs min <= max, got {lo} > {hi}")
        return ElementwiseOp("clamp", (lo, hi))


for _name in ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "square", "neg", "abs"):
    setattr(ElementwiseOp, _EMIT[_name][0], ElementwiseOp(_name))


class FusedElementwise:
    """A chain of ElementwiseOps run as one braze ElementwiseRegion.

    `forward(x)` applies the ops in order to x of any shape; non-float inputs are computed in
    float32. The region (one per dtype and rank) is built on first use and cached."""

    def __init__(self, ops: Iterable[ElementwiseOp] = ()):
        self._ops = tuple(ops)
        for op in self._ops:
            if not isinstance(op, ElementwiseOp):
                raise TypeError(f"FusedElementwise takes ElementwiseOps, got {op!r}")
        self._graphs: dict[tuple[DType, int], Graph] = {}

    @staticmethod
    def builder() -> FusedElementwiseBuilder:
        return FusedElementwiseBuilder()

    @property
    def ops(self) -> tuple[ElementwiseOp, ...]:
        return self._ops

    def __len__(self) -> int:
        return len(self._ops)

    def __repr__(self) -> str:
        return f"FusedElementwise([{', '.join(map(repr, self._ops))}])"

    def body(self, shape: Shape) -> Graph:
        """The region body for inputs of type `shape`: input in0, then one node per op."""
        g = Graph("axonml_fused_elementwise", record_provenance=False)
        x = g.input(region_input_name(0), shape)
        for op in self._ops:
            x = op.emit(g, x)
        g.set_outputs([x])
        return g

    def region(self, shape: Shape) -> ElementwiseRegion:
        """The braze ElementwiseRegion op this chain is, for inputs of type `shape`."""
        return ElementwiseRegion(self.body(shape))

    def apply_to(self, g: Graph, x: Value) -> Value:
        """Append the chain to braze graph `g` as one region node reading `x`."""
        return g.elementwise_region(self.body(g.shape_of(x)), [x])

    def graph(self, dtype: DType, rank: int) -> Graph:
        """A one-node braze graph (input x with symbolic dims -> region) for this dtype/rank."""
        key = (dtype, rank)
        if key not in self._graphs:
            g = Graph("axonml_fused_elementwise", record_provenance=False)
            x = g.input("x", Shape(tuple(f"d{i}" for i in range(rank)), dtype))
            g.set_outputs([self.apply_to(g, x)])
            self._graphs[key] = g
        return self._graphs[key]

    def forward(self, x) -> np.ndarray:
        """The chain applied to `x`, elementwise."""
        arr = numeric_array(x, "FusedElementwise input")
        if arr.dtype.kind != "f":
            arr = arr.astype(np.float32)
        (y,) = interpret(self.graph(dtype_from_numpy(arr.dtype), arr.ndim), {"x": arr})
        return y

    __call__ = forward


class FusedElementwiseBuilder:
    """Fluent builder: `FusedElementwise.builder().mul(2.0).add(1.0).relu().build()`."""

    def __init__(self):
        self._ops: list[ElementwiseOp] = []

    def _push(self, op: ElementwiseOp) -> FusedElementwiseBuilder:
        self._ops.append(op)
        return self

    def add(self, c: float) -> FusedElementwiseBuilder:
        return self._push(ElementwiseOp.AddConst(c))

    def mul(self, c: float) -> FusedElementwiseBuilder:
        return self._push(ElementwiseOp.MulConst(c))

    def relu(self) -> FusedElementwiseBuilder:
        return self._push(ElementwiseOp.Relu)

    def leaky_relu(self, alpha: float = 0.01) -> FusedElementwiseBuilder:
        return self._push(ElementwiseOp.LeakyRelu(alpha))

    def sigmoid(self) -> FusedElementwiseBuilder:
        return self._push(ElementwiseOp.Sigmoid)

    def tanh(self) -> FusedElementwiseBuilder:
        return self._push(ElementwiseOp.Tanh)

    def exp(self) -> FusedElementwiseBuilder:
        return self._push(ElementwiseOp.Exp)

    def log(self) -> FusedElementwiseBuilder:
        return self._push(ElementwiseOp.Log)

    def sqrt(self) -> FusedElementwiseBuilder:
        return self._push(ElementwiseOp.Sqrt)

    def square(self) -> FusedElementwiseBuilder:
        return self._push(ElementwiseOp.Square)

    def clamp(self, min: float, max: float) -> FusedElementwiseBuilder:
        return self._push(ElementwiseOp.Clamp(min, max))

    def neg(self) -> FusedElementwiseBuilder:
        return self._push(ElementwiseOp.Neg)

    def abs(self) -> FusedElementwiseBuilder:
        return self._push(ElementwiseOp.Abs)

    def build(self) -> FusedElementwise:
        return FusedElementwise(self._ops)


def fused_add_relu(bias: float) -> FusedElementwise:
    """`relu(x + bias)`."""
    return FusedElementwise([ElementwiseOp.AddConst(bias), ElementwiseOp.Relu])


def fused_mul_add(scale: float, bias: float) -> FusedElementwise:
    """`x * scale + bias` (FMA-style)."""
    return FusedElementwise([ElementwiseOp.MulConst(scale), ElementwiseOp.AddConst(bias)])


def fused_scale_bias_relu(scale: float, bias: float) -> FusedElementwise:
    """`relu(x * scale + bias)` (folded-norm style)."""
    return FusedElementwise([ElementwiseOp.MulConst(scale), ElementwiseOp.AddConst(bias),
                             ElementwiseOp.Relu])


def fuse_elementwise(ops: Iterable[ElementwiseOp]) -> FusedElementwise:
    """A FusedElementwise running `ops` in order."""
    return FusedElementwise(ops)
