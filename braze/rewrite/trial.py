"""Trial builds: before the rewrite driver commits to a match, the rule's replacement is built
into a scratch graph, with stand-ins for what it reads (the match's source nodes cloned, any
other external value as an input of the same type). The match becomes a reasoned miss instead
of an exception or a changed graph when the replacement

- reads a value its own match computes (CAPTURE_INSIDE_MATCH),
- is rejected by a builder (a ShapeError or GraphError: INVALID_REPLACEMENT), or
- provides a value whose shape or dtype differs from the one it replaces, or leaves out a
  replaced value that something outside the match still reads (INVALID_REPLACEMENT).

A fusion therefore never changes a value's type, whatever a rule's own checks miss.

A replacement is built once: the driver makes an accepted match's replacement by replaying its
trial (`replay`): the scratch graph's nodes are appended to the real graph in the order the
rule made them, each stand-in replaced by the real value at the point the rule asked for it,
with the types the trial inferred (the real inputs have the stand-ins' types). That is what
running the rule again would build, unless the rule read the real graph's names (a fresh param
name, a param an earlier replacement of the sweep made): when a name the trial took is already
taken there, the driver runs the rule again instead. The driver runs `check_provided` again on
the real replacement."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import BrazeError, GraphError
from ..ir.graph import Graph
from ..ir.graph_core import GraphCore
from ..ir.op import Value
from ..ir.ops.io import Input
from .miss import Miss, MissReason, fail
from .rule import CaptureInsideMatch, Match

__all__ = ["trial_build", "check_provided", "replay", "Trial"]


class Trial:
    """A replacement built on trial: the scratch graph, what each stand-in node stands for
    (scratch node id -> old value), and what the rule's rewrite returned."""

    __slots__ = ("scratch", "stands_for", "result")

    def __init__(self, scratch: Graph, stands_for: dict[int, Value], result: Any):
        self.scratch = scratch
        self.stands_for = stands_for
        self.result = result

    def names(self) -> list[str]:
        """The node names and weight names the rule's nodes took in the scratch graph."""
        stands_for = self.stands_for
        out = [n.name for n in self.scratch.nodes
               if n.name is not None and n.id not in stands_for]
        out.extend(self.scratch.weights.keys())
        return out


def trial_build(m: Match, outputs: set[Value]) -> Miss | None:
    """None when `m`'s replacement builds and provides each value it replaces with that value's
    type; otherwise the Miss saying why not. `outputs` are the old graph's outputs. A build that
    passes is kept as `m.trial` (see `replay`)."""
    g = m.graph
    scratch = Graph(f"{g.name}.trial", record_provenance=False)
    stand_ins: dict[Value, Value] = {}
    stands_for: dict[int, Value] = {}

    def stand_in(old: Value) -> Value:
        v = stand_ins.get(old)
        if v is None:
            node = g.nodes[old.node]
            if node.op.source:  # rules may read a param's name or a constant's value
                v = scratch.copy_node(node, ())[old.index]  # its type is known
            else:
                shape = g.nodes[old.node].outputs[old.index]  # an input of known type
                op = Input(f"{old!r}", shape)
                v = scratch._append(op, (), (shape,), None, None)[0]
                scratch._list_source(v.node, op)
            stand_ins[old] = v
            stands_for[v.node] = old
        return v

    m._resolve = stand_in
    try:  # nodes get the root's provenance as they are made (what the driver's stamp would give)
        with scratch.provenance_scope(m.root.provenance):
            result = m.rule.rewrite(scratch, m)
    except CaptureInsideMatch as e:
        return fail(MissReason.CAPTURE_INSIDE_MATCH, detail=e.detail)
    except BrazeError as e:
        return fail(MissReason.INVALID_REPLACEMENT, detail=f"building it failed: {e}")
    finally:
        m._resolve = None
    miss = check_provided(m, result, scratch, outputs)
    if miss is None:
        m.trial = Trial(scratch, stands_for, result)
    return miss


def replay(trial: Trial, b: GraphCore, resolve: Callable[[Value], Value]) -> Any:
    """Build `trial`'s replacement into `b` without running the rule again: append each node the
    rule made (same op, name and output types), reading `resolve(old)` where the trial read a
    stand-in for `old`, resolved in the order the rule asked for them. Returns the rule's result
    in `b`'s values, or None (nothing appended) when a name the trial took is already taken in
    `b`: a rule that chooses names by what a graph holds may choose otherwise there."""
    has_name = b.has_name
    weights = b.weights
    for name in trial.names():
        if has_name(name) or name in weights:
            return None
    stands_for = trial.stands_for
    new_of: list[tuple[Value, ...]] = []  # scratch node id -> its values in `b`
    for node in trial.scratch.nodes:
        old = stands_for.get(node.id)
        if old is not None:
            # an input, or a clone of a source node (its only value the trial read is old's)
            vals: list = [None] * len(node.outputs)
            vals[old.index if len(vals) > 1 else 0] = resolve(old)
            new_of.append(tuple(vals))
            continue
        if node.name is not None and has_name(node.name):  # taken while resolving
            raise GraphError(f"node name {node.name!r} is already used in graph {b.name!r}")
        ins = tuple([new_of[v.node][v.index] for v in node.inputs])
        new_of.append(b.copy_node(node, ins))
    weights.update_raw(trial.scratch.weights)
    return _map_result(trial.result, new_of)


def _map_result(result: Any, new_of: list[tuple[Value, ...]]) -> Any:
    if isinstance(result, dict):
        return {k: _map_result(v, new_of) for k, v in result.items()}
    if isinstance(result, tuple):
        return tuple(new_of[v.node][v.index] for v in result)
    return new_of[result.node][result.index]


def check_provided(m: Match, result: Any, b: GraphCore, outputs: set[Value]) -> Miss | None:
    """`result` (what the rule's rewrite returned: the root's value(s), or a dict capture name
    -> value(s), all of graph `b`) gives each replaced value its old type, and provides the root
    and every escaping capture (each output still read outside the match or returned)."""
    mapping = result if isinstance(result, dict) else {"root": result}
    provided: dict[int, int] = {}  # node id -> how many of its outputs the result gives
    for name, vals in mapping.items():
        node = m.nodes.get(name)
        if node is None:
            return _invalid(f"it provides {name!r}, which the match did not capture")
        vals = vals if isinstance(vals, tuple) else (vals,)
        if len(vals) > len(node.outputs):
            return _invalid(f"it gives {len(vals)} values for {node.label}, which has "
                            f"{len(node.outputs)}")
        for i, nv in enumerate(vals):
            if not _is_value_of(b, nv):
                return _invalid(f"it gives {nv!r} for {_out(node, i)}, not a value of the "
                                "rebuilt graph")
            want, got = node.outputs[i], b.shape_of(nv)
            if got != want:
                return _invalid(f"it would change {_out(node, i)} from {want} to {got}")
        provided[node.id] = max(provided.get(node.id, 0), len(vals))
    inside = set(m.consumed)
    for name in ("root", *sorted(m._escaping)):
        node = m.nodes[name]
        for i in range(provided.get(node.id, 0), len(node.outputs)):
            v = node.values[i]
            if v in outputs or any(u.id not in inside for u in m.graph.users(v)):
                return _invalid(f"it does not provide {_out(node, i)}, which is still read "
                                "outside the match")
    return None


def _invalid(detail: str) -> Miss:
    return fail(MissReason.INVALID_REPLACEMENT, detail=detail)


def _is_value_of(b: GraphCore, v: Any) -> bool:
    return isinstance(v, Value) and 0 <= v.node < len(b.nodes) and \
        0 <= v.index < len(b.nodes[v.node].outputs)


def _out(node, i: int) -> str:
    return node.label if len(node.outputs) == 1 else f"output {i} of {node.label}"
