"""The on-disk kernel cache (codegen/cc.py) against the environment it meets: a cache on
another file system than $TMPDIR, an unwritable $TMPDIR, damaged entries. Each test compiles
its own source (the process keeps every library it loaded by source)."""
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from braze.runtime.codegen import cc

pytestmark = pytest.mark.skipif(not cc.available(), reason="no C compiler here")


def _probe(value: int) -> tuple[str, str]:
    """A fresh source (never loaded in this process) returning `value`, and its function."""
    name = f"braze_probe_{uuid.uuid4().hex[:12]}"
    return f"int {name}(void) {{ return {value}; }}\n", name


def test_a_missing_tmpdir_does_not_stop_a_build(monkeypatch, tmp_path):
    """The build runs in the cache folder, and the compiler's own scratch goes there too."""
    missing = str(tmp_path / "no-such-tmp")
    monkeypatch.setenv("TMPDIR", missing)
    monkeypatch.setattr(tempfile, "tempdir", missing)
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path / "cache"))
    src, fn = _probe(11)
    assert getattr(cc.compile_c(src, "probe"), fn)() == 11
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith(".build")] == []


def test_a_cache_on_another_file_system_than_tmp(monkeypatch):
    """os.replace cannot cross file systems: a tmpfs /tmp under a cache on disk (or the
    reverse) raised EXDEV on every kernel."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tempfile.gettempdir()).st_dev:
        pytest.skip("no second file system here")
    with tempfile.TemporaryDirectory(dir=shm) as cache:
        monkeypatch.setenv("BRAZE_CACHE_DIR", cache)
        src, fn = _probe(12)
        assert getattr(cc.compile_c(src, "probe"), fn)() == 12


def _corrupt(path: Path, how: str) -> None:
    """Put damaged bytes under `path`'s name (a new file: this process maps the old one)."""
    data = path.read_bytes()
    other = Path("/bin/sh").read_bytes() if how == "executable" else b""
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes({"empty": b"", "truncated": data[:len(data) // 2], "executable": other,
                     "garbage": os.urandom(len(data))}[how])
    os.replace(tmp, path)


def _run_child(src: str, fn: str, cache: Path) -> subprocess.CompletedProcess:
    """`fn` of `src` compiled in a fresh process (this one would find the library it has
    loaded under the same path instead of opening the file again)."""
    code = ("from braze.runtime.codegen import cc\n"
            f"print(getattr(cc.compile_c({src!r}, 'probe'), {fn!r})())\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "BRAZE_CACHE_DIR": str(cache)})


@pytest.mark.parametrize("how", ["empty", "truncated", "garbage", "executable",
                                 "another source"])
def test_a_damaged_cache_entry_is_built_again(tmp_path, how):
    """Whatever sits under a library's name that is not the library built for its key (an
    empty, truncated or garbage file, a program, another source's build) is rebuilt, not
    loaded: a damaged entry must not break every later run (a truncated one killed the
    process with SIGBUS in dlopen)."""
    src, fn = _probe(21)
    first = _run_child(src, fn, tmp_path)
    assert first.stdout.strip() == "21", first.stderr[-2000:]
    (lib,) = tmp_path.glob("probe_*.so")
    if how == "another source":
        other, other_fn = _probe(22)
        _run_child(other, other_fn, tmp_path / "other")
        (built,) = (tmp_path / "other").glob("probe_*.so")
        os.replace(built, lib)
    else:
        _corrupt(lib, how)
    again = _run_child(src, fn, tmp_path)
    assert (again.returncode, again.stdout.strip()) == (0, "21"), again.stderr[-2000:]


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_an_unusable_cache_folder_builds_in_a_temporary_one(monkeypatch, tmp_path, where):
    """A cache folder that cannot be created or written gives way to a temporary one for the
    process, with a warning naming it (it was a FileExistsError deep in kernel selection)."""
    blocker = tmp_path / "kernels"
    blocker.write_text("not a folder")
    cache = blocker if where == "a file" else blocker / "sub"
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(cache))
    src, fn = _probe(41)
    with pytest.warns(RuntimeWarning, match="BRAZE_CACHE_DIR"):
        assert getattr(cc.compile_c(src, "probe"), fn)() == 41
    assert cc.cache_dir() != cache and cc.cache_dir().is_dir()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through read-only modes")
def test_a_read_only_cache_serves_what_it_holds(tmp_path):
    src, fn = _probe(42)
    assert _run_child(src, fn, tmp_path).stdout.strip() == "42"
    tmp_path.chmod(0o555)
    try:
        again = _run_child(src, fn, tmp_path)
        assert (again.stdout.strip(), again.stderr) == ("42", "")
    finally:
        tmp_path.chmod(0o755)


@pytest.mark.parametrize("body", [b"not a program\n", b"#!/bin/sh\nexit 0\n"])
def test_a_broken_cc_is_a_compile_error(monkeypatch, tmp_path, body):
    """CC naming a file that does not run (OSError from exec) or a compiler that succeeds
    without writing the library (FileNotFoundError from the move) is a CompileError, so the
    kernels fall back instead of the call crashing."""
    fake = tmp_path / "fake-cc"
    fake.write_bytes(body)
    fake.chmod(0o755)
    monkeypatch.setattr(cc, "compiler", lambda: str(fake))
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path / "cache"))
    src, fn = _probe(51)
    with pytest.raises(cc.CompileError, match="set CC"):
        cc.compile_c(src, "probe")
    assert cc.load_library(src, "probe", {fn: []}) is None


@pytest.mark.parametrize("value, want", [("inf", None), ("1e400", None), ("-inf", 0), ("-1", 0),
                                         ("nan", None), ("x", None), ("", None), ("2", 2 << 20)])
def test_stream_min_mb_takes_any_number_and_ignores_the_rest(monkeypatch, value, want):
    """BRAZE_STREAM_MIN_MB=inf (never stream) raised OverflowError when a region compiled."""
    from braze.runtime.kernels.region import stream_min_bytes

    monkeypatch.setenv("BRAZE_STREAM_MIN_MB", value)
    assert stream_min_bytes() == want


def test_the_dispatch_report_says_why_c_kernels_fell_back(monkeypatch, tmp_path):
    """Without a compiler (or with one that fails) the kernels run the reference, and the
    report names the cause instead of only listing the fallbacks."""
    import numpy as np

    import braze as bz
    from braze.runtime.kernels import native

    g = bz.Graph("nocc")
    x = g.input("x", bz.Shape((4, 16)))
    g.set_outputs([g.add(g.tanh(g.mul(x, 1.0 + uuid.uuid4().int % 997 / 1e4)), g.sigmoid(x))])
    feeds = {"x": np.linspace(-2, 2, 64, dtype=np.float32).reshape(4, 16)}
    monkeypatch.setattr(cc, "compiler", lambda: None)
    monkeypatch.setattr(native, "lib", lambda: None)
    exe = bz.compile(g)
    np.testing.assert_allclose(exe(feeds)[0], bz.interpret(g, feeds)[0], rtol=1e-6)
    report = exe.dispatch_report()
    assert "no C compiler" in report.note and "no C compiler" in str(report)
    fake = tmp_path / "fake-cc"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(cc, "compiler", lambda: str(fake))
    monkeypatch.setattr(cc, "_FAILURES", [])
    monkeypatch.setenv("BRAZE_CACHE_DIR", str(tmp_path / "cache"))
    exe = bz.compile(g)
    exe(feeds)
    assert "fake-cc failed (exit 3)" in exe.dispatch_report().note
