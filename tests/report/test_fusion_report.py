"""FusionReport: counts before/after, fused kinds, misses with reasons/context/hints, renderers."""
import json

import braze as bz
from braze.models import bert_encoder


def graph_with_misses():
    g = bz.Graph("misses")
    x = g.input("x", bz.Shape((4, 8)))
    w1 = g.param("w1", bz.Shape((8, 8)))
    w2 = g.param("w2", bz.Shape((8, 8)))
    b = g.param("b", bz.Shape((8,)))
    pre = g.add(g.mm(x, w1), b)                 # also a graph output: act cannot fuse over it
    h = g.gelu(pre)
    y = g.sub(g.mm(h, w2), b)                   # non-add bias consumer
    g.set_outputs([y, pre])
    return g


def test_report_counts_and_misses():
    g = graph_with_misses()
    fused, report = bz.fuse(g, "cpu", regions=False)
    assert report.nodes_before == 5 and report.nodes_after == len(
        [n for n in fused.nodes if not n.op.source])
    assert report.count("matmul", "before") == 2
    assert report.fused_counts.get("fused_matmul_bias_act") == 1
    reasons = {m.reason for m in report.misses}
    assert bz.MissReason.GRAPH_OUTPUT in reasons
    assert bz.MissReason.NON_ADD_BIAS_CONSUMER in reasons
    for m in report.misses:
        assert m.hint and m.context and "test_fusion_report.py" in m.context  # provenance


def test_renderers():
    g = graph_with_misses()
    fused, report = bz.fuse(g, "cpu")
    text = str(report)
    assert "graph_output" in text and "hint:" in text and "FuseMatMulBiasAct" in text
    line = report.summary_line()
    assert "\n" not in line and "misses=" in line and "fused_matmul_bias_act=1" in line
    data = json.loads(report.to_json())
    assert data["fused"]["fused_matmul_bias_act"] == 1
    assert {m["reason"] for m in data["misses"]} >= {"graph_output", "non_add_bias_consumer"}
    assert any(r["rule"] == "FuseMatMulBiasAct" and r["matches"] == 1 for r in data["rules"])
    html = report.to_html(g, fused)
    assert html.startswith("<!doctype html>") and "graph_output" in html and "matmul" in html


def test_per_pass_timings_and_rule_stats():
    g = bert_encoder(layers=1, hidden=32, heads=2, seq=4)
    _, report = bz.fuse(g, "cpu")
    names = [n for n, _ in report.pass_times]
    assert "FuseAttentionBlock" in names and "FuseMatMulBiasAct" in names
    assert all(t >= 0 for _, t in report.pass_times)
    st = report.rule_stats
    assert any(s.matches >= 1 and ".py:" in s.source for s in st.values())


def test_scan_reports_without_returning_a_graph():
    report = bz.FusionReport.scan(graph_with_misses())
    assert isinstance(report, bz.FusionReport)
    assert any(m.reason is bz.MissReason.GRAPH_OUTPUT for m in report.misses)


def test_analyze_two_graphs():
    g = bert_encoder(layers=1, hidden=32, heads=2, seq=4)
    fused, _ = bz.fuse(g, "cpu")
    r = bz.FusionReport.analyze(g, fused)
    assert r.count("attention", "before") == 1 and r.count("attention") == 0
    assert r.fused_counts["fused_attention_block"] == 1


def test_text_gives_each_miss_of_a_reason_its_own_hint():
    """Two SHAPE_MISMATCH misses with different hints (a conv's misaligned bias, a norm's
    broadcast residual): each is listed above its own hint, not under the first one's."""
    g = bz.Graph("two_hints")
    x = g.input("x", bz.Shape((2, 6, 4, 4)))
    c = g.relu(g.add(g.conv2d(x, g.param("w", bz.Shape((6, 6, 3, 3))), padding=1),
                     g.param("b", bz.Shape((4,)))))
    g.set_outputs([g.layer_norm(g.add(c, g.input("r", bz.Shape((2, 6, 4, 1)))))])
    _, report = bz.fuse(g, "cpu")
    ms = report.misses_by_reason()[bz.MissReason.SHAPE_MISMATCH]
    assert len({m.hint for m in ms}) == 2
    lines = str(report).splitlines()
    for m in ms:
        at = next(i for i, t in enumerate(lines) if t.strip().startswith(m.pattern))
        hint = next(t for t in lines[at:] if t.strip().startswith("hint:"))
        assert hint.strip() == f"hint: {m.hint}"
