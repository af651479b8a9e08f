"""Input.excludes: sizes a graph does not hold for (an import made for a range of sizes, or a
decision taken for sizes >= 2). A binding into an excluded span is refused, naming the input,
the size and why, by the interpreter, a compiled executable and Graph.bind; the exclusions
survive fusion, the text IR and save / load; a bound dim's exclusions are checked and gone."""
import numpy as np
import pytest

import braze as bz

WHY = "made for seq <= 64"


def _graph():
    g = bz.Graph("excl")
    x = g.input("x", bz.Shape((2, "seq")), excludes=[("seq", 65, None, WHY),
                                                     ("seq", 1, 1, "squeezed at 1")])
    g.set_outputs([g.mul(x, 2.0)])
    return g


def _feeds(n):
    return {"x": np.ones((2, n), np.float32)}


@pytest.mark.parametrize("n, why", [(80, r"\(seq >= 65\): made for seq <= 64"),
                                    (1, r"\(seq = 1\): squeezed at 1")])
def test_a_binding_in_an_excluded_span_is_refused_everywhere(n, why):
    g = _graph()
    match = rf"input 'x' binds seq = {n}, a size the graph does not hold for {why}"
    for run in (lambda: bz.interpret(g, _feeds(n)), lambda: bz.compile(g)(_feeds(n)),
                lambda: g.bind(seq=n)):
        with pytest.raises(bz.BrazeError, match=match):
            run()


def test_other_sizes_run_and_a_bound_dim_drops_its_exclusions():
    g = _graph()
    for n in (0, 2, 64):
        np.testing.assert_array_equal(bz.compile(g)(_feeds(n))[0], np.full((2, n), 2.0))
        assert bz.interpret(g, _feeds(n))[0].shape == (2, n)
    assert g.bind(seq=7).inputs[0].op.excludes == ()


def test_exclusions_survive_fusion_the_text_ir_and_save_load(tmp_path):
    g = _graph()
    assert bz.Graph.parse(str(g)) == g
    bz.save(g, str(tmp_path / "g.json"))
    assert bz.load(str(tmp_path / "g.json")) == g
    fused, _ = bz.fuse(g)
    assert fused.inputs[0].op.excludes == g.inputs[0].op.excludes


def test_an_expression_dim_is_checked_once_its_symbols_bind():
    g = bz.Graph("multiple")
    x = g.input("x", bz.Shape(("32*h",)), excludes=[("32*h", 0, 0, "no empty image")])
    g.set_outputs([g.neg(x)])
    with pytest.raises(bz.BrazeError, match=r"binds 32\*h = 0"):
        bz.interpret(g, {"x": np.ones(0, np.float32)})
    assert bz.interpret(g, {"x": np.ones(64, np.float32)})[0].shape == (64,)


def test_vmap_keeps_the_exclusions_of_batched_and_unbatched_inputs():
    g = bz.Graph("two")
    x = g.input("x", bz.Shape((2, "seq")), excludes=[("seq", 65, None, WHY)])
    y = g.input("y", bz.Shape(("seq",)), excludes=[("seq", 1, 1, "squeezed at 1")])
    g.set_outputs([g.add(x, y)])
    v = bz.vmap(g, "x")
    assert [n.op.excludes for n in v.inputs] == [n.op.excludes for n in g.inputs]
    with pytest.raises(bz.BrazeError, match=r"binds seq = 80"):
        bz.interpret(v, {"x": np.ones((3, 2, 80), np.float32), "y": np.ones(80, np.float32)})
