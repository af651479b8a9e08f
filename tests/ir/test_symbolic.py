"""Symbolic dims: canonical text, arithmetic, exact division, evaluation, and the shapes built
from them (reshape through products, interpreter binding of expression dims)."""
import numpy as np
import pytest

import braze as bz
from braze.ir.symbolic import SymDim, canonical_dim, eval_dim, monomial_factors


@pytest.mark.parametrize("text, canon", [
    ("seq", "seq"), ("seq*batch", "batch*seq"), ("2*seq", "2*seq"), ("seq+past", "past+seq"),
    ("seq - 1", "seq-1"), ("1+seq*2", "2*seq+1"), ("seq*seq", "seq*seq"), ("4", 4),
    ("seq-seq", 0),
])
def test_canonical_text(text, canon):
    assert canonical_dim(text) == canon


def test_arithmetic_and_exact_division():
    b, s = SymDim.of("batch"), SymDim.of("seq")
    assert str(b * s * 4) == "4*batch*seq"
    assert (b * s * 4) // 4 == b * s
    assert (b * s) // s == b
    assert str(s + 1 - 1) == "seq"
    with pytest.raises(ValueError, match="not divisible"):
        (s * 3) // 2
    with pytest.raises(ValueError, match="only by a monomial"):
        s // (s + 1)


def test_evaluate_and_missing_symbol():
    assert eval_dim("2*batch*seq+1", {"batch": 3, "seq": 5}) == 31
    assert eval_dim(7, {}) == 7
    with pytest.raises(KeyError):
        eval_dim("seq", {})


def test_known_ne_assumes_symbols_at_least_two():
    s = SymDim.of("seq")
    assert s.known_ne(-1) and s.known_ne(1) and s.known_ne(0)
    assert not s.known_ne(2) and not s.known_ne("seq")
    assert (s - 1).known_ne(0) and not (s - 2).known_ne(0)


def test_monomial_factors():
    assert monomial_factors("4*batch*seq") == (4, {"batch": 1, "seq": 1})
    assert monomial_factors("past+seq") is None
    assert monomial_factors(6) == (6, {})


@pytest.mark.parametrize("bad", ["seq/2", "2seq", "", "a**b", "seq+", "(seq)"])
def test_bad_expressions_are_shape_errors(bad):
    with pytest.raises(bz.ShapeError, match="symbolic dim"):
        bz.Shape((bad, 4))


def test_expression_dims_run_through_the_interpreter():
    g = bz.Graph("flat")
    x = g.input("x", bz.Shape(("batch", "seq", 4)))
    flat = g.reshape(x, (-1, 4))                           # [batch*seq, 4]
    back = g.reshape(flat, ("batch", "seq", 4))
    g.set_outputs([flat, back])
    assert g.shape_of(flat).dims == ("batch*seq", 4)
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    f, b = bz.interpret(g, {"x": a})
    assert f.shape == (6, 4) and np.array_equal(b, a)
    assert bz.Graph.parse(str(g)) == g


def test_inputs_declared_with_expressions_are_checked():
    g = bz.Graph("pair")
    x = g.input("x", bz.Shape(("seq", 2)))
    y = g.input("y", bz.Shape(("seq+1", 2)))
    g.set_outputs([g.concat([x, y], 0)])
    (out,) = bz.interpret(g, {"x": np.zeros((3, 2), np.float32),
                              "y": np.ones((4, 2), np.float32)})
    assert out.shape == (7, 2)
    with pytest.raises(bz.InterpretError, match="seq\\+1 = 4"):
        bz.interpret(g, {"x": np.zeros((3, 2), np.float32), "y": np.ones((5, 2), np.float32)})
