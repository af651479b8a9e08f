"""maximum / minimum of equal operands (+0.0 against -0.0) and relu(-0.0), one rule for every
float dtype: the second of equal operands, as NumPy's float32 loop (NumPy's float16 loop keeps
the first, so float16 used to differ from float32 / bfloat16). A NaN operand wins. The
interpreter, the plain kernels, the half-precision C kernels and generated regions agree, and
max(0, x) is not taken for relu(x) (they differ at x = -0.0)."""
import numpy as np
import pytest

import braze as bz

DTYPES = [bz.f32, bz.f64, bz.f16, bz.bf16]
A = [0.0, -0.0, -0.0, 0.0, np.nan, 1.0, np.nan, -2.0]
B = [-0.0, 0.0, -0.0, 0.0, 1.0, np.nan, np.nan, 3.0]


def _bits(a):
    """(sign bits, NaN positions, values): NaNs compared by position (their payloads and signs
    are the CPU's), everything else bit for bit."""
    a = np.asarray(a).astype(np.float32)
    nan = np.isnan(a)
    return np.where(nan, False, np.signbit(a)), nan, np.nan_to_num(a)


def _same(got, want):
    for g, w in zip(_bits(got), _bits(want)):
        np.testing.assert_array_equal(g, w)


def _graphs(dt, build):
    """(plain graph, the same op as a one-op generated region)."""
    shape = bz.Shape((len(A),), dt)
    g = bz.Graph("plain")
    g.set_outputs([build(g, g.input("x", shape), g.input("y", shape))])
    body = bz.Graph("body")
    body.set_outputs([build(body, body.input("in0", shape), body.input("in1", shape))])
    r = bz.Graph("region")
    r.set_outputs([r.elementwise_region(body, [r.input("x", shape), r.input("y", shape)])])
    return g, r


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("fn", ["maximum", "minimum"])
def test_ties_give_the_second_operand_and_nan_wins_everywhere(dt, fn):
    feeds = {"x": np.asarray(A, np.float64).astype(dt.np),
             "y": np.asarray(B, np.float64).astype(dt.np)}
    pick = (lambda a, b: a > b) if fn == "maximum" else (lambda a, b: a < b)
    a, b = np.asarray(A), np.asarray(B)
    want = np.where(np.isnan(a) | pick(a, b), a, b)
    for g in _graphs(dt, lambda g, x, y: getattr(g, fn)(x, y)):
        with np.errstate(invalid="ignore"):
            _same(bz.interpret(g, feeds)[0], want)
            _same(bz.compile(g)(feeds)[0], want)


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
def test_relu_of_negative_zero_is_positive_zero_and_max_zero_x_keeps_it(dt):
    x = np.asarray([-0.0, 0.0, -1.0, 2.0], np.float64).astype(dt.np)
    g = bz.Graph("relu")
    xi = g.input("x", bz.Shape((4,), dt))
    zero = g.constant(np.asarray(0.0, dt.np), dt)
    g.set_outputs([g.relu(xi), g.maximum(zero, xi), g.maximum(xi, zero)])
    want = [[0.0, 0.0, 0.0, 2.0], [-0.0, 0.0, 0.0, 2.0], [0.0, 0.0, 0.0, 2.0]]
    for outs in (bz.interpret(g, {"x": x}), bz.compile(g)({"x": x})):
        for got, w in zip(outs, want, strict=True):
            _same(got, np.asarray(w))
