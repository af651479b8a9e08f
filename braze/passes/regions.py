"""Elementwise regions: group connected elementwise ops into ElementwiseRegion nodes (each
carrying its members as a body graph), inline them back, and split regions that exceed a
target's FusionLimits. Every pass here is linear in graph size and never mutates its input.

Grouping rule (one reverse sweep, no cycle search needed): an elementwise node joins the region
of its consumers when ALL its consumers are elementwise nodes of ONE region. So a region's only
value read by other nodes is its root (its last member); a member that is also a graph output
is exposed as an extra region output. Values read by non-members (a matmul, or consumers in two
regions) end a region: they become its output, never lost. Small constants read by members are
copied into the body. Regions need at least two members."""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..ir.graph import Graph
from ..ir.graph_core import GraphCore
from ..ir.node import Node
from ..ir.op import Value
from ..ir.ops.io import Constant
from ..ir.ops.region import ElementwiseRegion, region_input_name
from ..rewrite import MissedFusion, MissReason, RewriteContext
from .base import PassResult
from .expand import expand_nodes
from .limits import FusionLimits, active_fusion_limits

__all__ = [
    "find_elementwise_regions", "mark_elementwise_regions", "unfuse_elementwise_regions",
    "clip_elementwise_regions",
    "RegionPass", "ClipRegionsPass", "MARK_ELEMENTWISE_REGIONS", "UNFUSE_ELEMENTWISE_REGIONS",
    "MIN_REGION_STEPS", "MAX_INLINED_CONSTANT",
]

MIN_REGION_STEPS = 2
MAX_INLINED_CONSTANT = 1024  # constants up to this many elements are copied into region bodies
REGION_KIND = "elementwise_region"


def _is_member_op(node: Node) -> bool:
    return node.op.elementwise and not node.op.source and len(node.outputs) == 1


def _inlinable_constant(node: Node) -> bool:
    return isinstance(node.op, Constant) and node.op.value.size <= MAX_INLINED_CONSTANT


# -- marking ------------------------------------------------------------------------------------
def find_elementwise_regions(g: GraphCore) -> list[list[int]]:
    """Member node ids (ascending) of each region of >= 2 elementwise nodes, by the grouping
    rule in the module docstring."""
    region = [-1] * len(g.nodes)
    members: list[list[int]] = []
    for node in reversed(g.nodes):
        if not _is_member_op(node):
            continue
        users = g.users(node.id)
        rid = region[users[0].id] if users else -1
        if rid < 0 or any(region[u.id] != rid for u in users):
            rid = len(members)
            members.append([])
        region[node.id] = rid
        members[rid].append(node.id)
    return [sorted(m) for m in members if len(m) >= MIN_REGION_STEPS]


def mark_elementwise_regions(g: Graph, ctx: RewriteContext | None = None
                             ) -> tuple[Graph, bool, list[MissedFusion]]:
    """Group elementwise ops into ElementwiseRegion nodes. Returns (graph, changed, misses);
    a target that does not claim "elementwise_region" gets the graph back unchanged and one
    UNSUPPORTED_BY_TARGET miss per region it would have formed."""
    regions = find_elementwise_regions(g)
    target = ctx.target if ctx is not None else None
    if target is not None and not target.wants_fusion(REGION_KIND):
        misses = [_miss(g.nodes[m[-1]], MissReason.UNSUPPORTED_BY_TARGET,
                        f"target {target.name!r} does not claim {REGION_KIND}")
                  for m in regions]
        return g, False, misses
    if not regions:
        return g, False, []
    return _rebuild_with_regions(g, regions), True, []


def _rebuild_with_regions(g: Graph, regions: list[list[int]]) -> Graph:
    """A new graph where each region's members become one ElementwiseRegion node, emitted at
    its root's position (all its external inputs come earlier)."""
    outputs = set(g.outputs)
    root_of: dict[int, list[int]] = {}
    member = [False] * len(g.nodes)
    for m in regions:
        root_of[m[-1]] = m
        for nid in m:
            member[nid] = True
    absorbed = {  # constants read only by members are moved into bodies
        node.id for node in g.nodes
        if _inlinable_constant(node) and node.value not in outputs
        and (users := g.users(node.id)) and all(member[u.id] for u in users)
    }
    new = Graph(g.name, record_provenance=False)
    outs_of: list = [None] * len(g.nodes)  # old node id -> the new values standing for it
    first = min(min(m[0] for m in regions), min(absorbed, default=len(g.nodes)))
    outs_of[:first] = new.copy_prefix(g, first)  # before the first change: as they are
    for node in g.nodes[first:]:
        if node.id in root_of:
            _emit_region(new, g, [g.nodes[i] for i in root_of[node.id]], outs_of, outputs)
        elif not member[node.id] and node.id not in absorbed:
            # a region output has the type of the member value it stands for: no inference
            ins = tuple([outs_of[v.node][v.index] for v in node.inputs])
            outs_of[node.id] = new.copy_node(node, ins)
    new.weights = g.weights.carry()
    new.set_outputs([outs_of[v.node][v.index] for v in g.outputs])
    return new


def _emit_region(new: Graph, g: GraphCore, steps: Sequence[Node], outs_of: list,
                 outputs: set[Value]) -> None:
    """Append one region node running `steps` (nodes of `g`, in order) and map every step value
    used after the region (by a non-member, or as a graph output) to the region's outputs
    (`outs_of`: old node id -> new values; members have one output)."""
    inside = {n.id for n in steps}
    exposed = [n.value for n in steps if n.value in outputs
               or any(u.id not in inside for u in g.users(n.id))]
    if steps[-1].value not in exposed:  # the root is always an output, even if unused
        exposed.append(steps[-1].value)
    body, ext = _build_body(g, steps, exposed, f"{g.name}.region{len(new.nodes)}")
    root = steps[-1]
    name = root.name if root.name and root.name not in new._names else None
    outs = new.add_node(ElementwiseRegion(body), [outs_of[v.node][v.index] for v in ext],
                        name=name, provenance=root.provenance)
    for v, out in zip(exposed, outs):
        outs_of[v.node] = (out,)


def _build_body(g: GraphCore, steps: Sequence[Node], exposed: Sequence[Value], name: str,
                is_external: Callable[[Value], bool] | None = None
                ) -> tuple[Graph, list[Value]]:
    """Body graph for `steps`: inputs in0.. for the external values (in first-use order),
    copies of small constants, the steps, and `exposed` as outputs. Returns (body, external
    values of `g` in input order)."""
    inside = {n.id for n in steps}
    body = Graph(name, record_provenance=False)
    env: dict[Value, Value] = {}
    ext: list[Value] = []
    for node in steps:
        ins = []
        for v in node.inputs:
            if v not in env:
                src = g.nodes[v.node]
                external = is_external(v) if is_external else v.node not in inside
                if _inlinable_constant(src) and external:
                    env[v] = body.add_node(src.op, ())[0]
                else:
                    env[v] = body.input(region_input_name(len(ext)), g.shape_of(v))
                    ext.append(v)
            ins.append(env[v])
        (env[node.value],) = body.add_node(node.op, ins, provenance=node.provenance)
    body.set_outputs([env[v] for v in exposed])
    return body, ext


# -- unfusing -----------------------------------------------------------------------------------
def unfuse_elementwise_regions(g: Graph, ctx: RewriteContext | None = None
                               ) -> tuple[Graph, bool]:
    """Inline every ElementwiseRegion back into plain ops (through the op's `decompose`)."""
    return expand_nodes(g, lambda op: isinstance(op, ElementwiseRegion))


# -- clipping to limits -------------------------------------------------------------------------
def clip_elementwise_regions(g: Graph, limits: FusionLimits
                             ) -> tuple[Graph, bool, list[MissedFusion]]:
    """Split every region whose steps or external inputs exceed `limits` into consecutive
    in-limit regions (pieces of one step are inlined as plain ops). One
    REGION_LIMIT_EXCEEDED miss per clipped region. Returns (graph, changed, misses)."""
    big = [n for n in g.nodes if isinstance(n.op, ElementwiseRegion)
           and not limits.allows(len(n.op.steps), n.op.n_inputs)]
    if not big:
        return g, False, []
    clipped = {n.id for n in big}
    new = Graph(g.name, record_provenance=False)
    vmap: dict[Value, Value] = {}
    misses = []
    for node in g.nodes:
        ins = [vmap[v] for v in node.inputs]
        if node.id in clipped:
            outs, pieces = _split_region(new, node, ins, limits)
            misses.append(_miss(node, MissReason.REGION_LIMIT_EXCEEDED,
                                f"{len(node.op.steps)} steps, {node.op.n_inputs} inputs exceed "
                                f"{_show(limits)}; split into {pieces} region(s) and inlined "
                                "the rest"))
        else:
            outs = new.clone_node(node, ins, g)
        vmap.update(zip(node.values, outs))
    new.weights = g.weights.carry()
    new.set_outputs([vmap[v] for v in g.outputs])
    return new, True, misses


def _split_region(new: Graph, node: Node, ins: Sequence[Value], limits: FusionLimits
                  ) -> tuple[tuple[Value, ...], int]:
    """Emit `node`'s body as greedy consecutive pieces that fit `limits`. Returns the values
    standing for the region's outputs and how many region pieces were made."""
    body = node.op.body
    steps = [n for n in body.nodes if not n.op.source]
    env: dict[Value, Value] = {Value(nid): v for nid, v in zip(body.input_ids, ins)}
    last_read = {v: n.id for n in body.nodes for v in n.inputs}  # reads come in node order
    for v in body.outputs:
        last_read[v] = len(body.nodes)
    n_pieces = 0
    for piece in _pack(body, steps, limits):
        if len(piece) >= MIN_REGION_STEPS:
            _emit_piece(new, body, piece, env, last_read, node)
            n_pieces += 1
        else:
            for step in piece:
                args = [_outer(new, body, v, env) for v in step.inputs]
                (env[step.value],) = new.add_node(step.op, args, provenance=node.provenance)
    return tuple(_outer(new, body, v, env) for v in body.outputs), n_pieces


def _pack(body: Graph, steps: list[Node], limits: FusionLimits) -> list[list[Node]]:
    """Cut `steps` (in order) into consecutive pieces, each within `limits` (a step that alone
    exceeds max_inputs becomes a piece of its own)."""
    pieces: list[list[Node]] = []
    cur: list[Node] = []
    cur_ids: set[int] = set()
    cur_ins: set[Value] = set()
    for step in steps:
        fresh = {v for v in step.inputs if v.node not in cur_ids and v not in cur_ins
                 and not _inlinable_constant(body.nodes[v.node])}
        if cur and not limits.allows(len(cur) + 1, len(cur_ins) + len(fresh)):
            pieces.append(cur)
            cur, cur_ids, cur_ins = [], set(), set()
            fresh = {v for v in step.inputs if not _inlinable_constant(body.nodes[v.node])}
        cur.append(step)
        cur_ids.add(step.id)
        cur_ins |= fresh
    if cur:
        pieces.append(cur)
    return pieces


def _emit_piece(new: Graph, body: Graph, piece: list[Node], env: dict[Value, Value],
                last_read: dict[Value, int], region: Node) -> None:
    """Append one region for `piece` (steps of `body`); its outputs are the piece values read
    by later steps or returned by the body (`last_read`: the last body node reading a value,
    past the end for body outputs)."""
    inside = {n.id for n in piece}
    exposed = [n.value for n in piece if last_read.get(n.value, -1) > piece[-1].id]
    exposed = exposed or [piece[-1].value]  # a dead tail still needs one output
    sub, ext = _build_body(body, piece, exposed, f"{body.name}.{piece[0].id}",
                           is_external=lambda v: v.node not in inside)
    outs = new.add_node(ElementwiseRegion(sub), [_outer(new, body, v, env) for v in ext],
                        provenance=region.provenance)
    env.update(zip(exposed, outs))


def _outer(new: Graph, body: Graph, v: Value, env: dict[Value, Value]) -> Value:
    """The outer value for body value `v` (a body constant is materialized on first use)."""
    if v not in env:
        env[v] = new.add_node(body.nodes[v.node].op, ())[0]
    return env[v]


def _show(limits: FusionLimits) -> str:
    return f"FusionLimits(max_steps={limits.max_steps}, max_inputs={limits.max_inputs})"


def _miss(node: Node, reason: MissReason, detail: str) -> MissedFusion:
    return MissedFusion(pattern="ElementwiseRegion", node=node.name or f"%{node.id}",
                        reason=reason, context=node.describe(), hint=reason.default_hint,
                        detail=detail)


# -- pass objects -------------------------------------------------------------------------------
@dataclass
class RegionPass:
    """A pass from `fn(g, ctx) -> (graph, changed)` or `(graph, changed, misses)`."""

    name: str
    fn: Callable

    def run(self, g: Graph, ctx: RewriteContext) -> PassResult:
        t0 = time.perf_counter()
        out = self.fn(g, ctx)
        misses = list(out[2]) if len(out) > 2 else []
        return PassResult(self.name, out[0], out[1], misses=misses,
                          seconds=time.perf_counter() - t0)


@dataclass
class ClipRegionsPass:
    """Split regions to the limits: `limits` if given, else the active `with_fusion_limits`
    override, else the context target's limits (unbounded without a target)."""

    limits: FusionLimits | None = None
    name: str = "ClipElementwiseRegions"

    def run(self, g: Graph, ctx: RewriteContext) -> PassResult:
        t0 = time.perf_counter()
        lim = self.limits
        if lim is None:
            target = ctx.target if ctx is not None else None
            lim = active_fusion_limits(target.limits if target is not None else FusionLimits())
        out, changed, misses = clip_elementwise_regions(g, lim)
        return PassResult(self.name, out, changed, misses=misses,
                          seconds=time.perf_counter() - t0)


MARK_ELEMENTWISE_REGIONS = RegionPass("MarkElementwiseRegions", mark_elementwise_regions)
UNFUSE_ELEMENTWISE_REGIONS = RegionPass("UnfuseElementwiseRegions", unfuse_elementwise_regions)
