"""`bz.inspect_pipeline`: the graph as built, after each pass that changed it, legalized, and the
compiled plan, as text; `dump_dir=` writes one numbered file per stage plus an index."""
import numpy as np

import braze as bz


def linear_gelu(batch="batch"):
    g = bz.Graph("linear_gelu")
    x = g.input("x", bz.Shape((batch, 8)))
    w = g.param("w", bz.Shape((8, 16)))
    b = g.param("b", bz.Shape((16,)))
    g.set_outputs([g.gelu(g.add(g.mm(x, w), b))])
    return g


def test_stages_in_order_from_built_to_compiled():
    g = linear_gelu()
    text = str(g)
    ins = bz.inspect_pipeline(g, "cpu")
    assert ins.names[0] == "built" and ins.names[-2:] == ["legalized", "compiled"]
    assert ins.stage("built") == text and str(g) == text                 # g is not changed
    assert "FuseMatMulBiasAct" in ins.names
    assert "fused_matmul_bias_act" in ins.stage("FuseMatMulBiasAct")
    assert "fused_matmul_bias_act" not in ins.stage("built")
    # only passes that changed the graph are stages; the rest are named as unchanged
    assert "FuseAttentionBlock" in ins.unchanged and "FuseAttentionBlock" not in ins.names
    assert ins.report.count("fused_matmul_bias_act") == 1
    fused, _ = bz.fuse(g, "cpu")
    last_pass = ins.stages[ins.names.index("legalized") - 1]
    assert last_pass.text == str(fused)
    for name, text in ins.stages:                                          # (name, text) pairs
        assert isinstance(name, str) and text


def test_each_stage_summary_says_what_changed():
    ins = bz.inspect_pipeline(linear_gelu(), "cpu")
    summary = ins.summaries[ins.names.index("FuseMatMulBiasAct")]
    assert "fused_matmul_bias_act +1" in summary and "matmul -1" in summary
    assert ins.summaries[0] == f"{len(linear_gelu().nodes)} nodes"


def test_compiled_stage_binds_symbolic_dims_from_feeds_and_shows_the_plan():
    g = linear_gelu()
    feeds = {"x": np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)}
    ins = bz.inspect_pipeline(g, "cpu", feeds=feeds)
    text = ins.stage("compiled")
    assert "batch=5" in text and "Dispatch report" in text and "Memory plan" in text
    assert "kernel steps" in text
    params = {k: np.asarray(v, np.float32) for k, v in bz.init_params(g, 0).items()}
    want = bz.interpret(g, feeds, params)
    ins.executable.update_weights(params)
    np.testing.assert_allclose(ins.executable(feeds)[0], want[0], rtol=1e-4, atol=1e-5)


def test_without_feeds_symbols_choose_the_binding():
    text = bz.inspect_pipeline(linear_gelu(), "cpu", symbols={"batch": 7}).stage("compiled")
    assert "batch=7" in text
    assert "batch=3" in bz.inspect_pipeline(linear_gelu(), "cpu").stage("compiled")


def test_plan_stage_is_a_note_when_it_cannot_compile_or_is_not_asked_for():
    ins = bz.inspect_pipeline(linear_gelu(), "cpu", feeds={})
    assert ins.stage("compiled").startswith("skipped: the graph cannot be compiled")
    assert "needs input 'x'" in ins.stage("compiled") and ins.executable is None
    off = bz.inspect_pipeline(linear_gelu(), "cpu", compile=False)
    assert off.stage("compiled") == "skipped (compile=False)"


def test_reference_target_has_no_pass_stages():
    ins = bz.inspect_pipeline(linear_gelu(4), "reference")
    assert ins.names == ["built", "legalized", "compiled"]
    assert "fused" not in ins.stage("legalized").split("\n\n")[0]


def test_legalized_stage_lowers_what_a_restricted_target_cannot_run():
    claims = bz.get_target("cpu").claims - {"gelu", "fused_matmul_bias_act"}
    target = bz.get_target("cpu").restrict(claims).with_options(keep_regions=False)
    ins = bz.inspect_pipeline(linear_gelu(4), target, compile=False)
    assert "= gelu(" in ins.stage("built")
    graph_text, dispatch = ins.stage("legalized").split("\n\n", 1)
    assert "= gelu(" not in graph_text and "= erf(" in graph_text
    assert "0 missing" in dispatch


def test_dump_dir_writes_numbered_files_and_an_index(tmp_path):
    ins = bz.inspect_pipeline(linear_gelu(), "cpu", dump_dir=tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted(ins.file_names() + ["index.txt"])
    assert ins.file_names()[0] == "00_built.txt"
    assert ins.file_names()[-1].endswith("_compiled.txt")
    fuse_file = ins.file_names()[ins.names.index("FuseMatMulBiasAct")]
    assert "fused_matmul_bias_act" in (tmp_path / fuse_file).read_text()
    index = (tmp_path / "index.txt").read_text()
    assert all(name in index for name in ins.file_names())
    assert "passes that changed nothing" in index


def test_str_is_the_index_then_every_stage():
    ins = bz.inspect_pipeline(linear_gelu(), "cpu", compile=False)
    text = str(ins)
    assert text.startswith("Pipeline inspection of 'linear_gelu' for target cpu")
    assert all(f"== {f.removesuffix('.txt')}:" in text for f in ins.file_names())
