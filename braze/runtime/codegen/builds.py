"""Building the generated kernels a program needs, all at once: before a program picks its
kernels, the libraries its generated steps will load (kernels.registry.register_library) are
built in parallel, one compiler process per usable CPU (up to MAX_WORKERS), each distinct
source once. A build that takes long prints a progress line; optional limits
(`bz.compile(build_timeout=..., max_kernels=...)`) stop starting builds once that much time
has passed or that many kernels were built, and the nodes whose kernels were not built run
their references (`exe.dispatch_report()` gives the reason). Builds already running when a
limit is reached finish; kernels already in the cache cost nothing and always load."""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ...progress import Progress
from . import cc

__all__ = ["Library", "BuildLimits", "build_all", "MAX_WORKERS", "PROGRESS_AFTER_S"]

MAX_WORKERS = 16
"""The most compiler processes run at once (each takes 50-150 MB): a many-core server must
not start one per core."""
PROGRESS_AFTER_S = 3.0
"""Seconds of building before the first progress line (shorter builds print nothing)."""
_PROGRESS_EVERY_S = 10.0


@dataclass(frozen=True)
class Library:
    """One C library a kernel will load: its source, file name stem and compiler flags."""

    source: str
    name: str
    flags: tuple[str, ...] = cc.FLAGS

    @property
    def key(self) -> str:
        return cc.library_key(self.source, self.flags)


@dataclass(frozen=True)
class BuildLimits:
    """How long one program may spend building new kernels: `timeout_s` seconds (None: no
    limit) and at most `max_kernels` new ones (None: no limit); `progress` prints a line to
    stderr every 10 s once building has taken PROGRESS_AFTER_S."""

    timeout_s: float | None = 600.0
    max_kernels: int | None = None
    progress: bool = True


def build_all(libraries: Sequence[Library], limits: BuildLimits = BuildLimits(),
              workers: int | None = None) -> dict[str, str | None]:
    """Build the `libraries` not yet in the kernel cache, `workers` at a time (default: the
    usable CPUs, at most MAX_WORKERS). Returns library key -> why it was not built for each
    one that was not: the limit reached, or None where the compiler failed
    (cc.why_not_compiled has that); the others are in the cache, ready for cc.compile_c."""
    if not cc.available():
        return {}
    todo = {lib.key: lib for lib in libraries}
    todo = {k: lib for k, lib in todo.items() if not cc.is_built(lib.source, lib.name,
                                                                  lib.flags)}
    if not todo:
        return {}
    workers = max(1, min(workers or min(cc.usable_cpus(), MAX_WORKERS), len(todo)))
    state = _Builds(len(todo), limits, workers)
    pool = ThreadPoolExecutor(workers, thread_name_prefix="braze-cc")
    try:
        for key, (built, why) in zip(todo, pool.map(state.build, todo.values())):
            if not built:
                state.unbuilt[key] = why
    finally:  # on Ctrl-C, the builds not started yet are dropped, not waited for
        pool.shutdown(wait=True, cancel_futures=True)
    state.finish()
    return state.unbuilt


class _Builds:
    """The shared state of one build_all: the limits, counts and progress lines."""

    def __init__(self, total: int, limits: BuildLimits, workers: int) -> None:
        self.total, self.limits, self.workers = total, limits, workers
        self.started_at = time.monotonic()
        self.started = self.done = self.failed = 0
        self.unbuilt: dict[str, str | None] = {}
        self.lock = threading.Lock()
        self.lines = Progress(limits.progress)
        self.printed_at: float | None = None

    def build(self, lib: Library) -> tuple[bool, str | None]:
        """(whether `lib` was built, the limit reached if that stopped it)."""
        with self.lock:
            why = self._limit_reached()
            if why is not None:
                return False, why
            self.started += 1
        try:
            cc.build_library(lib.source, lib.name, lib.flags)
        except cc.CompileError as e:
            cc.note_failure(e)
            with self.lock:
                self.failed += 1
            return False, None
        finally:
            with self.lock:
                self.done += 1
                self._progress()
        return True, None

    def _limit_reached(self) -> str | None:
        limits, elapsed = self.limits, time.monotonic() - self.started_at
        if limits.timeout_s is not None and elapsed >= limits.timeout_s:
            return (f"not built: the build timeout of {limits.timeout_s:g} s ran out; raise "
                    f"bz.compile(build_timeout=...)")
        if limits.max_kernels is not None and self.started >= limits.max_kernels:
            return (f"not built: max_kernels={limits.max_kernels} new kernels were built; "
                    f"raise bz.compile(max_kernels=...)")
        return None

    def _progress(self) -> None:
        now = time.monotonic()
        if now - self.started_at < PROGRESS_AFTER_S or (
                self.printed_at is not None and now - self.printed_at < _PROGRESS_EVERY_S):
            return
        self.printed_at = now
        self.lines.note(f"building C kernels: {self.done} of {self.total} done "
                        f"({now - self.started_at:.0f} s, {self.workers} at a time)")

    def finish(self) -> None:
        if self.printed_at is None:
            return
        skipped = len(self.unbuilt) - self.failed
        rest = f", {skipped} left to their references" if skipped else ""
        failed = f", {self.failed} failed" if self.failed else ""
        self.lines.note(f"built {self.done - self.failed} C kernels in "
                        f"{time.monotonic() - self.started_at:.1f} s{failed}{rest}")
