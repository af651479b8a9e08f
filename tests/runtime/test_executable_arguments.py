"""An executable's contract at its edges (runtime/arguments.py, runtime/executable.py): wrong
argument types, unknown or mistyped params and feeds are BrazeErrors naming what to fix; a
misspelled param is never silently ignored; copy=False outputs are read-only (one may be a
stored weight); calls from two Python threads take turns; at most MAX_PROGRAMS bindings stay
cached; a binding too large for memory is a BrazeError. Found by an API sweep."""
import threading

import numpy as np
import pytest

import braze as bz
import braze.runtime.executable as executable


def _mlp(batch=4):
    g = bz.Graph("mlp")
    x = g.input("x", bz.Shape((batch, 16)))
    w = g.param("w", bz.Shape((16, 32)))
    g.set_outputs([g.gelu(g.mm(x, w))])
    return g


@pytest.mark.parametrize("kwargs, match", [
    (dict(target="gpu"), "target 'cpu'"), (dict(target=None), "target 'cpu'"),
    (dict(threads=-1), "threads must be"), (dict(threads=1.5), "threads must be"),
    (dict(threads="2"), "threads must be"), (dict(precision=1), "precision must be"),
    (dict(params=[1, 2]), "params must map"), (dict(params={"W": 0}), "no param named 'W'"),
    (dict(params={"w": np.zeros((16, 32))}), "'w' is declared f32 but was given float64"),
    (dict(params={"w": np.zeros((32, 16), np.float32)}), r"'w' has shape \(32, 16\)")])
def test_bad_compile_arguments_name_the_fix(kwargs, match):
    with pytest.raises(bz.BrazeError, match=match):
        bz.compile(_mlp(), **kwargs)


def test_compile_needs_a_graph():
    with pytest.raises(bz.BrazeError, match="needs a braze Graph, got str"):
        bz.compile("bert-tiny")


def test_update_weights_checks_names_dtypes_and_shapes_and_takes_good_values():
    g = _mlp()
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params)
    feeds = bz.random_feeds(g, 0)
    before = exe(feeds)[0]
    for bad, match in [({"W": params["w"]}, "no param named 'W'"),
                       ({"w": params["w"].astype(np.float64)}, "declared f32"),
                       ({"w": params["w"][:8]}, "has shape")]:
        with pytest.raises(bz.BrazeError, match=match):
            exe.update_weights(bad)
    np.testing.assert_array_equal(exe(feeds)[0], before)  # nothing half-applied
    exe.update_weights({"w": params["w"] * 2})
    want = bz.interpret(g, feeds, {"w": params["w"] * 2})[0]
    np.testing.assert_allclose(exe(feeds)[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("feeds, match", [([np.zeros((4, 16), np.float32)], "must map input"),
                                          (None, "must map input"),
                                          ({"x": np.zeros((4, 16), np.float32),
                                            "xx": np.zeros(3)}, "feeds name 'xx'"),
                                          ({"x": [[0.0] * 16] * 4}, r"float64 \(a list\)"),
                                          ({0: 1, "zz": 2}, "feeds name 'zz', 0")])
def test_bad_feeds_name_the_fix(feeds, match):
    g = _mlp()
    exe = bz.compile(g, params=bz.init_params(g, 0))
    with pytest.raises(bz.BrazeError, match=match):
        exe(feeds)


def test_copy_false_outputs_are_read_only_even_a_stored_weight():
    g = bz.Graph("param_out")
    x = g.input("x", bz.Shape((2, 4)))
    w = g.param("w", bz.Shape((4, 4)))
    g.set_outputs([g.mm(x, w), w])
    g.weights = {"w": np.eye(4, dtype=np.float32)}
    exe = bz.compile(g)
    feeds = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}
    product, weight = exe(feeds, copy=False)
    for out in (product, weight):
        with pytest.raises(ValueError, match="read-only"):
            out[...] = 100.0
    np.testing.assert_array_equal(exe(feeds)[0], feeds["x"])
    np.testing.assert_array_equal(g.weights["w"], np.eye(4))


def test_two_python_threads_calling_one_executable_take_turns():
    g = _mlp(batch=64)
    exe = bz.compile(g, params=bz.init_params(g, 0), threads=1)
    feeds = [bz.random_feeds(g, s) for s in (0, 1)]
    want = [exe(f)[0] for f in feeds]
    wrong = [0, 0]

    def worker(i):
        for _ in range(100):
            wrong[i] += not np.array_equal(exe(feeds[i])[0], want[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == [0, 0]


def test_only_the_most_recently_used_bindings_stay_cached(monkeypatch):
    monkeypatch.setattr(executable, "MAX_PROGRAMS", 2)
    g = _mlp(batch="batch")
    params = bz.init_params(g, 0)
    exe = bz.compile(g, params=params)
    for batch in (1, 2, 3, 1, 4):
        feeds = bz.random_feeds(g, batch, {"batch": batch})
        np.testing.assert_allclose(exe(feeds)[0], bz.interpret(g, feeds, params)[0],
                                   rtol=1e-5, atol=1e-5)
        assert len(exe._programs) <= 2
    assert sorted(dict(k)["batch"] for k in exe._programs) == [1, 4]  # 1 was used again


def test_a_binding_too_large_for_memory_is_a_braze_error():
    g = _mlp(batch="batch")
    exe = bz.compile(g, params=bz.init_params(g, 0))
    with pytest.raises(bz.BrazeError, match="needs more memory than there is"):
        exe({"x": np.broadcast_to(np.float32(1), (10**12, 16))})


def test_a_symbol_no_input_binds_is_a_braze_error_naming_the_node():
    """A range of length "n" with no input of an n dim had raised KeyError('n') from planning;
    the bound graph compiles and runs."""
    g = bz.Graph("positions")
    x = g.input("x", bz.Shape((3,)))
    g.set_outputs([g.tanh(x), g.arange("n", dtype=bz.f32)])
    feeds = {"x": np.ones(3, np.float32)}
    with pytest.raises(bz.BrazeError, match=r"symbolic dim 'n' \(node %\d+ \(range\).*g.bind"):
        bz.compile(g)(feeds)
    np.testing.assert_array_equal(bz.compile(g.bind({"n": 4}))(feeds)[1], np.arange(4))


def test_profile_needs_a_positive_repeat():
    g = _mlp()
    exe = bz.compile(g, params=bz.init_params(g, 0))
    with pytest.raises(bz.BrazeError, match="repeat must be"):
        exe.profile(bz.random_feeds(g, 0), repeat=0)


def test_an_extra_feed_after_good_calls_is_still_refused():
    """The fast path for feeds seen before must not skip the name check."""
    g = _mlp()
    exe = bz.compile(g, params=bz.init_params(g, 0))
    feeds = bz.random_feeds(g, 0)
    exe(feeds)
    exe(feeds)
    with pytest.raises(bz.BrazeError, match="feeds name 'y'"):
        exe({**feeds, "y": feeds["x"]})


def test_plan_and_dispatch_report_of_a_static_graph_need_no_call_first():
    """Static shapes plan without feeds; symbolic ones say to call (or pass feeds) first."""
    g = _mlp()
    exe = bz.compile(g, params=bz.init_params(g, 0))
    assert "arena" in str(exe.plan) and "Dispatch report" in str(exe.dispatch_report())
    dynamic = bz.compile(_mlp(batch="batch"), params=bz.init_params(g, 0))
    with pytest.raises(bz.BrazeError, match="symbolic dims"):
        str(dynamic.plan)
    with pytest.raises(bz.BrazeError, match="symbolic dims"):
        dynamic.dispatch_report()
