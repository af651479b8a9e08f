"""Deferred stored weights (braze.ir.weights): every reader sees the computed array; carrying
weights between graphs computes nothing."""
from __future__ import annotations

import numpy as np
import pytest

import braze as bz
from braze.errors import GraphError
from braze.ir.weights import DeferredWeight, WeightStore, joined_weight


def _parts(seed: int = 0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((4, n)).astype(np.float32) for n in (3, 5)]


def _graph_with_joined(deferred: bool = True):
    a, b = _parts()
    want = np.concatenate([a, b], -1)
    g = bz.Graph("w")
    x = g.input("x", bz.Shape((2, 4)))
    w = g.param("ab", bz.Shape((4, 8)), joined_weight([a, b], -1, np.float32) if deferred
                else want)
    g.set_outputs([g.mm(x, w)])
    return g, want


def test_every_read_gives_the_joined_array():
    want = np.concatenate(_parts(), -1)
    for read in (lambda s: s["ab"], lambda s: s.get("ab"), lambda s: dict(s.items())["ab"],
                 lambda s: s.values()[0], lambda s: dict(s)["ab"], lambda s: {**s}["ab"],
                 lambda s: s.copy()["ab"], lambda s: s.pop("ab")):
        store = WeightStore({"ab": joined_weight(_parts(), -1, np.float32)})
        assert store.is_deferred("ab")
        got = read(store)
        assert isinstance(got, np.ndarray) and got.dtype == np.float32
        np.testing.assert_array_equal(got, want)


def test_computed_once_and_kept():
    calls = []

    def compute():
        calls.append(1)
        return np.ones((2, 2))

    d = DeferredWeight((2, 2), np.float32, compute, "ones")
    store = WeightStore({"w": d})
    other = store.carry()
    first = store["w"]
    assert first.dtype == np.float32 and other["w"] is first and np.asarray(d) is first
    assert len(calls) == 1 and d.ready


def test_carry_keeps_entries_deferred():
    store = WeightStore({"ab": joined_weight(_parts(), -1, np.float32), "c": np.zeros(2)})
    kept = store.carry({"ab"})
    assert list(kept.raw_items())[0][1] is store.raw("ab")
    assert kept.is_deferred("ab") and "c" not in kept
    assert store.carry(lambda k: k == "c").raw("c") is store.raw("c")


def test_wrong_declared_shape_is_refused():
    d = DeferredWeight((3,), np.float32, lambda: np.zeros(4), "bad")
    with pytest.raises(ValueError, match="declared"):
        d.value()
    g = bz.Graph("w")
    g.param("p", bz.Shape((4,)))
    with pytest.raises(GraphError, match="does not match param"):
        g.set_weight("p", DeferredWeight((3,), np.float32, lambda: np.zeros(3)))


def test_graph_readers_see_values(tmp_path):
    g, want = _graph_with_joined()
    assert g.weights.is_deferred("ab")
    plain, _ = _graph_with_joined(deferred=False)
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)}
    np.testing.assert_array_equal(bz.interpret(g, feeds)[0], bz.interpret(plain, feeds)[0])
    assert g == plain
    bz.save(g, str(tmp_path / "m.json"))
    np.testing.assert_array_equal(bz.load(str(tmp_path / "m.json")).weights["ab"], want)


def test_assigning_a_plain_dict_wraps_it():
    g, want = _graph_with_joined()
    h = bz.Graph("h")
    h.weights = {"ab": g.weights.raw("ab")}
    assert isinstance(h.weights, WeightStore) and h.weights.is_deferred("ab")
    np.testing.assert_array_equal(h.weights["ab"], want)


def test_copies_and_pickles_carry_values():
    import copy
    import pickle

    for clone in (copy.deepcopy, lambda g: pickle.loads(pickle.dumps(g))):
        g, want = _graph_with_joined()
        h = clone(g)
        assert isinstance(h.weights, WeightStore)
        np.testing.assert_array_equal(h.weights["ab"], want)
