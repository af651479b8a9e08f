"""The on-disk kernel cache (codegen/cc.py) against the environment it meets: a cache on
another file system than $TMPDIR, an unwritable $TMPDIR. Each test compiles its own source
(the process keeps every library it loaded by source)."""
import os
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
