"""The HTML report draws the before and after graphs as SVG: fused nodes coloured, nodes with a
near miss marked with the reason and hint in their tooltip; Graphviz's dot lays them out when
installed, braze's layered layout otherwise; large graphs are cut with a note."""
import os
import re
import shutil
import stat

import numpy as np
import pytest

import braze as bz
from braze.report import graph_svg as gs


def graph_with_a_fusion_and_a_miss():
    g = bz.Graph("drawn")
    x = g.input("x", bz.Shape((4, 8)))
    y = g.input("y", bz.Shape((4, 8)))
    fused = g.gelu(g.add(g.mm(x, g.param("w", bz.Shape((8, 16)))),
                         g.param("b", bz.Shape((16,)))))
    missed = g.sub(g.mm(y, g.param("w2", bz.Shape((8, 16)))), g.param("v", bz.Shape((16,))))
    g.set_outputs([g.add(fused, missed)])
    return g


def node_groups(svg: str) -> dict[str, str]:
    """data-node -> the whole <g> element of that node."""
    return {m.group(2): m.group(0) for m in
            re.finditer(r'<g class="([^"]*)" data-node="([^"]+)">.*?</g>', svg, re.S)}


@pytest.fixture
def no_dot(monkeypatch):
    monkeypatch.setattr(gs.shutil, "which", lambda name: None)


def test_html_draws_both_graphs_with_the_fused_node_coloured_and_the_miss_marked(no_dot):
    g = graph_with_a_fusion_and_a_miss()
    fused, report = bz.fuse(g, "cpu", regions=False)
    (miss,) = report.misses
    html = report.to_html(g, fused)
    assert html.count("<svg") == 2 and "Laid out by braze" in html
    after = html[html.index("<h2>after"):]
    groups = node_groups(after[after.index("<svg"):])
    (fused_g,) = [e for e in groups.values() if 'class="node fused' in e]
    assert "fused_matmul_bias_act[gelu]" in fused_g and gs.FUSED_FILL in fused_g
    (missed_g,) = [e for e in groups.values() if "missed" in e.split(">")[0]]
    title = re.search(r"<title>(.*?)</title>", missed_g, re.S).group(1)
    assert "matmul" in title and miss.reason.value in title and "hint: " in title
    assert "x @ w + (-b)" in title and gs.MISS_STROKE in missed_g
    before = html[html.index("<h2>before"):html.index("<h2>after")]
    assert ' missed' in before and 'class="node fused' not in before
    assert "<details><summary>text IR</summary>" in html                   # text IR kept


def test_every_non_source_node_and_input_is_drawn_params_are_in_tooltips(no_dot):
    g = graph_with_a_fusion_and_a_miss()
    svg, _ = gs.graph_svg(g)
    groups = node_groups(svg)
    want = {f"%{n.id}" for n in g.nodes if not n.op.source or n.op.kind == "input"}
    assert set(groups) == want
    assert "reads w2, v" not in svg and "reads w2" in svg        # each node lists its own params
    assert svg.count('class="edge"') == 7


def test_layered_layout_puts_every_edge_downwards_and_orders_each_layer():
    ids = [0, 1, 2, 3, 4, 5]
    edges = [(0, 2), (1, 3), (2, 4), (3, 4), (0, 5), (4, 5)]
    layers = gs.layered_layout(ids, edges)
    level = {i: k for k, layer in enumerate(layers) for i in layer}
    assert all(level[a] < level[b] for a, b in edges)
    assert level[5] == 3                                   # longest path, not the shortest
    assert sorted(i for layer in layers for i in layer) == ids


def test_a_large_graph_is_cut_with_a_note(no_dot):
    g = bz.Graph("long")
    h = g.input("x", bz.Shape((2, 3)))
    for _ in range(30):
        h = g.relu(h)
    g.set_outputs([h])
    svg, note = gs.graph_svg(g, max_nodes=10)
    assert "first 10 of 31 nodes" in note and len(node_groups(svg)) == 10


def test_misses_attach_only_to_the_node_they_describe():
    g = graph_with_a_fusion_and_a_miss()
    _, report = bz.fuse(g, "cpu", regions=False)
    found = gs.misses_by_node(g, report.misses)
    ((nid, ms),) = found.items()
    assert g.nodes[nid].op.kind == "matmul" and ms == report.misses


def _fake_dot(tmp_path):
    """A `dot` that answers with an SVG quoting the DOT source it was given."""
    dot = tmp_path / "dot"
    dot.write_text("#!/bin/sh\necho '<?xml version=\"1.0\"?>'\necho '<svg id=\"from-dot\">'\n"
                   "cat\necho '</svg>'\n")
    dot.chmod(dot.stat().st_mode | stat.S_IEXEC)
    return dot


def test_dot_is_used_when_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{_fake_dot(tmp_path).parent}{os.pathsep}{os.environ['PATH']}")
    g = graph_with_a_fusion_and_a_miss()
    fused, report = bz.fuse(g, "cpu", regions=False)
    svg, note = gs.graph_svg(fused, report.misses)
    assert note == "Laid out by Graphviz dot." and svg.startswith('<svg id="from-dot">')
    assert 'class="node fused output"' not in svg and 'class="node fused"' in svg
    assert f'fillcolor="{gs.FUSED_FILL}"' in svg and 'style="rounded,filled,dashed"' in svg


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz dot is not installed")
def test_real_dot_renders_the_report():
    g = graph_with_a_fusion_and_a_miss()
    fused, report = bz.fuse(g, "cpu", regions=False)
    html = report.to_html(g, fused)
    assert "Laid out by Graphviz dot." in html and html.count("<svg") == 2


def test_a_large_constant_is_left_out_of_the_pages_text_ir(no_dot):
    """The page's text IR gives a large constant's length, not its base64 (a 4 MB weight had
    made a 10.7 MB page); small ones print as they are."""
    g = bz.Graph("big")
    x = g.input("x", bz.Shape((100_000,)))
    g.set_outputs([g.add(g.mul(x, g.constant(np.full(100_000, 2.0, np.float32))),
                         g.constant(np.arange(3, dtype=np.float32).repeat(1).sum()))])
    fused, report = bz.fuse(g)
    page = report.to_html(g, fused)
    assert "533336 base64 characters" in page
    assert len(page) < 100_000 and "3.0" in page
