"""Graphs drawn as SVG for the HTML report: one box per op (inputs included; params and constants
are listed in the box's tooltip), fused kinds filled orange, nodes with a near miss outlined red
with the pattern, reason and hint on hover. Graphviz's `dot` lays the graph out when it is
installed; otherwise braze's own layered layout does (longest-path layers, barycenter ordering
within layers, SVG written here). Graphs above `MAX_DRAWN` nodes are cut with a note."""
from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from ..ir.graph import Graph
from ..ir.node import Node
from ..rewrite.miss import MissedFusion

MAX_DRAWN = 400
FUSED_FILL, PLAIN_FILL, INPUT_FILL = "#ffcc80", "#f5f5f5", "#e3f2fd"
MISS_STROKE, PLAIN_STROKE = "#c62828", "#607d8b"
_ROW, _GAP, _BOX_H, _CHAR_W = 64, 18, 34, 6.4


@dataclass
class DrawnNode:
    """One box: its title, type line, tooltip and the classes that colour it."""

    id: int
    label: str
    type_text: str
    tooltip: str
    fused: bool
    missed: bool
    is_input: bool
    is_output: bool

    @property
    def classes(self) -> str:
        flags = (("fused", self.fused), ("missed", self.missed), ("input", self.is_input),
                 ("output", self.is_output))
        return " ".join(["node"] + [name for name, on in flags if on])

    @property
    def width(self) -> float:
        return max(len(self.label), len(self.type_text)) * _CHAR_W + 16


def is_fused(node: Node) -> bool:
    """A fused kind or a region made by a fusion pass."""
    return bool(type(node.op).fused) or node.op.kind.endswith("_region")


def misses_by_node(g: Graph, misses: Sequence[MissedFusion]) -> dict[int, list[MissedFusion]]:
    """The nodes of `g` that `misses` name. A miss names its node as the pass saw it: its id or
    name (which passes may renumber) and its op with provenance. The node of `g` with that op
    and provenance is it when the id or name agrees too, or when it is the only such node."""
    by_origin: dict[str, list[Node]] = {}
    for n in g.nodes:
        by_origin.setdefault(_origin(n.describe(), n.name or f"%{n.id}"), []).append(n)
    out: dict[int, list[MissedFusion]] = {}
    for m in misses:
        candidates = by_origin.get(_origin(m.context, m.node), [])
        exact = [n for n in candidates if (n.name or f"%{n.id}") == m.node]
        picked = exact[:1] or (candidates if len(candidates) == 1 else [])
        for n in picked:
            out.setdefault(n.id, []).append(m)
    return out


def _origin(description: str, who: str) -> str:
    """'(matmul) from model.py:12' of '%7 (matmul) from model.py:12' (see Node.describe)."""
    return description[len(who) + 1:] if description.startswith(who + " ") else description


def drawn_nodes(g: Graph, misses: Sequence[MissedFusion] = ()
                ) -> tuple[list[DrawnNode], list[tuple[int, int]]]:
    """The boxes (graph inputs and every non-source node, in graph order) and the edges
    between them."""
    missed = misses_by_node(g, misses)
    outputs = {v.node for v in g.outputs}
    nodes, edges = [], []
    drawn: set[int] = set()
    for n in g.nodes:
        is_input = n.op.kind == "input"
        if n.op.source and not is_input:
            continue
        sources = [g.nodes[v.node] for v in n.inputs]
        reads = [s.name or f"%{s.id}" for s in sources if s.op.source and s.op.kind != "input"]
        tip = [f"{n.name or f'%{n.id}'} = {n.op.label}", ", ".join(str(s) for s in n.outputs)]
        if n.provenance:
            tip.append(f"from {n.provenance}")
        if reads:
            tip.append("reads " + ", ".join(reads))
        for m in missed.get(n.id, []):
            detail = f" ({m.detail})" if m.detail else ""
            tip.append(f"not fused: {m.pattern}: {m.reason.value}{detail}\nhint: {m.hint}")
        act = getattr(n.op, "act", None)
        name = n.op.name if is_input else n.op.label + (f"[{act.value}]" if act else "")
        type_text = ", ".join(str(s) for s in n.outputs)
        nodes.append(DrawnNode(n.id, name, type_text, "\n".join(tip), is_fused(n),
                               n.id in missed, is_input, n.id in outputs))
        drawn.add(n.id)
        edges += [(s.id, n.id) for s in dict.fromkeys(sources) if s.id in drawn]
    return nodes, edges


def layered_layout(ids: Sequence[int], edges: Sequence[tuple[int, int]], sweeps: int = 4
                   ) -> list[list[int]]:
    """Layers of node ids, top to bottom: a node sits one layer below its lowest predecessor
    (longest path from the inputs); within a layer, nodes are ordered by the mean position of
    their neighbours, sweeping down and up, to cut edge crossings. `ids` in topological
    order."""
    preds: dict[int, list[int]] = {i: [] for i in ids}
    succs: dict[int, list[int]] = {i: [] for i in ids}
    for a, b in edges:
        preds[b].append(a)
        succs[a].append(b)
    level: dict[int, int] = {}
    for i in ids:
        level[i] = 1 + max((level[p] for p in preds[i]), default=-1)
    layers: list[list[int]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for i in ids:
        layers[level[i]].append(i)
    pos = {i: k / max(1, len(layer)) for layer in layers for k, i in enumerate(layer)}
    for sweep in range(sweeps):
        order = layers[1:] if sweep % 2 == 0 else layers[-2::-1]
        near = preds if sweep % 2 == 0 else succs
        for layer in order:
            def barycenter(i, near=near):
                ns = near[i]
                return sum(pos[n] for n in ns) / len(ns) if ns else pos[i]

            layer.sort(key=barycenter)
            for k, i in enumerate(layer):
                pos[i] = k / max(1, len(layer))
    return layers


def svg_by_layout(nodes: Sequence[DrawnNode], edges: Sequence[tuple[int, int]]) -> str:
    """SVG of the boxes placed by `layered_layout` (no external tools)."""
    by_id = {n.id: n for n in nodes}
    layers = layered_layout([n.id for n in nodes], edges)
    widths = [sum(by_id[i].width for i in layer) + _GAP * (len(layer) - 1) for layer in layers]
    total_w = max(widths, default=0) + 2 * _GAP
    xy: dict[int, tuple[float, float]] = {}
    for row, (layer, w) in enumerate(zip(layers, widths, strict=True)):
        x = (total_w - w) / 2
        for i in layer:
            xy[i] = (x, _GAP + row * _ROW)
            x += by_id[i].width + _GAP
    height = _GAP * 2 + max(len(layers) - 1, 0) * _ROW + _BOX_H
    parts = [f'<svg class="graph" xmlns="http://www.w3.org/2000/svg" width="{total_w:.0f}" '
             f'height="{height}" viewBox="0 0 {total_w:.0f} {height}" font-family="sans-serif">',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" '
             'markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#78909c"/>'
             '</marker></defs>']
    for a, b in edges:
        (xa, ya), (xb, yb) = xy[a], xy[b]
        x1, y1 = xa + by_id[a].width / 2, ya + _BOX_H
        x2, y2 = xb + by_id[b].width / 2, yb
        bend = (y2 - y1) / 2
        parts.append(f'<path class="edge" d="M{x1:.1f},{y1:.1f} C{x1:.1f},{y1 + bend:.1f} '
                     f'{x2:.1f},{y2 - bend:.1f} {x2:.1f},{y2:.1f}" fill="none" '
                     f'stroke="#90a4ae" marker-end="url(#arrow)"/>')
    for n in nodes:
        parts.append(_box(n, *xy[n.id]))
    parts.append("</svg>")
    return "\n".join(parts)


def _box(n: DrawnNode, x: float, y: float) -> str:
    fill = FUSED_FILL if n.fused else INPUT_FILL if n.is_input else PLAIN_FILL
    stroke = MISS_STROKE if n.missed else PLAIN_STROKE
    extra = ' stroke-dasharray="5 3"' if n.missed else ""
    sw = 2.5 if n.missed or n.is_output else 1
    cx = x + n.width / 2
    mark = (f'<text x="{x + n.width - 7:.1f}" y="{y + 12:.1f}" fill="{MISS_STROKE}" '
            'font-weight="bold" font-size="12">!</text>' if n.missed else "")
    return (f'<g class="{n.classes}" data-node="%{n.id}"><title>{escape(n.tooltip)}</title>'
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{n.width:.1f}" height="{_BOX_H}" rx="5" '
            f'fill="{fill}" stroke="{stroke}" stroke-width="{sw}"{extra}/>'
            f'<text x="{cx:.1f}" y="{y + 14:.1f}" text-anchor="middle" font-size="11">'
            f'{escape(n.label)}</text><text x="{cx:.1f}" y="{y + 27:.1f}" '
            f'text-anchor="middle" font-size="9" fill="#555">{escape(n.type_text)}</text>'
            f'{mark}</g>')


def dot_source(nodes: Sequence[DrawnNode], edges: Sequence[tuple[int, int]]) -> str:
    """The graph in Graphviz's DOT language, with the same colours, classes and tooltips."""
    lines = ["digraph braze {", "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
             '  edge [color="#90a4ae"];']
    for n in nodes:
        fill = FUSED_FILL if n.fused else INPUT_FILL if n.is_input else PLAIN_FILL
        stroke = MISS_STROKE if n.missed else PLAIN_STROKE
        style = "rounded,filled,dashed" if n.missed else "rounded,filled"
        width = 2.5 if n.missed or n.is_output else 1
        lines.append(f'  n{n.id} [label="{_dot(n.label)}\\n{_dot(n.type_text)}", '
                     f'tooltip="{_dot(n.tooltip)}", class="{n.classes}", id="n{n.id}", '
                     f'fillcolor="{fill}", color="{stroke}", penwidth={width}, '
                     f'style="{style}"];')
    lines += [f"  n{a} -> n{b};" for a, b in edges]
    lines.append("}")
    return "\n".join(lines)


def _dot(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def svg_by_dot(nodes: Sequence[DrawnNode], edges: Sequence[tuple[int, int]]) -> str | None:
    """SVG from Graphviz's `dot`, or None when it is not installed or fails."""
    exe = shutil.which("dot")
    if exe is None:
        return None
    try:
        run = subprocess.run([exe, "-Tsvg"], input=dot_source(nodes, edges),
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    start = run.stdout.find("<svg")
    return run.stdout[start:] if run.returncode == 0 and start >= 0 else None


def graph_svg(g: Graph, misses: Sequence[MissedFusion] = (), *, max_nodes: int = MAX_DRAWN
              ) -> tuple[str, str]:
    """(SVG, note) for `g`: the note says how it was laid out and whether it was cut."""
    nodes, edges = drawn_nodes(g, misses)
    note = ""
    if len(nodes) > max_nodes:
        note = (f"showing the first {max_nodes} of {len(nodes)} nodes (graph order); the text "
                "IR below lists them all. ")
        kept = {n.id for n in nodes[:max_nodes]}
        nodes = nodes[:max_nodes]
        edges = [(a, b) for a, b in edges if a in kept and b in kept]
    svg = svg_by_dot(nodes, edges)
    if svg is not None:
        return svg, note + "Laid out by Graphviz dot."
    why = "failed" if shutil.which("dot") else "is not installed"
    return svg_by_layout(nodes, edges), note + f"Laid out by braze (Graphviz dot {why})."
