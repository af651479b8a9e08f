"""Source ops: graph inputs, parameters (weights) and constants."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dtypes import dtype_from_numpy
from ..op import Op
from ..shapes import Dim, Shape
from ..symbolic import eval_dim


@dataclass(frozen=True)
class Input(Op):
    """A graph input fed at run time; `shape` may hold symbolic dims. `excludes` lists sizes
    the graph does not hold for, as (dim, lowest, highest or None, why): an imported model
    made for a range of sizes only (torch.export's range constraints), or an import decision
    taken for the sizes >= 2 braze assumes (an ONNX Squeeze without axes keeps a symbolic dim
    it would drop at 1). A binding that puts a dim in such a span is refused, saying why
    (`excluded_binding`)."""

    kind = "input"
    arity = 0
    source = True
    name: str
    shape: Shape
    excludes: tuple[tuple[Dim, int, int | None, str], ...] = ()

    def infer(self, ins):
        return self.shape


@dataclass(frozen=True)
class Param(Op):
    """A weight. Its value lives in `Graph.weights[name]` or is supplied at run time."""

    kind = "param"
    arity = 0
    source = True
    name: str
    shape: Shape

    def infer(self, ins):
        return self.shape


@dataclass(frozen=True, eq=False)
class Constant(Op):
    """A literal tensor baked into the graph. Equality compares dtype, shape and bytes."""

    kind = "constant"
    arity = 0
    source = True
    value: np.ndarray

    def __post_init__(self):
        arr = np.array(self.value, copy=True)
        arr.setflags(write=False)
        object.__setattr__(self, "value", arr)

    def infer(self, ins):
        return Shape(self.value.shape, dtype_from_numpy(self.value.dtype))

    def reference(self):
        return self.value

    def __eq__(self, other):
        return (
            isinstance(other, Constant)
            and self.value.dtype == other.value.dtype
            and self.value.shape == other.value.shape
            and self.value.tobytes() == other.value.tobytes()
        )

    def __hash__(self):
        return hash((self.value.dtype.str, self.value.shape, self.value.tobytes()[:256]))

    def scalar(self) -> float | None:
        """The value as a Python number when it holds one element, else None."""
        return self.value.reshape(-1)[0].item() if self.value.size == 1 else None


def excluded_binding(inputs, env) -> str | None:
    """The first exclusion of the Input ops `inputs` that the binding `env` (symbol -> int)
    meets, as a message; None when it meets none (a dim with unbound symbols is not checked)."""
    for op in inputs:
        for dim, lo, hi, why in op.excludes:
            try:
                n = eval_dim(dim, env)
            except KeyError:
                continue
            if lo <= n and (hi is None or n <= hi):
                span = f"= {lo}" if hi == lo else f">= {lo}" if hi is None else f"in {lo}..{hi}"
                return (f"input {op.name!r} binds {dim} = {n}, a size the graph does not hold "
                        f"for ({dim} {span}): {why}")
    return None
