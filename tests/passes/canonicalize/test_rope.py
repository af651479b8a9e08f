"""RoPE written in primitives becomes the rope op (rotate-half, interleaved, partial), with the
half tables read off the exported full tables only when they provably repeat."""
import numpy as np
from helpers import canonicalize, check_same

import braze as bz

D = 8


def _tables(g, n, form="cat"):
    """cos/sin [1, 1, s, n] from position ids: cos(cat(f, f)) (rotate-half layout)."""
    pos = g.cast(g.reshape(g.arange("s"), (1, "s", 1)), bz.f32)
    inv = g.param("inv_freq", bz.Shape((1, 1, n // 2)),
                  value=(10000.0 ** (-np.arange(0, n, 2) / n)).reshape(1, 1, -1).astype("f4"))
    f = g.mul(pos, inv)
    if form == "cat":
        emb = g.concat([f, f], -1)
    else:                                   # two different halves: not a rope table
        emb = g.concat([f, g.mul(f, 2.0)], -1)
    return (g.reshape(g.cos(emb), (1, 1, "s", n)), g.reshape(g.sin(emb), (1, 1, "s", n)))


def _rotate_half(g, x, n):
    h = n // 2
    return g.concat([g.neg(g.narrow(x, -1, h, h)), g.narrow(x, -1, 0, h)], -1)


def _rope(g, x, cos, sin, n):
    return g.add(g.mul(x, cos), g.mul(_rotate_half(g, x, n), sin))


def test_rotate_half_rope():
    g = bz.Graph("rope")
    x = g.input("x", bz.Shape(("b", 2, "s", D)))
    cos, sin = _tables(g, D)
    g.set_outputs([_rope(g, x, cos, sin, D)])
    out, _ = canonicalize(g)
    (r,) = [n for n in out.nodes if n.op.kind == "rope"]
    assert not r.op.interleaved and r.op.n_rot is None
    assert out.count("neg") == 0 and out.count("concat") == 1     # the table's cat(f, f)
    check_same(g, out, symbols={"b": 2, "s": 5})


def test_partial_rotation_merges_into_n_rot():
    g = bz.Graph("partial")
    x = g.input("x", bz.Shape(("b", 2, "s", D)))
    n = 4
    cos, sin = _tables(g, n)
    rot = _rope(g, g.narrow(x, -1, 0, n), cos, sin, n)
    g.set_outputs([g.concat([rot, g.narrow(x, -1, n, D - n)], -1)])
    out, _ = canonicalize(g)
    (r,) = [n_ for n_ in out.nodes if n_.op.kind == "rope"]
    assert r.op.n_rot == n and out.shape_of(r.inputs[0]).dims[-1] == D
    check_same(g, out, symbols={"b": 2, "s": 5})


def test_interleaved_rope():
    g = bz.Graph("gptj")
    x = g.input("x", bz.Shape((2, 2, 5, D)))
    h = D // 2
    ang = np.outer(np.arange(5), 10000.0 ** (-np.arange(h) / h)).astype("f4")
    cos = g.param("cos", bz.Shape((5, D)), value=np.repeat(np.cos(ang), 2, axis=-1))
    sin = g.param("sin", bz.Shape((5, D)), value=np.repeat(np.sin(ang), 2, axis=-1))
    even, odd = g.slice(x, -1, 0, D, 2), g.slice(x, -1, 1, D, 2)
    pair = [g.reshape(g.neg(odd), (2, 2, 5, h, 1)), g.reshape(even, (2, 2, 5, h, 1))]
    rot = g.reshape(g.concat(pair, -1), (2, 2, 5, D))
    g.set_outputs([g.add(g.mul(x, cos), g.mul(rot, sin))])
    out, _ = canonicalize(g)
    (r,) = [n for n in out.nodes if n.op.kind == "rope"]
    assert r.op.interleaved
    check_same(g, out)


def test_tables_that_do_not_repeat_their_half_are_a_reported_miss():
    g = bz.Graph("bad")
    x = g.input("x", bz.Shape(("b", 2, "s", D)))
    cos, sin = _tables(g, D, form="different")
    g.set_outputs([_rope(g, x, cos, sin, D)])
    out, misses = canonicalize(g)
    assert out.count("rope") == 0
    (miss,) = [m for m in misses if m.pattern == "CanonicalizeRope"]
    assert "cannot be shown to repeat" in miss.detail
    check_same(g, out, symbols={"b": 2, "s": 5})


def test_rotate_without_the_negation_is_not_rope():
    g = bz.Graph("noneg")
    x = g.input("x", bz.Shape(("b", 2, "s", D)))
    cos, sin = _tables(g, D)
    h = D // 2
    rot = g.concat([g.narrow(x, -1, h, h), g.narrow(x, -1, 0, h)], -1)
    g.set_outputs([g.add(g.mul(x, cos), g.mul(rot, sin))])
    out, _ = canonicalize(g)
    assert out.count("rope") == 0
    check_same(g, out, symbols={"b": 2, "s": 5})
