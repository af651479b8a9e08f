"""RLX's output-shape arguments on braze builders. RLX's builders take the output `Shape` from
the caller; braze infers it, so builders that keep RLX's positional order accept the argument
as an optional check: `check_shape` raises a ShapeError when it disagrees with the inference."""
from __future__ import annotations

from ...errors import ShapeError
from ..shapes import Shape

__all__ = ["check_shape"]


def check_shape(what: str, got: Shape, shape) -> None:
    """`shape` is None (nothing to check), a bz.Shape (dims and dtype) or a dims tuple."""
    if shape is None:
        return
    want_dims = tuple(shape.dims if isinstance(shape, Shape) else shape)
    if want_dims != got.dims or (isinstance(shape, Shape) and shape.dtype != got.dtype):
        raise ShapeError(f"{what}: the given output shape {shape} differs from the inferred "
                         f"{got}; braze infers output shapes, so the argument can be left out")
