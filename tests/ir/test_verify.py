"""`bz.verify`: graphs built through the builder pass; each broken invariant (made by poking
internals, as a buggy pass would) raises VerifyError naming the node and quoting its
neighbourhood as text IR."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings

import braze as bz
from braze.ir.ops.elementwise import Unary, UnaryFn
from braze.testing import random_graphs


def small() -> bz.Graph:
    g = bz.Graph("small")
    x = g.input("x", bz.Shape((2, 3)))
    w = g.param("w", bz.Shape((3, 4)), np.ones((3, 4), np.float32))
    h = g.add_node(bz.ir.ops.MatMul(), (x, w), name="proj", provenance="model.py:7")[0]
    y = g.relu(h)
    z = g.tanh(h)
    g.set_outputs([g.add(y, z)])
    return g


def poke(g: bz.Graph, nid: int, **changes) -> bz.Graph:
    g.nodes[nid] = dataclasses.replace(g.nodes[nid], **changes)
    return g


def test_valid_graphs_pass():
    assert bz.verify(small()) is None


def test_error_names_node_and_quotes_producers_and_consumers():
    g = poke(small(), 2, outputs=(bz.Shape((2, 5)),))
    with pytest.raises(bz.VerifyError) as e:
        bz.verify(g)
    text = str(e.value)
    assert "node proj (matmul) from model.py:7" in text
    assert "stores output type(s) f32[2, 5] but matmul infers f32[2, 4]" in text
    lines = text.splitlines()
    marked = [ln for ln in lines if ln.startswith(">")]
    assert len(marked) == 1 and "%proj = matmul(%x, %w) -> f32[2, 5]" in marked[0]
    assert any("%x = input" in ln for ln in lines)  # producer
    assert any("relu(%proj)" in ln for ln in lines) and any("tanh(%proj)" in ln for ln in lines)


BROKEN = {
    "input from a later node": (lambda g: poke(g, 3, inputs=(bz.Value(4),)),
                                "topological order"),
    "input from itself": (lambda g: poke(g, 3, inputs=(bz.Value(3),)), "itself"),
    "nonexistent value": (lambda g: poke(g, 3, inputs=(bz.Value(42),)), "does not exist"),
    "output index out of range": (lambda g: poke(g, 3, inputs=(bz.Value(2, 1),)),
                                  "has 1 output(s)"),
    "id not position": (lambda g: poke(g, 3, id=7), "sits at position 3"),
    "wrong arity": (lambda g: poke(g, 5, inputs=(bz.Value(3),)), "no longer type-checks"),
    "stale output type": (lambda g: poke(g, 3, outputs=(bz.Shape((2, 4), bz.f16),)),
                          "stores output type(s) f16[2, 4]"),
    "op no longer accepts inputs": (lambda g: poke(g, 3, op=Unary(UnaryFn.NOT)),
                                    "not needs bool input"),
    "duplicate node name": (lambda g: poke(g, 4, name="proj"), "reuses the name 'proj'"),
    "dangling graph output": (lambda g: setattr(g, "outputs", [bz.Value(9)]) or g,
                              "output 0 is %9"),
    "inputs list a param": (lambda g: setattr(g, "input_ids", [0, 1]) or g,
                            "listed among the graph's inputs but is a param"),
    "input listed twice": (lambda g: setattr(g, "input_ids", [0, 0]) or g, "listed twice"),
    "unlisted input node": (lambda g: setattr(g, "input_ids", []) or g,
                            "does not list in its inputs"),
    "sources list a non-node": (lambda g: setattr(g, "param_ids", [1, 17]) or g,
                                "its params list 17"),
    "weight of the wrong shape": (lambda g: g.weights.update(w=np.ones((4, 3), np.float32))
                                  or g, "declares f32[3, 4] but its weight is float32[4, 3]"),
    "weight of the wrong dtype": (lambda g: g.weights.update(w=np.ones((3, 4))) or g,
                                  "float64"),
    "weight for no param": (lambda g: g.weights.update(v=np.ones(2)) or g,
                            "weight 'v' belongs to no param"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_broken_invariant_is_caught(case):
    breaker, message = BROKEN[case]
    g = breaker(small())
    with pytest.raises(bz.VerifyError, match="graph 'small'") as e:
        bz.verify(g)
    assert message in str(e.value)


def test_broken_region_body_is_caught():
    body = bz.Graph("body")
    body.set_outputs([body.gelu(body.input("in0", bz.Shape((3,))))])
    g = bz.Graph("outer")
    g.set_outputs([g.elementwise_region(body, [g.input("x", bz.Shape((3,)))])])
    bz.verify(g)
    poke(body, 1, outputs=(bz.Shape((4,)),))
    with pytest.raises(bz.VerifyError, match="broken body graph"):
        bz.verify(g)


def test_long_chain_verifies():
    g = bz.Graph("chain", record_provenance=False)
    v = g.input("x", bz.Shape(("n", 8)))
    for _ in range(20_000):
        v = g.neg(v)
    g.set_outputs([v])
    assert bz.verify(g) is None


@settings(max_examples=30, deadline=None)
@given(random_graphs(max_nodes=15))
def test_random_graphs_verify(g):
    bz.verify(g)
