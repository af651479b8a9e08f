"""Legalization: make a graph runnable by a target, and say how each node will run.

A node is legal for a target when the target claims its label and the node meets every target
constraint. `rewrite_for_backend` repeatedly replaces illegal nodes: a registered lowering for the
node's kind (braze/passes/lower/) wins; otherwise a composite (fused or logical) node decomposes
into its own simpler ops. It stops when the graph is legal, when nothing more can be rewritten,
or after a bounded number of rounds. `legalize` checks and raises one error listing every illegal
node; `dispatch_report` says per node and per op whether it runs natively, through a
decomposition, through a rewrite, or is missing."""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..errors import BrazeError
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.shapes import Shape
from .cleanup import dead_code_elimination
from .constraints import violated
from .expand import Builder, replace_nodes
from .targets import Target, get_target

MAX_ROUNDS = 32


class LegalizeError(BrazeError):
    """A graph holds nodes its target cannot run; `nodes` lists (node id, label, reason)."""

    def __init__(self, message: str, nodes: list[tuple[int, str, str]]):
        super().__init__(message)
        self.nodes = nodes


def illegal_reason(node: Node, g: Graph, target: Target) -> str | None:
    """Why `target` cannot run `node` as it is, or None when it can."""
    if node.op.source:
        return None
    if not target.claims_op(node.op):
        return f"target {target.name!r} does not claim {node.op.label}"
    bad = _unclaimed_members(node, target)
    if bad:
        return f"its body holds {', '.join(bad)}, which target {target.name!r} does not claim"
    broken = violated(node, g, target.constraints)
    if broken:
        return f"breaks target constraint {', '.join(broken)}"
    return None


def _unclaimed_members(node: Node, target: Target) -> list[str]:
    """Labels of a region's member ops (its generated kernel computes them) that `target`
    does not claim; empty for other ops."""
    steps = getattr(node.op, "steps", None) or ()
    return sorted({m.op.label for m in steps if not target.claims_op(m.op)})


def illegal_nodes(g: Graph, target) -> list[tuple[Node, str]]:
    """(node, reason) for every node of `g` that `target` cannot run."""
    t = get_target(target)
    out = []
    for node in g.nodes:
        why = illegal_reason(node, g, t)
        if why is not None:
            out.append((node, why))
    return out


def _describe(node: Node) -> str:
    where = f" ({node.provenance})" if node.provenance else ""
    name = f" {node.name!r}" if node.name else ""
    return f"%{node.id} {node.op.label}{name}{where}"


def legalize(g: Graph, target) -> Graph:
    """`g` itself when `target` can run every node; else a LegalizeError listing every illegal
    node with its kind, provenance and reason, and how to fix it."""
    t = get_target(target)
    bad = illegal_nodes(g, t)
    if not bad:
        return g
    lines = [f"  {_describe(n)}: {why}" for n, why in bad]
    raise LegalizeError(
        f"graph {g.name!r} has {len(bad)} node(s) target {t.name!r} cannot run:\n"
        + "\n".join(lines)
        + "\nrun bz.rewrite_for_backend(g, target) to lower them, or add their labels to the "
          "target's claims; bz.dispatch_report(g, target) shows how each would run.",
        [(n.id, n.op.label, why) for n, why in bad])


def _choose(node: Node, g: Graph, t: Target) -> tuple[str, Builder] | None:
    """The rewrite for an illegal `node`: (name, builder), or None when there is none."""
    from .lower import lowerings_for

    claimed = t.claims_op(node.op) and not _unclaimed_members(node, t)
    broken = violated(node, g, t.constraints) if claimed else []
    for lw in lowerings_for(node.op.kind):
        wanted = (lw.fixes is None and not claimed) or (lw.fixes in broken)
        if wanted and lw.when(node, g):
            return lw.name, lw.build
    if not claimed and node.op.composite:
        return "decompose", _decompose
    return None


def _decompose(new: Graph, node: Node, ins, old: Graph):
    return node.op.decompose(new, ins)


def rewrite_for_backend(g: Graph, target, *, strict: bool = True, max_rounds: int = MAX_ROUNDS,
                        trace: Counter | None = None) -> Graph:
    """Lower and unfuse `g` until `target` can run every node. A legal graph comes back
    unchanged (the same object). With `strict`, nodes nothing can rewrite raise LegalizeError
    (as `legalize` words it); otherwise the partly legal graph is returned. `trace`, when given,
    counts the rewrites applied by name ("decompose" or the lowering's name)."""
    t = get_target(target)
    for _ in range(max_rounds):
        picks: dict[int, tuple[str, Builder]] = {}
        for node in g.nodes:
            if illegal_reason(node, g, t) is None:
                continue
            choice = _choose(node, g, t)
            if choice is not None:
                picks[node.id] = choice
        if not picks:
            break
        if trace is not None:
            trace.update(name for name, _ in picks.values())
        g = replace_nodes(g, lambda n, gg, p=picks: p[n.id][1] if n.id in p else None)
        g, _ = dead_code_elimination(g)
    else:
        left = Counter(n.op.label for n, _ in illegal_nodes(g, t))
        if left:
            raise LegalizeError(f"rewrite_for_backend({t.name!r}) did not converge in "
                                f"{max_rounds} rounds; still illegal: {dict(left)} (a lowering "
                                f"keeps producing ops the target cannot run)",
                                [(n.id, n.op.label, why) for n, why in illegal_nodes(g, t)])
    return legalize(g, t) if strict else g


# -- the dispatch report -------------------------------------------------------------------------
NATIVE, DECOMPOSED, REWRITTEN, MISSING = "native", "decomposition", "rewrite", "missing"


@dataclass(frozen=True)
class NodeDispatch:
    """How one node runs: `status` is native / decomposition / rewrite / missing; `via` names
    the rewrites used, `becomes` counts the native ops it turns into, `reason` says why it is
    not native (and, when missing, what blocks it)."""

    node: int
    label: str
    provenance: str | None
    status: str
    via: tuple[str, ...] = ()
    becomes: tuple[tuple[str, int], ...] = ()
    reason: str = ""


@dataclass
class DispatchReport:
    """Per-node dispatch for a target, with per-label summaries and a text form."""

    target: str
    graph: str
    nodes: list[NodeDispatch] = field(default_factory=list)

    def by_status(self, status: str) -> list[NodeDispatch]:
        return [n for n in self.nodes if n.status == status]

    @property
    def missing(self) -> list[NodeDispatch]:
        return self.by_status(MISSING)

    @property
    def legal(self) -> bool:
        """Whether `rewrite_for_backend` can make the graph legal for the target."""
        return not self.missing

    def per_label(self) -> dict[str, tuple[str, int, NodeDispatch]]:
        """label -> (status, node count, one example) ; the worst status wins per label."""
        rank = {NATIVE: 0, DECOMPOSED: 1, REWRITTEN: 2, MISSING: 3}
        out: dict[str, tuple[str, int, NodeDispatch]] = {}
        for n in self.nodes:
            st, cnt, ex = out.get(n.label, (NATIVE, 0, n))
            if rank[n.status] >= rank[st]:
                st, ex = n.status, n
            out[n.label] = (st, cnt + 1, ex)
        return out

    def counts(self) -> dict[str, int]:
        c = Counter(n.status for n in self.nodes)
        return {s: c.get(s, 0) for s in (NATIVE, DECOMPOSED, REWRITTEN, MISSING)}

    def __str__(self) -> str:
        c = self.counts()
        lines = [f"dispatch of {self.graph!r} for target {self.target!r}: {len(self.nodes)} "
                 f"nodes; " + ", ".join(f"{v} {k}" for k, v in c.items())]
        rows = sorted(self.per_label().items(), key=lambda kv: (kv[1][0] != NATIVE, kv[0]))
        width = max([len(k) for k, _ in rows] + [5])
        for label, (st, cnt, ex) in rows:
            how = st if not ex.via else f"{st} ({', '.join(ex.via)})"
            into = " ".join(f"{k}x{v}" if v > 1 else k for k, v in ex.becomes)
            lines.append(f"  {label:<{width}} {cnt:>5}  {how}" + (f" -> {into}" if into else ""))
        for n in self.missing:
            where = f" ({n.provenance})" if n.provenance else ""
            lines.append(f"  missing: %{n.node} {n.label}{where}: {n.reason}")
        return "\n".join(lines)


def _probe(node: Node, g: Graph, t: Target) -> tuple[str, tuple[str, ...], tuple, str]:
    """Legalize `node` alone (its operands as graph inputs) to learn how it would run."""
    mini = Graph(f"probe_{node.op.label}", record_provenance=False)
    ins = [mini.input(f"in{i}", g.shape_of(v)) for i, v in enumerate(node.inputs)]
    outs = mini.clone_node(node, ins, g)
    mini.set_outputs(list(outs))
    trace: Counter = Counter()
    low = rewrite_for_backend(mini, t, strict=False, trace=trace)
    left = illegal_nodes(low, t)
    becomes = Counter(n.op.label for n in low.nodes if not n.op.source)
    via = tuple(trace)
    if left:
        n0, why = left[0]
        blocked = n0.op.label
        hint = ("it has no decomposition and no lowering is registered for it"
                if not n0.op.composite else why)
        reason = (f"{why}; {hint}" if blocked == node.op.label else
                  f"it lowers to {blocked}, which {hint}")
        return MISSING, via, tuple(sorted(becomes.items())), reason
    status = DECOMPOSED if set(via) <= {"decompose"} else REWRITTEN
    return status, via, tuple(sorted(becomes.items())), illegal_reason(node, g, t) or ""


def dispatch_report(g: Graph, target) -> DispatchReport:
    """How `target` would run each node of `g` (see DispatchReport)."""
    t = get_target(target)
    rep = DispatchReport(t.name, g.name)
    cache: dict[tuple, tuple] = {}
    for node in g.nodes:
        if node.op.source:
            continue
        why = illegal_reason(node, g, t)
        if why is None:
            rep.nodes.append(NodeDispatch(node.id, node.op.label, node.provenance, NATIVE))
            continue
        key = (node.op, tuple(_key(g.shape_of(v)) for v in node.inputs))
        try:
            found = cache.get(key)
        except TypeError:  # ops holding unhashable attributes (bodies) are probed each time
            key, found = None, None
        if found is None:
            found = _probe(node, g, t)
            if key is not None:
                cache[key] = found
        status, via, becomes, reason = found
        rep.nodes.append(NodeDispatch(node.id, node.op.label, node.provenance, status, via,
                                      becomes, reason))
    return rep


def _key(s: Shape) -> tuple:
    return (tuple(str(d) for d in s.dims), str(s.dtype))


def illegal_labels(g: Graph, target) -> Iterable[str]:
    """The distinct labels of illegal nodes (for quick checks and messages)."""
    return sorted({n.op.label for n, _ in illegal_nodes(g, target)})
