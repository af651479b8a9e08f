"""Builder methods for graph inputs, params and constants."""
from __future__ import annotations

import numpy as np

from ...errors import GraphError
from ..dtypes import DType
from ..op import Value
from ..ops.io import Constant, Input, Param
from ..shapes import Shape
from ..weights import DeferredWeight


class SourceBuilder:
    def input(self, name: str, shape: Shape, excludes=()) -> Value:
        """A graph input named `name` (the feed key); `excludes` as Input's: (dim, lowest,
        highest or None, why) spans of sizes the graph does not hold for."""
        self._check_source_name(name)
        excludes = tuple((d, int(lo), None if hi is None else int(hi), str(why))
                         for d, lo, hi, why in excludes)
        v = self.add_node(Input(name, _as_shape(shape), excludes), (), name=name)[0]
        self.input_ids.append(v.node)
        return v

    def param(self, name: str, shape: Shape,
              value: np.ndarray | DeferredWeight | None = None) -> Value:
        """A weight named `name`; `value` (optional) is stored in `Graph.weights`."""
        self._check_source_name(name)
        shape = _as_shape(shape)
        v = self.add_node(Param(name, shape), (), name=name)[0]
        self.param_ids.append(v.node)
        if value is not None:
            self.set_weight(name, value)
        return v

    def set_weight(self, name: str, value: np.ndarray | DeferredWeight) -> None:
        """Store the value of param `name`, checking shape and dtype (a DeferredWeight must
        declare the param's)."""
        node = self.node_by_name(name)
        if not isinstance(node.op, Param):
            raise GraphError(f"{name!r} is not a param of graph {self.name!r}")
        want = node.op.shape
        if isinstance(value, DeferredWeight):  # computed when first read (braze.ir.weights)
            if not want.is_static or value.shape != want.dims or value.dtype != want.dtype.np:
                raise GraphError(f"weight {name!r} ({value!r}) does not match param {want}")
            self.weights[name] = value
            return
        arr = np.asarray(value)
        if not want.is_static or tuple(arr.shape) != want.dims:
            raise GraphError(f"weight {name!r} has shape {arr.shape}, param declares {want}")
        self.weights[name] = arr.astype(want.dtype.np, copy=False)

    def constant(self, value, dtype: DType | None = None) -> Value:
        """A literal tensor (scalar, list or ndarray)."""
        arr = np.asarray(value, dtype=dtype.np if dtype is not None else None)
        if dtype is None and arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        return self.add_node(Constant(arr), ())[0]

    def _check_source_name(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise GraphError(f"input/param names must be non-empty strings, got {name!r}")


def _as_shape(shape) -> Shape:
    if isinstance(shape, Shape):
        return shape
    if isinstance(shape, (tuple, list)):
        return Shape(tuple(shape))
    raise GraphError(f"expected a bz.Shape, got {shape!r}")
