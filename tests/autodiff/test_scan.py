"""Scans: each RLX-named builder against a Python loop through the interpreter, gradients
(reverse and forward mode, order 2) against finite differences, checkpointed scans against plain
ones, the unrolled decomposition against the reference, and bad bodies rejected by name."""
from __future__ import annotations

import numpy as np
import pytest

import braze as bz
from braze.autodiff import grad_with_loss, prepare_graph_for_ad
from braze.autodiff.scan import convert_scans_for_ad
from braze.errors import GraphError, ShapeError
from braze.passes.expand import expand_nodes
from tests.autodiff.check_grads import check_grads

F64 = bz.f64


def body_graph(name, shapes, fn, dtype=F64):
    g = bz.Graph(name)
    ins = [g.input(f"in{i}", bz.Shape(s, dtype)) for i, s in enumerate(shapes)]
    out = fn(g, *ins)
    g.set_outputs(list(out) if isinstance(out, tuple) else [out])
    return g


STEP = body_graph("step", [(3,)], lambda b, c: b.add(b.tanh(c), b.mul(c, 0.5)))
STEP_X = body_graph("step_x", [(3,), (3,)], lambda b, c, x: b.tanh(b.add(b.mul(c, 0.9), x)))
STEP_BX = body_graph("step_bx", [(3,), (3, 3), (3,)],
                     lambda b, c, w, x: b.tanh(b.add(b.mm(w, c), x)))
STEP_BX_1D = body_graph("step_bx", [(3,), (3, 3), (3,)],
                        lambda b, c, w, x: b.tanh(b.add(b.mm(c, w), x)))


def np_step(c):
    return np.tanh(c) + 0.5 * c


def run(fn, **feeds):
    g = bz.Graph("s")
    ins = [g.input(k, bz.Shape(v.shape, F64)) for k, v in feeds.items()]
    out = fn(g, *ins)
    g.set_outputs(list(out) if isinstance(out, tuple) else [out])
    return g, bz.interpret(g, feeds)


def test_scan_and_trajectory_match_a_python_loop():
    c0 = np.random.default_rng(0).normal(size=3)
    want, traj = c0, []
    for _ in range(5):
        want = np_step(want)
        traj.append(want)
    g, (final, stacked) = run(lambda g, c: (g.scan(c, STEP, 5), g.scan_trajectory(c, STEP, 5)),
                              c=c0)
    np.testing.assert_allclose(final, want, rtol=1e-12)
    np.testing.assert_allclose(stacked, np.stack(traj), rtol=1e-12)
    assert g.shape_of(g.outputs[1]).dims == (5, 3)


def test_scan_with_xs_and_bcasts_match_a_python_loop():
    rng = np.random.default_rng(1)
    c0, xs, w = rng.normal(size=3), rng.normal(size=(4, 3)), rng.normal(size=(3, 3))
    c1 = c2 = c0
    for t in range(4):
        c1 = np.tanh(0.9 * c1 + xs[t])
        c2 = np.tanh(c2 @ w + xs[t])
    _, (a, b) = run(lambda g, c, xs, w: (g.scan_with_xs(c, [xs], STEP_X, 4),
                                         g.scan_with_bcasts_and_xs(c, [w], [xs], STEP_BX_1D, 4)),
                    c=c0, xs=xs, w=w)
    np.testing.assert_allclose(a, c1, rtol=1e-12)
    np.testing.assert_allclose(b, c2, rtol=1e-12)


def test_scan_general_several_carries_ys_and_reverse():
    body = body_graph("two", [(2,), (2,), (2,)],
                      lambda b, h, s, x: (b.mul(h, x), b.add(s, h), b.sum(b.mul(h, s))))
    rng = np.random.default_rng(2)
    h0, s0, xs = rng.normal(size=2), rng.normal(size=2), rng.normal(size=(3, 2))
    for reverse in (False, True):
        h, s, ys = h0, s0, [None] * 3
        for t in (reversed(range(3)) if reverse else range(3)):
            ys[t] = np.sum(h * s)
            h, s = h * xs[t], s + h
        _, got = run(lambda g, h, s, xs, r=reverse: g.scan_general(body, [h, s], 3, xs=[xs],
                                                                    reverse=r),
                     h=h0, s=s0, xs=xs)
        for a, w in zip(got, [h, s, np.stack(ys)]):
            np.testing.assert_allclose(a, w, rtol=1e-12)


def test_decomposition_unrolls_to_the_same_values():
    rng = np.random.default_rng(3)
    feeds = dict(c=rng.normal(size=3), xs=rng.normal(size=(4, 3)), w=rng.normal(size=(3, 3)))
    g, want = run(lambda g, c, xs, w: g.scan_with_bcasts_and_xs(c, [w], [xs], STEP_BX, 4),
                  **feeds)
    plain = prepare_graph_for_ad(g)
    assert plain.count("scan") == 1
    unrolled, _ = expand_nodes(g, lambda op: op.kind == "scan")
    assert unrolled.count("scan") == 0 and unrolled.count("tanh") == 4
    np.testing.assert_allclose(bz.interpret(unrolled, feeds)[0], want[0], rtol=1e-12)


SCANS = [
    ("scan", lambda g, c: g.scan(c, STEP, 4), [(3,)]),
    ("scan_with_xs", lambda g, c, xs: g.scan_with_xs(c, [xs], STEP_X, 4), [(3,), (4, 3)]),
    ("scan_with_bcasts_and_xs",
     lambda g, c, w, xs: g.scan_with_bcasts_and_xs(c, [w], [xs], STEP_BX, 4),
     [(3,), (3, 3), (4, 3)]),
    ("scan_trajectory", lambda g, c: g.scan_trajectory(c, STEP, 4), [(3,)]),
    ("scan_checkpointed", lambda g, c: g.scan_checkpointed(c, STEP, 6, 2), [(3,)]),
    ("reverse_with_ys", lambda g, c, xs: g.scan_general(STEP_X_YS, c, 3, xs=[xs],
                                                         reverse=True), [(3,), (3, 3)]),
]
STEP_X_YS = body_graph("ys", [(3,), (3,)],
                       lambda b, c, x: (b.tanh(b.mul(c, x)), b.sum(b.mul(c, c))))


@pytest.mark.parametrize("name,fn,shapes", SCANS, ids=[s[0] for s in SCANS])
def test_scan_gradients_match_finite_differences(name, fn, shapes):
    check_grads(fn, shapes, order=2 if name in ("scan", "scan_with_xs") else 1, name=name)


def _loss_graph(build):
    g = bz.Graph("loss")
    c = g.input("c", bz.Shape((3,), F64))
    xs = g.input("xs", bz.Shape((8, 3), F64))
    w = g.param("w", bz.Shape((3, 3), F64))
    g.set_outputs([g.sum(g.square(build(g, c, w, xs)))])
    return g


def test_checkpointed_scan_gradients_equal_plain_scan_gradients():
    plain = _loss_graph(lambda g, c, w, xs: g.scan_with_bcasts_and_xs(c, [w], [xs], STEP_BX, 8))
    ckpt = _loss_graph(lambda g, c, w, xs: g.scan_general(STEP_BX, c, 8, bcasts=[w], xs=[xs],
                                                          num_checkpoints=2)[0])
    rng = np.random.default_rng(4)
    feeds = {"c": rng.normal(size=3), "xs": rng.normal(size=(8, 3))}
    params = {"w": rng.normal(size=(3, 3)) * 0.5}
    a = bz.interpret(grad_with_loss(plain, ["c", "xs", "w"]), feeds, params)
    b = bz.interpret(grad_with_loss(ckpt, ["c", "xs", "w"]), feeds, params)
    for x, y in zip(a, b):
        np.testing.assert_allclose(y, x, rtol=1e-12, atol=1e-14)


def test_checkpointing_keeps_k_carries_and_recomputes_segments():
    g = _loss_graph(lambda g, c, w, xs: g.scan_general(STEP_BX, c, 8, bcasts=[w], xs=[xs],
                                                       num_checkpoints=4)[0])
    conv = convert_scans_for_ad(g)
    (outer,) = [n for n in conv.nodes if n.op.kind == "scan"]
    assert outer.op.length == 4 and outer.op.num_checkpoints == 0
    (inner,) = [n for n in outer.op.body.nodes if n.op.kind == "scan"]
    assert inner.op.length == 2
    grads = grad_with_loss(g, ["c"])
    # the forward pass of the backward graph stacks 4 checkpoints, never all 8 carries
    stacked = [n for n in grads.nodes if n.op.kind == "scan"
               for s in n.outputs if s.dims and s.dims[0] == 8 and s.dims[1:] == (3,)]
    assert not stacked
    assert convert_scans_for_ad(_loss_graph(
        lambda g, c, w, xs: g.scan_with_bcasts_and_xs(c, [w], [xs], STEP_BX, 8))).count(
        "scan") == 1


def test_bad_scans_are_rejected_by_name():
    g = bz.Graph("bad")
    c = g.input("c", bz.Shape((3,), F64))
    with pytest.raises(ShapeError, match="carry 0 is f64\\[3\\]"):
        g.scan(c, body_graph("wide", [(3,)], lambda b, x: b.concat([x, x], 0)), 2)
    with pytest.raises(ShapeError, match="leading dim length=5"):
        g.scan_with_xs(c, [g.input("xs", bz.Shape((4, 3), F64))], STEP_X, 5)
    with pytest.raises(GraphError, match="must divide length=5"):
        g.scan_checkpointed(c, STEP, 5, 2)
    with_param = bz.Graph("p")
    with_param.set_outputs([with_param.add(with_param.input("in0", bz.Shape((3,), F64)),
                                           with_param.param("w", bz.Shape((3,), F64)))])
    with pytest.raises(GraphError, match="pass weights in as inputs"):
        g.scan(c, with_param, 2)


def test_scan_graph_prints_parses_and_saves(tmp_path):
    g = _loss_graph(lambda g, c, w, xs: g.scan_general(STEP_BX, c, 8, bcasts=[w], xs=[xs],
                                                       num_checkpoints=2)[0])
    assert bz.Graph.parse(str(g)) == g
    bz.save(g, tmp_path / "s.json")
    assert bz.load(tmp_path / "s.json") == g
    gg = grad_with_loss(g, ["w"])
    assert bz.Graph.parse(str(gg)) == gg
