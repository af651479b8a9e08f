"""Builder methods for matrix products and the plain linear-layer helpers."""
from __future__ import annotations

from ..op import Value
from ..ops.elementwise import UnaryFn
from ..ops.linalg import DotGeneral, MatMul
from .rlx_args import check_shape


class LinalgBuilder:
    def matmul(self, a: Value, b: Value, shape=None) -> Value:
        """`a @ b` with NumPy semantics (RLX's `out_shape`, when given, is checked)."""
        out = self.add_node(MatMul(), (a, b))[0]
        check_shape("matmul", self.shape_of(out), shape)
        return out

    mm = matmul

    def dot_general(self, a: Value, b: Value, lhs_contract, rhs_contract, lhs_batch=(),
                    rhs_batch=()) -> Value:
        op = DotGeneral(tuple(lhs_contract), tuple(rhs_contract), tuple(lhs_batch),
                        tuple(rhs_batch))
        return self.add_node(op, (a, b))[0]

    def linear_bias(self, x: Value, w: Value, b: Value) -> Value:
        """`x @ w + b` written as primitives (fusion passes recognize it)."""
        return self.add(self.matmul(x, w), b)

    def linear_bias_act(self, x: Value, w: Value, b: Value, act: UnaryFn | str) -> Value:
        """`act(x @ w + b)` written as primitives."""
        return self.activation(self.linear_bias(x, w, b), act)
