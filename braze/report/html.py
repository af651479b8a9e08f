"""HTML rendering of a FusionReport with the before/after graphs side by side."""
from __future__ import annotations

from html import escape


def render_html(report, before=None, after=None) -> str:
    rows = "".join(
        f"<tr><td>{escape(m.pattern)}</td><td>{escape(m.context)}</td>"
        f"<td>{escape(m.reason.value)}</td><td>{escape(m.detail or '')}</td>"
        f"<td>{escape(m.hint)}</td></tr>" for m in report.misses)
    fused = "".join(f"<li>{escape(k)}: {v}</li>" for k, v in report.fused_counts.items())
    graphs = ""
    if before is not None and after is not None:
        graphs = ("<div class=side><div><h2>before</h2><pre>" + escape(str(before)) +
                  "</pre></div><div><h2>after</h2><pre>" + escape(str(after)) +
                  "</pre></div></div>")
    return f"""<!doctype html><html><head><meta charset=utf-8>
<title>braze fusion report: {escape(report.graph_name)}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top}} pre{{font-size:11px}}
.side{{display:flex;gap:2em}} .side>div{{flex:1;overflow:auto}}</style></head><body>
<h1>Fusion report: {escape(report.graph_name)}</h1>
<p>{escape(report.summary_line())}</p><h2>fused</h2><ul>{fused or '<li>nothing</li>'}</ul>
<h2>not fused</h2><table><tr><th>pattern</th><th>where</th><th>reason</th><th>detail</th>
<th>hint</th></tr>{rows}</table>{graphs}</body></html>"""
