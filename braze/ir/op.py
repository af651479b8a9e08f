"""The op contract: one frozen dataclass per op kind, with shape/dtype inference and a NumPy
reference side by side, plus `decompose` for composite (fused / logical) kinds.

Other layers (autodiff, kernels, ONNX) register against op classes in their own packages; this
module only keeps the registry of kinds so text IR and JSON can name them."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ..errors import ShapeError
from .shapes import Shape

if TYPE_CHECKING:
    from .graph import Graph

OP_REGISTRY: dict[str, type[Op]] = {}


@dataclass(frozen=True, slots=True)
class Value:
    """Output `index` of node `node`. Values are plain handles; ask the graph for their shape."""

    node: int
    index: int = 0

    def __repr__(self) -> str:
        return f"%{self.node}" if self.index == 0 else f"%{self.node}.{self.index}"


@dataclass(frozen=True)
class Op:
    """Base of every op kind. Subclasses are frozen dataclasses whose fields are the attributes.

    Class-level facts:
      kind         -- the name used in text IR, JSON and reports ("matmul", "layer_norm", ...)
      arity        -- number of inputs, or None when variadic (`min_arity` then applies)
      elementwise  -- output element i depends only on input elements at i (after broadcasting)
      composite    -- the op has a `decompose` into simpler ops (fused and logical kinds)
      fused        -- a fused kind made by a fusion pass; unfuse expands exactly these
      source       -- graph inputs, params and constants: no inputs, no reference call
    """

    kind: ClassVar[str] = ""
    arity: ClassVar[int | None] = None
    min_arity: ClassVar[int] = 0
    elementwise: ClassVar[bool] = False
    composite: ClassVar[bool] = False
    fused: ClassVar[bool] = False
    source: ClassVar[bool] = False

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        kind = cls.__dict__.get("kind")
        if kind:
            if kind in OP_REGISTRY and OP_REGISTRY[kind].__qualname__ != cls.__qualname__:
                raise TypeError(f"op kind {kind!r} registered twice")
            OP_REGISTRY[kind] = cls

    # -- the three definitions every op gives ---------------------------------------------------
    def infer(self, ins: tuple[Shape, ...]) -> Shape | tuple[Shape, ...]:
        """Output shape(s) from input shapes; raise ShapeError on a mismatch."""
        raise NotImplementedError(f"{type(self).__name__}.infer")

    def reference(self, *xs: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
        """NumPy meaning of the op. Composite ops default to interpreting their decomposition."""
        if self.composite:
            from ..interpret import reference_via_decomposition

            return reference_via_decomposition(self, xs)
        raise NotImplementedError(f"{type(self).__name__}.reference")

    def decompose(self, g: Graph, ins: Sequence[Value]) -> Value | tuple[Value, ...]:
        """Build this op out of simpler ops in `g`, reading `ins`; return its output value(s)."""
        raise NotImplementedError(f"{type(self).__name__} is not composite")

    def param_init_hint(self, position: int) -> str | None:
        """How `init_params` should draw a param feeding input `position`: "one" (a scale such as
        a norm gamma), "positive" (a variance), or None (default)."""
        return None

    # -- conveniences ---------------------------------------------------------------------------
    @property
    def label(self) -> str:
        """The name reports count this op under: the kind, or the function for unary/binary."""
        return self.kind

    @classmethod
    def labels(cls) -> tuple[str, ...]:
        """Every `label` an op of this kind can have (targets claim ops by label)."""
        return (cls.kind,)

    def check_arity(self, n: int) -> None:
        if self.arity is not None and n != self.arity:
            raise ShapeError(f"{self.kind} takes {self.arity} inputs, got {n}")
        if self.arity is None and n < self.min_arity:
            raise ShapeError(f"{self.kind} takes at least {self.min_arity} inputs, got {n}")


def op_class(kind: str) -> type[Op]:
    """The op class registered under `kind`."""
    from . import ops  # noqa: F401  (registers every kind)

    try:
        return OP_REGISTRY[kind]
    except KeyError:
        raise ShapeError(f"unknown op kind {kind!r}") from None


def require(cond: bool, msg: str) -> None:
    """Raise ShapeError(msg) unless cond: the one-liner inference rules use."""
    if not cond:
        raise ShapeError(msg)


def same_dtype(op: Op, ins: Sequence[Shape]) -> None:
    """All inputs share one dtype, else ShapeError naming the op."""
    dts = {s.dtype for s in ins}
    require(len(dts) <= 1, f"{op.kind} needs one dtype, got {', '.join(str(s) for s in ins)}")
