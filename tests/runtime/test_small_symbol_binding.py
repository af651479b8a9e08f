"""Shape inference proves a conv's windows fit for symbols >= MIN_SYMBOL_VALUE (2); a feed that
binds a smaller value ("2*h" fed 2 rows: h = 1, or 0 rows) and so breaks a node is refused with
an InterpretError naming the node and the binding, by the compiled executor and by the
reference interpreter alike (it had been a bare ShapeError "dim -1 is negative" from the
executor's planner, and NumPy's "window shape cannot be larger than input array shape" from the
conv reference). Bindings below 2 that every node takes keep running."""
import numpy as np
import pytest

import braze as bz


def _conv_graph():
    g = bz.Graph("small_h")
    x = g.input("x", bz.Shape(("batch", 3, "2*h", 8)))
    w = g.param("w", bz.Shape((4, 3, 4, 1)))
    g.set_outputs([g.conv2d(x, w, None, 1, 0, 1, 1)])  # rows 2*h - 3: >= 1 only for h >= 2
    return g, bz.init_params(g, seed=0)


@pytest.mark.parametrize("rows", [2, 0])
def test_compiled_names_node_and_binding(rows):
    g, params = _conv_graph()
    exe = bz.compile(g, "cpu", params=params)
    assert exe({"x": np.ones((1, 3, 4, 8), np.float32)})[0].shape == (1, 4, 1, 8)
    with pytest.raises(bz.InterpretError, match=rf"'h': {rows // 2}\}}.*conv2d.*window"):
        exe({"x": np.ones((1, 3, rows, 8), np.float32)})


@pytest.mark.parametrize("rows", [2, 0])
def test_interpret_names_node_and_binding(rows):
    g, params = _conv_graph()
    with pytest.raises(bz.InterpretError, match=rf"'h': {rows // 2}\}}.*conv2d.*window"):
        bz.interpret(g, {"x": np.ones((1, 3, rows, 8), np.float32)}, params)


def test_small_symbols_that_fit_still_run():
    g, params = _conv_graph()
    exe = bz.compile(g, "cpu", params=params)
    x = np.random.default_rng(0).standard_normal((1, 3, 6, 8)).astype(np.float32)  # batch=1
    np.testing.assert_allclose(exe({"x": x})[0], bz.interpret(g, {"x": x}, params)[0],
                               rtol=1e-5, atol=1e-5)
    assert exe({"x": np.ones((0, 3, 6, 8), np.float32)})[0].shape == (0, 4, 3, 8)  # batch=0
