"""`vmap`: vectorize a graph over a new leading batch axis, op by op, with batching rules
registered against op classes (JAX-style `batch_rule`).

A batching rule is `rule(b, node, ins, batched) -> (outs, out_batched)`:
  b        -- the graph being built;
  node     -- the ORIGINAL node (its op's attributes, its output types);
  ins      -- the node's inputs as values in `b`; a batched one has the batch axis in front;
  batched  -- one flag per input (at least one is True, or the rule is not called).
It returns the node's outputs in `b` and one flag per output saying whether it carries the
batch axis in front. A rule may return None to mean "no special form for these flags": a
composite op then falls back to batching its decomposition. An op with neither a rule nor a
decomposition raises AutodiffError naming the node.

Rules live in `braze.autodiff.vmap_rules` (imported on first use)."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ..errors import AutodiffError
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.op import Op, Value
from ..ir.ops.io import Input
from ..ir.shapes import Dim, Shape
from ..ir.symbolic import dim_symbols
from ..passes.cleanup import dead_code_elimination

__all__ = ["vmap", "batch_rule", "get_batch_rule", "batch_graph_into", "BatchRule",
           "DEFAULT_AXIS_NAME"]

DEFAULT_AXIS_NAME = "vmap_batch"

BatchRule = Callable[[Graph, Node, Sequence[Value], Sequence[bool]],
                     "tuple[Sequence[Value], Sequence[bool]] | None"]

_RULES: dict[type[Op], BatchRule] = {}
_loaded = False


def batch_rule(*op_classes: type[Op]) -> Callable[[BatchRule], BatchRule]:
    """Decorator: register the function as the batching rule of `op_classes`."""
    if not op_classes:
        raise TypeError("batch_rule() needs at least one op class")

    def decorate(fn: BatchRule) -> BatchRule:
        for cls in op_classes:
            if not (isinstance(cls, type) and issubclass(cls, Op)):
                raise TypeError(f"batch_rule() takes op classes, got {cls!r}")
            if cls in _RULES and _RULES[cls] is not fn:
                raise TypeError(f"batch_rule for {cls.__name__} registered twice")
            _RULES[cls] = fn
        return fn

    return decorate


def get_batch_rule(op: Op | type[Op]) -> BatchRule | None:
    """The batching rule registered for `op`'s class (or a base class), or None."""
    global _loaded
    if not _loaded:
        _loaded = True
        from . import vmap_rules  # noqa: F401  (registers the rules)
    cls = op if isinstance(op, type) else type(op)
    for base in cls.__mro__:
        if base in _RULES:
            return _RULES[base]
    return None


def _batch_node(b: Graph, src: Graph, node: Node, ins: list[Value], flags: list[bool]
                ) -> tuple[list[Value], list[bool]]:
    rule = get_batch_rule(node.op)
    res = rule(b, node, ins, flags) if rule is not None else None
    if res is not None:
        outs, out_flags = list(res[0]), list(res[1])
        if len(outs) != len(node.outputs) or len(out_flags) != len(outs):
            raise AutodiffError(f"{node.describe()}: the batching rule of {node.op.kind!r} "
                                f"returned {len(outs)} outputs for {len(node.outputs)}")
        return outs, out_flags
    if not node.op.composite:
        raise AutodiffError(
            f"{node.describe()}: vmap has no batching rule for op {node.op.kind!r} with batched "
            f"inputs {[i for i, f in enumerate(flags) if f]} and the op has no decomposition; "
            "register one with braze.autodiff.vmap.batch_rule")
    from ..interpret import decomposition_graph

    sub = decomposition_graph(node.op, [src.shape_of(v) for v in node.inputs])
    with b.provenance_scope(node.provenance):
        return batch_graph_into(b, sub, ins, flags)


def batch_graph_into(b: Graph, src: Graph, ins: Sequence[Value], flags: Sequence[bool]
                     ) -> tuple[list[Value], list[bool]]:
    """Build the batched form of `src` (a graph whose inputs are bound, in order, to `ins`,
    batched where `flags` says) into `b`; its params and constants are copied unbatched.
    Returns `src`'s outputs in `b` and their batched flags."""
    env: dict[Value, tuple[Value, bool]] = {}
    for nid, v, f in zip(src.input_ids, ins, flags):
        env[Value(nid)] = (v, f)
    for node in src.nodes:
        if isinstance(node.op, Input):
            continue
        new_ins = [env[v][0] for v in node.inputs]
        new_flags = [env[v][1] for v in node.inputs]
        if not any(new_flags):
            outs, out_flags = list(b.clone_node(node, new_ins, src)), [False] * len(node.outputs)
        else:
            outs, out_flags = _batch_node(b, src, node, new_ins, new_flags)
        for v, o, f in zip(node.values, outs, out_flags):
            env[v] = (o, f)
    res = [env[v] for v in src.outputs]
    return [r[0] for r in res], [r[1] for r in res]


def vmap(g: Graph, in_axes: Sequence[str] | str | Mapping[str, int | None] | None = None, *,
         axis_name: str | int = DEFAULT_AXIS_NAME) -> Graph:
    """A new graph computing `g` for a batch of examples: every input named in `in_axes`
    (default: all graph inputs; a mapping name -> 0 or None also works) gains a new leading
    batch axis, params and the other inputs stay shared, and every output is batched on axis 0
    (an output that does not depend on a batched input is broadcast along it).

    The batch axis is the symbol `axis_name` ("vmap_batch" unless told; bound at run time) or a
    static size when an int is given. Each op is batched by its rule (an elementwise op
    broadcasts, a matmul folds the batch into its leading dims, axis attributes shift by one,
    convolutions and attention fold it into their batch dim); composite ops without a rule are
    batched through their decomposition. `g` is not changed."""
    names = [n.op.name for n in g.inputs]
    wanted = names if in_axes is None else _batched_names(in_axes)
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise AutodiffError(f"vmap: graph {g.name!r} has no input named "
                            f"{', '.join(map(repr, unknown))}; its inputs are "
                            f"{', '.join(map(repr, names)) or 'none'} (params are never batched)")
    bdim = _check_axis_name(g, axis_name)
    b = Graph(f"{g.name}_vmap", record_provenance=False)
    ins, flags = [], []
    for node in g.inputs:
        shape = node.op.shape
        if node.op.name in wanted:
            ins.append(b.input(node.op.name, Shape((bdim, *shape.dims), shape.dtype),
                               node.op.excludes))
            flags.append(True)
        else:
            ins.append(b.input(node.op.name, shape, node.op.excludes))
            flags.append(False)
    outs, out_flags = batch_graph_into(b, g, ins, flags)
    b.weights.update(g.weights)
    b.set_outputs([o if f else _broadcast_out(b, o, bdim) for o, f in zip(outs, out_flags)])
    return dead_code_elimination(b)[0]


def _batched_names(in_axes: Sequence[str] | str | Mapping[str, int | None]) -> list[str]:
    """The input names `in_axes` batches. A mapping (JAX / torch.func style) may only say 0
    (batched on the new leading axis) or None (shared) per name."""
    if isinstance(in_axes, str):
        return [in_axes]
    if not isinstance(in_axes, Mapping):
        return list(in_axes)
    for name, axis in in_axes.items():
        if axis is not None and (isinstance(axis, bool) or axis != 0):
            raise AutodiffError(f"vmap: in_axes[{name!r}] = {axis!r}, but vmap batches an "
                                "input on a new leading axis (0) or shares it (None); move "
                                "the batch axis to the front first (g.transpose)")
    return [name for name, axis in in_axes.items() if axis is not None]


def _broadcast_out(b: Graph, v: Value, bdim: Dim) -> Value:
    return b.expand(v, (bdim, *b.shape_of(v).dims))


def _check_axis_name(g: Graph, axis_name: str | int) -> Dim:
    if isinstance(axis_name, bool) or not isinstance(axis_name, (str, int)):
        raise AutodiffError(f"vmap: axis_name must be a symbol name or a positive int, got "
                            f"{axis_name!r}")
    if isinstance(axis_name, int):
        if axis_name < 1:
            raise AutodiffError(f"vmap: a static batch size must be >= 1, got {axis_name}")
        return axis_name
    used = {s for n in g.nodes for shape in n.outputs for d in shape.dims
            for s in dim_symbols(d)}
    if axis_name in used:
        raise AutodiffError(f"vmap: graph {g.name!r} already uses the dim symbol "
                            f"{axis_name!r}; pass another axis_name")
    return axis_name

