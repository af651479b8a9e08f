"""The norm and activation matchers skip work by necessary conditions: a node the norm matcher
skips (`_roots_near_a_core`) parses to nothing, a root (`_below_a_transcendental`) or a cone
stop (`_stops`) the activation matcher skips has no cone worth probing, and a graph without a
mean / a transcendental op has no norm / activation match at all. Checked on seeded random
elementwise graphs against the full search."""
import random

import numpy as np
import pytest
from helpers import run_rules

import braze as bz
from braze.ir.dtypes import f16
from braze.passes.canonicalize import activations as act
from braze.passes.canonicalize import norms

UNARY = ["tanh", "erf", "sigmoid", "exp", "neg", "sqrt", "reciprocal", "relu", "abs"]
BINARY = ["add", "sub", "mul", "div", "maximum"]
CONSTS = [0.5, 1.0, 2.0, 0.044715, 3.0, 1.702, 0.0]


def _random_elementwise(rng: random.Random) -> bz.Graph:
    """A random DAG of elementwise ops over one or two [b, 8] inputs, a [8] vector and
    scalar constants (long enough to fill the activation matcher's regions)."""
    g = bz.Graph("random")
    vals = [g.input("x", bz.Shape(("b", 8)))]
    if rng.random() < 0.5:
        vals.append(g.input("y", bz.Shape(("b", 8))))
    if rng.random() < 0.3:
        vals.append(g.input("z", bz.Shape((8,))))
    for _ in range(rng.randint(1, 50)):
        a, r = rng.choice(vals), rng.random()
        if r < 0.35:
            vals.append(getattr(g, rng.choice(UNARY))(a))
        elif r < 0.6:
            vals.append(g.pow(a, rng.choice(CONSTS)) if rng.random() < 0.15 else
                        getattr(g, rng.choice(BINARY))(a, rng.choice(CONSTS)))
        else:
            vals.append(getattr(g, rng.choice(BINARY))(a, rng.choice(vals)))
    g.set_outputs([vals[-1]])
    return g


def _all_cones(g, root):
    """Every (members, x) cone under root, trying every stop (no shortcut)."""
    region, transcendental, _, _ = act._region(g, root)
    if len(region) < act.MAX_CONE and not act._is_max(root) and not transcendental:
        return []
    leaves = []
    for nid in sorted(region):
        for v in g.nodes[nid].inputs:
            if v.node not in region and not act._scalar_const(g, v) and v not in leaves:
                leaves.append(v)
    out = []
    for x in leaves + [g.nodes[i].value for i in sorted(region) if i != root.id]:
        if g.shape_of(x) == root.outputs[0]:
            members = act._cone_to(g, root, x)
            if members is not None and act._worth_probing(g, members, root):
                out.append((members, x))
    return out


def _graphs(make, seed: int, count: int):
    """`count` graphs from `make(rng)` with a seeded rng (those it could build)."""
    rng = random.Random(seed)
    return [g for g in (make(rng) for _ in range(count)) if g is not None]


@pytest.mark.parametrize("seed", range(4))
def test_activation_stops_skip_only_stops_without_a_cone(seed):
    found = 0
    for g in _graphs(_random_elementwise, seed, 150):
        near = act._below_a_transcendental(g)
        for node in g.nodes:
            if act._root_test(node.op):
                want = _all_cones(g, node)
                assert list(act._cones(g, node)) == want, node.label
                if node.id not in near and not act._is_max(node):  # the matcher skips it
                    assert not want, node.label
                found += bool(want)
    assert found > 100  # the graphs do hold cones


def _random_norm(rng: random.Random) -> bz.Graph | None:
    """A LayerNorm / RMSNorm in one of its written forms, with random casts, statistic axes,
    eps, gamma and beta; None when the random casts mix dtypes an op refuses."""
    g = bz.Graph("norm")
    dt = rng.choice([bz.f32, f16])

    def cast(v):
        return g.cast(v, rng.choice([bz.f32, f16])) if rng.random() < 0.25 else v

    try:
        x = cast(g.input("x", bz.Shape(("b", 4, 8), dt)))
        axes = rng.choice([[2], [1, 2], [1]])
        keep = rng.random() < 0.9
        d = x if rng.random() < 0.5 else g.sub(x, g.mean(x, axes=axes, keepdims=keep))
        sq = g.mul(d, d) if rng.random() < 0.5 else g.pow(d, rng.choice([2.0, 3.0]))
        var = cast(g.mean(cast(sq), axes=axes, keepdims=keep))
        if rng.random() < 0.85:
            var = g.add(var, 1e-5) if rng.random() < 0.5 else g.add(1e-6, var)
        form = rng.randrange(5)
        if form == 4:
            y = g.div(d, g.sqrt(var))
        else:
            inv = [lambda: g.rsqrt(var), lambda: g.pow(var, -0.5),
                   lambda: g.reciprocal(g.sqrt(var)), lambda: g.div(1.0, g.sqrt(var))][form]()
            y = g.mul(d, inv) if rng.random() < 0.5 else g.mul(inv, d)
        y = cast(y)
        if rng.random() < 0.7:
            y = g.mul(y, g.param("w", bz.Shape((8,), dt)))
        if rng.random() < 0.5:
            y = g.add(g.param("b", bz.Shape((8,), dt)), y)
        g.set_outputs([y])
    except bz.BrazeError:
        return None
    return g


@pytest.mark.parametrize("seed", range(4))
def test_norm_matcher_skips_only_nodes_that_parse_to_nothing(seed):
    parsed = 0
    for g in _graphs(_random_norm, seed, 300):
        near = norms._roots_near_a_core(g)
        for node in g.nodes:
            if not norms._root_test(node.op):
                continue
            norms._NEAR.clear()
            found = norms._parse(g, node)
            if node.id not in near:
                assert found is None and not norms._NEAR, node.label
                assert not list(norms._matcher(g, node, None))
            parsed += found is not None
    assert parsed > 50  # the graphs do hold norms


def test_rules_without_their_ops_are_skipped_and_fire_with_them():
    g = bz.Graph("no_mean_no_transcendental")
    x = g.input("x", bz.Shape((2, 8)))
    g.set_outputs([g.maximum(g.mul(x, g.rsqrt(g.add(g.mul(x, x), 1e-5))), 0.0)])
    out, _ = run_rules(g, norms.CANONICALIZE_NORM, act.CANONICALIZE_ACTIVATION)
    assert out.count("rms_norm") == 0 and out.count("relu") == 1  # a max is enough
    g = bz.Graph("rms_and_silu")
    x = g.input("x", bz.Shape((2, 8)))
    h = g.mul(x, g.rsqrt(g.add(g.mean(g.mul(x, x), axes=[1], keepdims=True), 1e-5)))
    g.set_outputs([g.mul(h, g.sigmoid(h))])
    out, _ = run_rules(g, norms.CANONICALIZE_NORM, act.CANONICALIZE_ACTIVATION)
    assert out.count("rms_norm") == 1 and out.count("silu") == 1, out.op_counts()
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
    (want,), (got,) = bz.interpret(g, feeds), bz.interpret(out, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
