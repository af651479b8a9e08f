"""The autodiff rule registry: VJP and JVP rules registered against op classes (JAX-style), the
explicit `non_differentiable` marks, and `unbroadcast`, the helper most rules need.

A VJP rule is `rule(b, node, ins, outs, cts) -> one cotangent per input of node`:
  b     -- the graph being built (the rule adds nodes to it with the ordinary builder methods);
  node  -- the ORIGINAL node (read `node.op`'s attributes, `node.outputs` for types);
  ins   -- the node's primal inputs, as values in `b`;
  outs  -- the node's primal outputs, as values in `b`;
  cts   -- a cotangent per output, `None` meaning zero.
It returns one cotangent per input, `None` meaning zero / no gradient (integer and bool inputs).

A JVP rule is `rule(b, node, ins, outs, tangents) -> one tangent per output`, where `tangents`
has one entry per input (`None` = zero).

Rules live in `braze.autodiff.rules.<family>`; every module in that package is imported the first
time a rule is looked up. An op with no rule but a `decompose` (fused and logical kinds) is
differentiated through its decomposition (see `prepare_graph_for_ad`). Rules should emit
differentiable ops, so gradient graphs can be differentiated again (higher orders)."""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Sequence
from typing import Literal

from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.op import Op, Value
from ..ir.shapes import Dim, Shape

__all__ = ["VjpRule", "JvpRule", "vjp_rule", "jvp_rule", "non_differentiable", "get_vjp",
           "get_jvp", "differentiability", "non_differentiable_reason", "unbroadcast",
           "load_rules", "Differentiability"]

VjpRule = Callable[[Graph, Node, Sequence[Value], Sequence[Value], Sequence["Value | None"]],
                   Sequence["Value | None"]]
JvpRule = Callable[[Graph, Node, Sequence[Value], Sequence[Value], Sequence["Value | None"]],
                   Sequence["Value | None"]]
Differentiability = Literal["rule", "decomposition", "non_differentiable"]

_VJP: dict[type[Op], VjpRule] = {}
_JVP: dict[type[Op], JvpRule] = {}
_NON_DIFF: dict[type[Op], str] = {}
_loaded = False


def _register(table: dict, op_classes: tuple[type[Op], ...], what: str):
    if not op_classes:
        raise TypeError(f"{what}() needs at least one op class")
    for cls in op_classes:
        if not (isinstance(cls, type) and issubclass(cls, Op)):
            raise TypeError(f"{what}() takes op classes, got {cls!r}")

    def decorate(fn):
        for cls in op_classes:
            if cls in table and table[cls] is not fn:
                raise TypeError(f"{what} for {cls.__name__} registered twice "
                                f"({table[cls].__module__} and {fn.__module__})")
            table[cls] = fn
        return fn

    return decorate


def vjp_rule(*op_classes: type[Op]) -> Callable[[VjpRule], VjpRule]:
    """Decorator: register the function as the VJP (reverse-mode) rule of `op_classes`."""
    return _register(_VJP, op_classes, "vjp_rule")


def jvp_rule(*op_classes: type[Op]) -> Callable[[JvpRule], JvpRule]:
    """Decorator: register the function as the JVP (forward-mode) rule of `op_classes`."""
    return _register(_JVP, op_classes, "jvp_rule")


def non_differentiable(op_class: type[Op], reason: str) -> None:
    """Mark `op_class` as having no gradient (compares, argmax, integer ops), with the reason
    errors and the completeness test quote. Its inputs receive no cotangent and its outputs
    have zero tangent."""
    if not reason:
        raise ValueError(f"non_differentiable({op_class.__name__}) needs a reason")
    _NON_DIFF[op_class] = reason


def load_rules() -> None:
    """Import every rule module under `braze.autodiff.rules` (once)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    from . import rules

    for info in sorted(pkgutil.iter_modules(rules.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{rules.__name__}.{info.name}")


def _lookup(table: dict, op: Op | type[Op]):
    load_rules()
    cls = op if isinstance(op, type) else type(op)
    for base in cls.__mro__:
        if base in table:
            return table[base]
    return None


def get_vjp(op: Op | type[Op]) -> VjpRule | None:
    """The VJP rule registered for `op`'s class (or a base class), or None."""
    return _lookup(_VJP, op)


def get_jvp(op: Op | type[Op]) -> JvpRule | None:
    """The JVP rule registered for `op`'s class (or a base class), or None."""
    return _lookup(_JVP, op)


def non_differentiable_reason(op: Op | type[Op]) -> str | None:
    """The reason `op`'s class was marked non-differentiable, or None."""
    return _lookup(_NON_DIFF, op)


def differentiability(op_class: Op | type[Op]) -> Differentiability | None:
    """How autodiff handles this op kind: "rule" (a VJP rule), "decomposition" (composite:
    differentiated through `decompose`), "non_differentiable" (marked, with a reason), or None
    when it has none of these (the completeness test fails on that)."""
    cls = op_class if isinstance(op_class, type) else type(op_class)
    if get_vjp(cls) is not None:
        return "rule"
    if non_differentiable_reason(cls) is not None:
        return "non_differentiable"
    if cls.composite:
        return "decomposition"
    return None


def unbroadcast(b: Graph, ct: Value, shape: Shape | Sequence[Dim]) -> Value:
    """Sum cotangent `ct` down to `shape` (the inverse of NumPy broadcasting): leading axes `ct`
    has beyond `shape` are summed away, and axes where `shape` has 1 but `ct` does not are summed
    with keepdims. Symbolic dims compare by name; a symbol is never a broadcasting 1."""
    dims = tuple(shape.dims if isinstance(shape, Shape) else shape)
    ct_dims = b.shape_of(ct).dims
    if ct_dims == dims:
        return ct
    lead = len(ct_dims) - len(dims)
    if lead < 0:
        raise ValueError(f"unbroadcast: cotangent dims {ct_dims} have lower rank than {dims}")
    if lead:
        ct = b.sum(ct, tuple(range(lead)))
    ones = tuple(i for i, (c, d) in enumerate(zip(ct_dims[lead:], dims)) if d == 1 and c != 1)
    if ones:
        ct = b.sum(ct, ones, keepdims=True)
    return ct
