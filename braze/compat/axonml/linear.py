"""AxonML-style `FusedLinear`: `act(x @ weight + bias)` on NumPy arrays, evaluated as one braze
FusedMatMulBiasAct node, so its meaning is braze's. Weights follow braze's linear layout
[in_features, out_features]; Gelu is the tanh approximation, as in AxonML."""
from __future__ import annotations

import enum

import numpy as np

from ...errors import GraphError, ShapeError
from ...interpret import interpret
from ...ir.dtypes import dtype_from_numpy
from ...ir.graph import Graph
from ...ir.ops.elementwise import UnaryFn
from ...ir.ops.fused import FusedMatMulBiasAct
from ...ir.shapes import Shape

__all__ = ["Activation", "FusedLinear", "fuse_matmul_bias", "fuse_matmul_bias_relu",
           "fuse_matmul_bias_gelu"]


class Activation(enum.Enum):
    """Epilogue activation of a FusedLinear. AxonML spellings (None_, Relu, ...) are aliases."""

    NONE = "none"
    RELU = "relu"
    GELU = "gelu"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    SILU = "silu"
    None_ = "none"
    Relu = "relu"
    Gelu = "gelu"
    Sigmoid = "sigmoid"
    Tanh = "tanh"
    Silu = "silu"

    @property
    def unary_fn(self) -> UnaryFn | None:
        """The braze function applied (Gelu -> GELU_APPROX, the tanh form)."""
        return _UNARY[self]


_UNARY = {
    Activation.NONE: None, Activation.RELU: UnaryFn.RELU, Activation.GELU: UnaryFn.GELU_APPROX,
    Activation.SIGMOID: UnaryFn.SIGMOID, Activation.TANH: UnaryFn.TANH,
    Activation.SILU: UnaryFn.SILU,
}


def _float_array(a, what: str = "FusedLinear weight") -> np.ndarray:
    arr = numeric_array(a, what)
    if arr.dtype.kind != "f":
        arr = arr.astype(np.float32)
    dtype_from_numpy(arr.dtype)  # a dtype braze knows
    return arr


def numeric_array(a, what: str) -> np.ndarray:
    """`a` as a NumPy array of real numbers (float, int, bool); anything else (complex, None,
    strings, objects) is a GraphError, never a silent cast (complex would drop its imaginary
    part, None would become NaN)."""
    try:
        arr = np.asarray(a)
    except ValueError as e:  # ragged nested lists
        raise GraphError(f"{what} is no array: {e}") from None
    if arr.dtype.kind not in "fiub":
        raise GraphError(f"{what} must hold real numbers, got dtype {arr.dtype}")
    return arr


class FusedLinear:
    """MatMul + optional bias + activation as one braze FusedMatMulBiasAct node.

    weight [in_features, out_features] (x @ weight), bias [out_features] or None. `forward(x)`
    takes x [in_features] or [batch, in_features] and returns [out_features] or
    [batch, out_features]; x is converted to the weight's dtype. Mismatched shapes raise
    braze's ShapeError."""

    def __init__(self, weight, bias=None, activation: Activation = Activation.NONE):
        w = _float_array(weight)
        if w.ndim != 2:
            raise ShapeError(f"FusedLinear weight must be 2-D [in_features, out_features], got "
                             f"shape {w.shape}")
        b = None if bias is None else _float_array(bias, "FusedLinear bias").astype(
            w.dtype, copy=False)
        if b is not None and b.shape != (w.shape[1],):
            raise ShapeError(f"FusedLinear bias must be [out_features] = [{w.shape[1]}] for "
                             f"weight {w.shape}, got shape {b.shape}")
        self.weight, self.bias = w, b
        self.activation = Activation(activation)
        self.op = FusedMatMulBiasAct(act=self.activation.unary_fn, has_bias=b is not None)
        self.graph = self._build_graph()

    @property
    def in_features(self) -> int:
        return self.weight.shape[0]

    @property
    def out_features(self) -> int:
        return self.weight.shape[1]

    def _build_graph(self) -> Graph:
        dt = dtype_from_numpy(self.weight.dtype)
        g = Graph("axonml_fused_linear", record_provenance=False)
        x = g.input("x", Shape(("batch", self.in_features), dt))
        w = g.param("weight", Shape(self.weight.shape, dt), self.weight)
        b = None if self.bias is None else g.param("bias", Shape(self.bias.shape, dt), self.bias)
        g.set_outputs([g.linear_fused(x, w, b, self.activation.unary_fn)])
        return g

    def forward(self, x) -> np.ndarray:
        """`act(x @ weight + bias)` for x [in_features] or [batch, in_features]."""
        arr = numeric_array(x, "FusedLinear.forward input")
        if arr.ndim not in (1, 2):
            raise ShapeError(f"FusedLinear.forward takes x [in_features] or [batch, "
                             f"in_features], got shape {arr.shape}")
        arr = arr.astype(self.weight.dtype, copy=False)
        x2 = arr.reshape(1, -1) if arr.ndim == 1 else arr
        self._check(x2)
        (y,) = interpret(self.graph, {"x": x2})
        return y.reshape(-1) if arr.ndim == 1 else y

    __call__ = forward

    def _check(self, x2: np.ndarray) -> None:
        dt = dtype_from_numpy(self.weight.dtype)
        ins = [Shape(x2.shape, dt), Shape(self.weight.shape, dt)]
        if self.bias is not None:
            ins.append(Shape(self.bias.shape, dt))
        try:
            self.op.infer(tuple(ins))
        except ShapeError as e:
            raise ShapeError(f"FusedLinear expects {self.in_features} input features (weight "
                             f"{self.weight.shape}), got x with {x2.shape[-1]}: {e}") from None

    def __repr__(self) -> str:
        return (f"FusedLinear({self.in_features} -> {self.out_features}, "
                f"bias={self.bias is not None}, activation={self.activation.name})")


def fuse_matmul_bias(weight, bias) -> FusedLinear:
    """`x @ weight + bias`."""
    return FusedLinear(weight, bias, Activation.NONE)


def fuse_matmul_bias_relu(weight, bias) -> FusedLinear:
    """`relu(x @ weight + bias)`."""
    return FusedLinear(weight, bias, Activation.RELU)


def fuse_matmul_bias_gelu(weight, bias) -> FusedLinear:
    """`gelu_tanh(x @ weight + bias)`."""
    return FusedLinear(weight, bias, Activation.GELU)
