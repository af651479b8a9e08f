"""The executor's run loop: steps bound once per program over fixed arena arrays, feeds copied
into planned buffers, a call checking only feed names, dtypes and shapes. Re-binding symbolic
dims, repeated calls with new values, copy=False aliasing, feeds that are themselves arena
views, non-contiguous feeds, the profile and weight updates all stay correct."""
import numpy as np
import pytest

import braze as bz
import braze.models as models


def _close(got, want, tol=1e-4):
    assert len(got) == len(want)
    for a, w in zip(got, want, strict=True):
        assert a.shape == w.shape and a.dtype == w.dtype
        np.testing.assert_allclose(a, w, rtol=tol, atol=tol)


def _two_input_graph():
    g = bz.Graph("pair")
    a = g.input("a", bz.Shape(("n", 6)))
    b = g.input("b", bz.Shape(("n", 6)))
    g.set_outputs([g.add(a, g.tanh(b)), g.mul(a, b)])
    return g


def _conv_graph():
    g = bz.Graph("convs")
    x = g.input("x", bz.Shape((1, 4, 9, 11)))
    w1 = g.param("w1", bz.Shape((8, 4, 3, 3)))
    b1 = g.param("b1", bz.Shape((8,)))
    wd = g.param("wd", bz.Shape((8, 1, 3, 3)))
    w2 = g.param("w2", bz.Shape((6, 8, 1, 1)))
    h = g.relu(g.conv2d(x, w1, b1, stride=2, padding=1))
    h = g.conv2d(h, wd, groups=8, padding=1)
    g.set_outputs([g.conv2d(h, w2)])
    return g


def test_rebinding_symbolic_dims_back_and_forth_reuses_programs():
    g = models.bert_encoder(1, 32, 2, batch="batch", seq="seq", with_mask=True)
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params)
    bindings = [{"batch": 2, "seq": 5}, {"batch": 1, "seq": 7}, {"batch": 2, "seq": 5}]
    progs = []
    for i, sym in enumerate(bindings):
        feeds = bz.random_feeds(g, i, sym)
        _close(exe(feeds), bz.interpret(g, feeds, params))
        progs.append(exe.program(feeds))
    assert progs[0] is progs[2] and progs[0] is not progs[1]
    assert len(exe._programs) == 2


@pytest.mark.parametrize("build", [_conv_graph, lambda: models.resnet_basic_block()],
                         ids=["convs", "resnet"])
def test_repeated_calls_with_new_values_match_the_interpreter(build):
    """Bound steps keep their arrays, not their values: every call reads the new feeds."""
    g = build()
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params)
    last = None
    for seed in range(3):
        feeds = bz.random_feeds(g, seed)
        got = exe(feeds)
        _close(got, bz.interpret(g, feeds, params))
        if last is not None:
            assert not np.array_equal(got[0], last)
        last = got[0]


def test_copy_false_returns_arena_views_that_the_next_call_overwrites():
    g = _two_input_graph()
    exe = bz.compile(g, fuse=False)
    f1, f2 = bz.random_feeds(g, 1, {"n": 3}), bz.random_feeds(g, 2, {"n": 3})
    owned = exe(f1)
    views = exe(f1, copy=False)
    arena = exe.program(f1).arena
    assert all(np.shares_memory(v, arena) for v in views)
    assert not any(np.shares_memory(o, arena) for o in owned)
    kept = [v.copy() for v in views]
    exe(f2, copy=False)
    _close(views, bz.interpret(g, f2))          # the views now hold the second call's outputs
    _close(owned, kept)                         # the owned outputs did not change
    owned[0][...] = 0                           # and writing them does not touch the arena
    _close(exe(f1), bz.interpret(g, f1))


def test_feeds_that_are_arena_views_are_read_before_they_are_overwritten():
    """Outputs of a copy=False call fed straight back, where the feed for b lives in a's (dead)
    buffer: loading a (first) must not overwrite b's feed before it is read."""
    g = bz.Graph("swap")
    a = g.input("a", bz.Shape(("n", 6)))
    b = g.input("b", bz.Shape(("n", 6)))
    t = g.mul(a, b)
    g.set_outputs([g.tanh(t), g.exp(t)])
    exe = bz.compile(g, fuse=False)
    first = bz.random_feeds(g, 0, {"n": 4})
    out_tanh, out_exp = exe(first, copy=False)
    prog = exe.program(first)
    assert np.shares_memory(out_tanh, prog.env[prog.input_slots["a"]])
    feeds = {"a": out_exp, "b": out_tanh}
    want = bz.interpret(g, {k: v.copy() for k, v in feeds.items()})
    _close(exe(feeds), want, 1e-6)


def test_non_contiguous_list_and_new_shape_feeds():
    g = _two_input_graph()
    exe = bz.compile(g, fuse=False)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 5)).astype(np.float32).T   # a transposed (strided) feed
    b = rng.standard_normal((5, 6)).astype(np.float32)
    _close(exe({"a": a, "b": b}), bz.interpret(g, {"a": np.ascontiguousarray(a), "b": b}))
    listed = {"a": a.tolist(), "b": b}                       # not an array: checked in full
    with pytest.raises(bz.InterpretError, match="cast the feed"):
        exe(listed)  # a list of Python floats becomes float64
    c = rng.standard_normal((2, 6)).astype(np.float32)
    _close(exe({"a": c, "b": c}), bz.interpret(g, {"a": c, "b": c}))


def test_a_seen_binding_still_rejects_bad_dtypes_and_missing_inputs():
    g = _two_input_graph()
    exe = bz.compile(g, fuse=False)
    feeds = bz.random_feeds(g, 0, {"n": 2})
    exe(feeds)
    with pytest.raises(bz.InterpretError, match="cast the feed"):
        exe({**feeds, "b": feeds["b"].astype(np.float64)})
    with pytest.raises(bz.InterpretError, match="needs input 'b'"):
        exe({"a": feeds["a"]})


def test_profile_times_bound_steps_and_leaves_the_program_usable():
    g = _conv_graph()
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params)
    feeds = bz.random_feeds(g, 0)
    prof = exe.profile(feeds, repeat=2)
    prog = exe.program(feeds)
    assert len(prof.rows) == len(prog.steps) and all(r.seconds >= 0 for r in prof.rows)
    assert all(step.call is not None for step in prog.steps)
    assert any("sgemm" in r.implementation or "BLAS" in r.implementation for r in prof.rows)
    _close(exe(feeds), bz.interpret(g, feeds, params))


def test_update_weights_reaches_bound_steps():
    g = _conv_graph()
    exe = bz.compile(g, params=bz.init_params(g, 0))
    feeds = bz.random_feeds(g, 0)
    exe(feeds)
    params2 = bz.init_params(g, 7)
    exe.update_weights(params2)
    _close(exe(feeds), bz.interpret(g, feeds, params2))
