"""range and sym_const: tensors made from (symbolic) dims, evaluated with the run's bindings."""
import numpy as np
import pytest

import braze as bz


def test_range_with_a_symbolic_length_follows_the_feeds():
    g = bz.Graph("pos")
    x = g.input("ids", bz.Shape(("batch", "seq"), bz.i64))
    pos = g.arange("seq")
    g.set_outputs([g.add(g.reshape(pos, (1, "seq")), x)])
    assert g.shape_of(pos).dims == ("seq",)
    for n in (3, 7):
        (out,) = bz.interpret(g, {"ids": np.zeros((2, n), np.int64)})
        np.testing.assert_array_equal(out, np.broadcast_to(np.arange(n), (2, n)))


def test_range_start_delta_dtype():
    g = bz.Graph("r")
    g.set_outputs([g.arange(4, start=1.5, delta=-0.5, dtype=bz.f32)])
    (out,) = bz.interpret(g, {})
    np.testing.assert_array_equal(out, np.array([1.5, 1.0, 0.5, 0.0], np.float32))


def test_sym_const_evaluates_expressions():
    g = bz.Graph("shape")
    g.input("x", bz.Shape(("batch", "seq", 4)))
    g.set_outputs([g.sym_const(("batch*seq", 4, "seq+1"))])
    (out,) = bz.interpret(g, {"x": np.zeros((2, 3, 4), np.float32)})
    np.testing.assert_array_equal(out, [6, 4, 4])
    assert out.dtype == np.int64


def test_sym_const_checks_its_shape_and_unbound_symbols_are_errors():
    g = bz.Graph("bad")
    with pytest.raises(bz.ShapeError, match="3 values for shape"):
        g.sym_const((1, 2, 3), shape=(2,))
    g.set_outputs([g.arange("n")])
    with pytest.raises(bz.InterpretError, match="symbol 'n'"):
        bz.interpret(g, {})
