"""Matrix products: `matmul` (NumPy matmul semantics, batched and broadcast) and `dot_general`
(explicit batch and contracting dims, XLA-style)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..op import Op, require, same_dtype
from ..shapes import Shape, broadcast_dims


def _dims_equal(a, b) -> bool:
    return a == b


@dataclass(frozen=True)
class MatMul(Op):
    """`a @ b` exactly as NumPy: 1-D operands are promoted and squeezed, batch dims broadcast.
    Linear weights are `[in, out]`."""

    kind = "matmul"
    arity = 2

    def infer(self, ins):
        a, b = ins
        same_dtype(self, ins)
        require(a.rank >= 1 and b.rank >= 1, "matmul operands must have rank >= 1")
        ad = a.dims if a.rank > 1 else (1,) + a.dims
        bd = b.dims if b.rank > 1 else b.dims + (1,)
        require(_dims_equal(ad[-1], bd[-2]),
                f"contracting dims differ: {a} @ {b} ({ad[-1]} vs {bd[-2]})")
        batch = broadcast_dims(ad[:-2], bd[:-2])
        out = batch + (ad[-2], bd[-1])
        if a.rank == 1:
            out = out[:-2] + out[-1:]
        if b.rank == 1:
            out = out[:-1]
        return Shape(out, a.dtype)

    def reference(self, a, b):
        ct = _accumulate_dtype(a.dtype)
        return np.matmul(a.astype(ct, copy=False), b.astype(ct, copy=False)).astype(
            a.dtype, copy=False)


@dataclass(frozen=True)
class DotGeneral(Op):
    """Generalized contraction: output dims are batch dims, then lhs free dims, then rhs free
    dims (each in their original order)."""

    kind = "dot_general"
    arity = 2
    lhs_contract: tuple[int, ...]
    rhs_contract: tuple[int, ...]
    lhs_batch: tuple[int, ...] = ()
    rhs_batch: tuple[int, ...] = ()

    def _check(self, a: Shape, b: Shape):
        require(len(self.lhs_contract) == len(self.rhs_contract),
                "dot_general needs as many lhs as rhs contracting dims")
        require(len(self.lhs_batch) == len(self.rhs_batch),
                "dot_general needs as many lhs as rhs batch dims")
        for dims, s, side in ((self.lhs_contract + self.lhs_batch, a, "lhs"),
                              (self.rhs_contract + self.rhs_batch, b, "rhs")):
            require(all(0 <= d < s.rank for d in dims), f"{side} dims {dims} out of range for {s}")
            require(len(set(dims)) == len(dims), f"{side} dims {dims} repeat an axis")
        for i, j in zip(self.lhs_contract, self.rhs_contract, strict=True):
            require(a.dims[i] == b.dims[j], f"contracting dims differ: lhs[{i}]={a.dims[i]} "
                    f"vs rhs[{j}]={b.dims[j]}")
        for i, j in zip(self.lhs_batch, self.rhs_batch, strict=True):
            require(a.dims[i] == b.dims[j], f"batch dims differ: lhs[{i}]={a.dims[i]} "
                    f"vs rhs[{j}]={b.dims[j]}")

    def free_dims(self, rank: int, side: str) -> list[int]:
        used = set(self.lhs_contract + self.lhs_batch) if side == "lhs" else set(
            self.rhs_contract + self.rhs_batch)
        return [d for d in range(rank) if d not in used]

    def infer(self, ins):
        a, b = ins
        same_dtype(self, ins)
        self._check(a, b)
        out = [a.dims[d] for d in self.lhs_batch]
        out += [a.dims[d] for d in self.free_dims(a.rank, "lhs")]
        out += [b.dims[d] for d in self.free_dims(b.rank, "rhs")]
        return Shape(out, a.dtype)

    def reference(self, a, b):
        letters = iter("abcdefghijklmnopqrstuvwxyz")
        la = [next(letters) for _ in range(a.ndim)]
        lb = [next(letters) for _ in range(b.ndim)]
        for i, j in zip(self.lhs_contract + self.lhs_batch, self.rhs_contract + self.rhs_batch,
                        strict=True):
            lb[j] = la[i]
        out = [la[d] for d in self.lhs_batch]
        out += [la[d] for d in self.free_dims(a.ndim, "lhs")]
        out += [lb[d] for d in self.free_dims(b.ndim, "rhs")]
        spec = f"{''.join(la)},{''.join(lb)}->{''.join(out)}"
        ct = _accumulate_dtype(a.dtype)
        return np.einsum(spec, a.astype(ct, copy=False), b.astype(ct, copy=False)).astype(
            a.dtype, copy=False)


def _accumulate_dtype(dt: np.dtype) -> np.dtype:
    """Products of 16-bit floats accumulate in float32 (NumPy's matmul gives bfloat16 inputs a
    float32 result and einsum refuses them); the result is rounded back to the input dtype."""
    return np.dtype(np.float32) if dt.name in ("bfloat16", "float16") else dt
