"""Source ops: graph inputs, parameters (weights) and constants."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dtypes import dtype_from_numpy
from ..op import Op
from ..shapes import Shape


@dataclass(frozen=True)
class Input(Op):
    """A graph input fed at run time; `shape` may hold symbolic dims."""

    kind = "input"
    arity = 0
    source = True
    name: str
    shape: Shape

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
