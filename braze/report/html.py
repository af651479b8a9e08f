"""HTML rendering of a FusionReport: summary, fused kinds, the misses table, and the before and
after graphs drawn as graphs (braze/report/graph_svg.py: fused nodes coloured, nodes with a near
miss marked, the reason and hint on hover), each with its text IR folded below."""
from __future__ import annotations

import re
from html import escape

from .graph_svg import FUSED_FILL, MISS_STROKE, graph_svg

_STYLE = """body{font-family:sans-serif;margin:2em} table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top} pre{font-size:11px}
.drawing{overflow:auto;max-height:80vh;border:1px solid #ddd;padding:4px}
.note{color:#555;font-size:90%} .key{display:inline-block;width:1em;height:1em;
vertical-align:middle;border:1px solid #607d8b;margin:0 .3em 0 1em}
svg .node:hover rect{stroke-width:3}"""


def render_html(report, before=None, after=None) -> str:
    rows = "".join(
        f"<tr><td>{escape(m.pattern)}</td><td>{escape(m.context)}</td>"
        f"<td>{escape(m.reason.value)}</td><td>{escape(m.detail or '')}</td>"
        f"<td>{escape(m.hint)}</td></tr>" for m in report.misses)
    fused = "".join(f"<li>{escape(k)}: {v}</li>" for k, v in report.fused_counts.items())
    graphs = ""
    if before is not None and after is not None:
        legend = (f'<p class=note><span class=key style="background:{FUSED_FILL}"></span>fused'
                  f'<span class=key style="border:2px dashed {MISS_STROKE}"></span>near miss '
                  "(hover a node for its reason and hint)</p>")
        graphs = legend + _graph_section("before", before, report.misses) + \
            _graph_section("after", after, report.misses)
    return f"""<!doctype html><html><head><meta charset=utf-8>
<title>braze fusion report: {escape(report.graph_name)}</title>
<style>{_STYLE}</style></head><body>
<h1>Fusion report: {escape(report.graph_name)}</h1>
<p>{escape(report.summary_line())}</p><h2>fused</h2><ul>{fused or '<li>nothing</li>'}</ul>
<h2>not fused</h2><table><tr><th>pattern</th><th>where</th><th>reason</th><th>detail</th>
<th>hint</th></tr>{rows}</table>{graphs}</body></html>"""


_LONG_CONSTANT = re.compile(r'\{"([A-Za-z0-9+/=]{256,})"\}')


def _readable_ir(g) -> str:
    """The text IR with each large constant's base64 replaced by its length: a page for
    reading (a 100 MB weight had made it ~270 MB); `str(g)` keeps every byte."""
    return _LONG_CONSTANT.sub(lambda m: f'{{"... {len(m.group(1))} base64 characters"}}',
                              str(g))


def _graph_section(title: str, g, misses) -> str:
    svg, note = graph_svg(g, misses)
    return (f"<h2>{title}: {len(g.nodes)} nodes</h2><p class=note>{escape(note)}</p>"
            f"<div class=drawing>{svg}</div><details><summary>text IR</summary><pre>"
            f"{escape(_readable_ir(g))}</pre></details>")
