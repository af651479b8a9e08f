"""A program's generated kernels are built before it picks its kernels (codegen.builds): in
parallel, each distinct source once, with a progress line when it takes long, and within
bz.compile's `build_timeout` / `max_kernels`: past a limit the remaining regions run their
references, with the reason in the dispatch report, and still give the interpreter's
outputs; kernels already cached are free."""
import pickle
import threading

import numpy as np
import pytest

import braze as bz
from braze.runtime.codegen import builds, cc
from braze.runtime.kernels import Dispatch

pytestmark = pytest.mark.skipif(not cc.available(), reason="no C compiler on this machine")

_UNARY = ("exp", "tanh", "sigmoid", "silu", "gelu")


def _five_structures(shape):
    """Five regions of different bodies (a softmax between them keeps them apart)."""
    g = bz.Graph("five")
    h = g.input("x", bz.Shape(shape))
    for fn in _UNARY:
        h = g.sm(g.add(getattr(g, fn)(h), 0.75))
    g.set_outputs([h])
    return g


def _rows(exe):
    return [r for r in exe.dispatch_report().rows if r[1] == "elementwise_region"]


def test_a_kernel_budget_leaves_the_rest_to_the_reference(monkeypatch, tmp_path):
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path))
    g = _five_structures((7, 131))
    feeds = bz.random_feeds(g, 0)
    want = bz.interpret(g, feeds)[0]
    exe = bz.compile(g, max_kernels=2)
    np.testing.assert_allclose(exe(feeds)[0], want, rtol=1e-5, atol=1e-6)
    rows = _rows(exe)
    assert [r[2] for r in rows].count(Dispatch.GENERATED) == 2
    skipped = [r for r in rows if r[2] == Dispatch.REFERENCE]
    assert len(skipped) == 3
    assert all("not built: max_kernels=2 new kernels were built; raise "
               "bz.compile(max_kernels=...)" in r[3] for r in skipped)
    assert "(elementwise_region): not built: max_kernels=2" in str(exe.dispatch_report())
    assert len(list(tmp_path.glob("region_*.so"))) == 2
    again = bz.compile(g, max_kernels=3)  # two cached (free), three new
    again(feeds)
    assert all(r[2] == Dispatch.GENERATED for r in _rows(again))


def test_a_build_timeout_leaves_the_rest_to_the_reference(monkeypatch, tmp_path):
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path))
    g = _five_structures((7, 137))
    feeds = bz.random_feeds(g, 0)
    exe = bz.compile(g, build_timeout=1e-9)
    np.testing.assert_allclose(exe(feeds)[0], bz.interpret(g, feeds)[0], rtol=1e-5, atol=1e-6)
    rows = _rows(exe)
    assert rows and all(r[2] == Dispatch.REFERENCE for r in rows)
    assert all("the build timeout of 1e-09 s ran out; raise bz.compile(build_timeout=...)"
               in r[3] for r in rows)
    assert not list(tmp_path.glob("region_*.so"))


def test_independent_builds_run_in_parallel(monkeypatch):
    """Three builds meet at a barrier: they can only pass it if they run at once."""
    meet = threading.Barrier(3, timeout=60)
    built = []

    def fake_build(source, name, flags):
        meet.wait()
        built.append(name)

    monkeypatch.setattr(cc, "build_library", fake_build)
    monkeypatch.setattr(cc, "is_built", lambda *a: False)
    libs = [builds.Library(f"/* {i} */", f"k{i}") for i in range(3)]
    assert builds.build_all(libs + libs[:1], workers=3) == {}
    assert sorted(built) == ["k0", "k1", "k2"]  # the repeated source once


def test_long_builds_print_progress(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(builds, "PROGRESS_AFTER_S", 0.0)
    g = _five_structures((7, 139))
    bz.compile(g)(bz.random_feeds(g, 0))
    err = capsys.readouterr().err
    assert "braze: building C kernels: 1 of 5 done" in err
    assert "braze: built 5 C kernels in" in err
    g = _five_structures((7, 149))
    bz.compile(g, progress=False)(bz.random_feeds(g, 0))
    assert "braze:" not in capsys.readouterr().err


def test_a_failed_build_is_reported_and_the_node_still_runs(monkeypatch, tmp_path):
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cc, "_FAILURES", [])
    tried = []

    def broken(source, name, flags):
        tried.append(name)
        raise cc.CompileError("the C compiler cc failed (exit 1) on generated code:\nboom")

    monkeypatch.setattr(cc, "build_library", broken)
    g = _five_structures((7, 151))
    feeds = bz.random_feeds(g, 0)
    exe = bz.compile(g)
    np.testing.assert_allclose(exe(feeds)[0], bz.interpret(g, feeds)[0], rtol=1e-5, atol=1e-6)
    assert all(r[2] == Dispatch.REFERENCE for r in _rows(exe))
    assert "some C kernels did not build" in str(exe.dispatch_report())
    regions = [name for name in tried if name.startswith("region_")]
    assert len(regions) == len(set(regions)) == 5  # each tried once, not again per node


@pytest.mark.parametrize("kwargs", [{"build_timeout": 0}, {"build_timeout": -1.0},
                                    {"build_timeout": "10"}, {"build_timeout": float("nan")},
                                    {"max_kernels": -1}, {"max_kernels": 2.5},
                                    {"max_kernels": True}, {"progress": "yes"}])
def test_build_options_are_checked(kwargs):
    g = _five_structures((2, 3))
    with pytest.raises(bz.BrazeError, match=next(iter(kwargs))):
        bz.compile(g, **kwargs)


def test_the_limits_travel_with_a_pickled_executable():
    g = _five_structures((2, 3))
    exe = bz.compile(g, build_timeout=30, max_kernels=4, progress=False)
    copy = pickle.loads(pickle.dumps(exe))
    assert copy.build_limits == exe.build_limits == builds.BuildLimits(30.0, 4, False)
